package converttest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/convert"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

var mpdetour string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tu-converttest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if os.Geteuid() == 0 {
		if mpdetour, err = testenv.BuildMpdetour(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	// Detached supervisors are re-parented here; supervisorsGone reaps them.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	clientIP     = "10.0.1.1"
	convIP       = "10.0.1.2" // the converter listens here
	convServerIP = "10.0.2.1" // the converter's (and router's) side toward the server
	serverIP     = "10.0.2.2"
)

// env is client -- conv -- server. conv routes (so the client reaches the
// server directly) and runs the converter; the server has MPTCP disabled.
// The Router runs in the test process with a fake ticket source that the
// converter's Authorize checks (single use), as the relay does.
type env struct {
	client, conv, server *netnstest.NS
	convAddr             netip.AddrPort
	srv                  *convert.Server
	router               *convclient.Router
	sock                 string
	log                  string

	mu     sync.Mutex
	issued map[string]bool
	// refuse: Authorize refuses every ticket; advertise overrides the
	// converter address handed out with tickets.
	refuse    atomic.Bool
	advertise atomic.Pointer[netip.AddrPort]
	dones     chan error
}

type fakeSource struct{ e *env }

func (f fakeSource) Convert(ctx context.Context, n int) (netip.AddrPort, [][proto.TicketLen]byte, time.Duration, error) {
	f.e.mu.Lock()
	defer f.e.mu.Unlock()
	ts := make([][proto.TicketLen]byte, n)
	for i := range ts {
		rand.Read(ts[i][:])
		f.e.issued[string(ts[i][:])] = true
	}
	addr := f.e.convAddr
	if a := f.e.advertise.Load(); a != nil {
		addr = *a
	}
	return addr, ts, time.Minute, nil
}

func newEnv(t *testing.T, cfg convclient.Config) *env {
	t.Helper()
	testenv.Root(t)
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "python3")
	t.Cleanup(func() { supervisorsGone(t) })
	e := &env{
		client: netnstest.New(t, "tucc"),
		conv:   netnstest.New(t, "tucv"),
		server: netnstest.New(t, "tucs"),
		issued: map[string]bool{},
		dones:  make(chan error, 64),
	}
	netnstest.LinkNamed(t, e.client, "c0", clientIP+"/24", e.conv, "v0", convIP+"/24")
	netnstest.LinkNamed(t, e.conv, "v1", convServerIP+"/24", e.server, "s0", serverIP+"/24")
	e.client.Route(t, "0.0.0.0/0", convIP)
	e.server.Route(t, "0.0.0.0/0", convServerIP)
	for _, s := range []struct {
		ns       *netnstest.NS
		key, val string
	}{
		{e.conv, "net/ipv4/ip_forward", "1"},
		{e.client, "net/ipv4/tcp_fastopen", "3"},
		{e.conv, "net/ipv4/tcp_fastopen", "3"},
		{e.server, "net/mptcp/enabled", "0"}, // a server that does not speak MPTCP
	} {
		if err := s.ns.Sysctl(s.key, s.val); err != nil {
			t.Fatal(err)
		}
	}
	e.srv = &convert.Server{
		Authorize: func(ticket []byte, from netip.AddrPort) (string, any, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.refuse.Load() || !e.issued[string(ticket)] {
				return "", nil, errors.New("unknown ticket")
			}
			delete(e.issued, string(ticket))
			return "alice", nil, nil
		},
		Allowed: func(dst netip.AddrPort) error {
			if netip.MustParsePrefix("10.0.2.0/24").Contains(dst.Addr()) {
				return nil
			}
			return fmt.Errorf("%v not allowed", dst)
		},
		Dial: func(ctx context.Context, network, address string) (c net.Conn, err error) {
			var d net.Dialer
			err = e.conv.Do(func() error {
				c, err = d.DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
		Done: func(member string, _ any, dst netip.AddrPort, up, down int64, err error) { e.dones <- err },
		Log:  slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	var ln net.Listener
	if err := e.conv.Do(func() error {
		var tfoErr, err error
		ln, tfoErr, err = convert.Listen(context.Background(), "tcp", convIP+":0", 0)
		if tfoErr != nil {
			t.Logf("converter without TFO: %v", tfoErr)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.convAddr = ln.Addr().(*net.TCPAddr).AddrPort()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- e.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("converter Serve: %v", err)
		}
	})

	dir := t.TempDir()
	e.sock, e.log = filepath.Join(dir, "convert.sock"), filepath.Join(dir, "supervisor.log")
	cfg.Refill = 50 * time.Millisecond
	e.router = convclient.New(cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)), convclient.Converter{Name: "conv", Source: fakeSource{e}})
	l, err := convclient.Listen(e.sock)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { e.router.Run(rctx) })
	wg.Go(func() { e.router.Serve(l, convclient.Users{}) })
	t.Cleanup(func() {
		rcancel()
		l.Close()
		wg.Wait()
		if b, err := os.ReadFile(e.log); err == nil && t.Failed() {
			t.Logf("supervisor log:\n%s", b)
		}
	})
	e.waitFor(t, "tickets in stock", func(st convclient.Status) bool { return st.Converters[0].Tickets > 0 })
	return e
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// server listens on port in the server namespace and answers each line
// with "pong <the peer's address>": who connected, the client or the
// converter. It returns a stop function (after which the port refuses).
func (e *env) serve(t *testing.T, port int) (stop func()) {
	t.Helper()
	ln, err := e.server.Listen(net.ListenConfig{}, "tcp", net.JoinHostPort(serverIP, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				peer := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
				fmt.Fprintf(c, "pong %s\n", peer)
			})
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { ln.Close(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// The unmodified program: Python's socket module, connect, one line each
// way. mode "timeout" uses a socket timeout (non-blocking connect inside
// Python), "blocking" a plain blocking socket.
const probe = `
import json, os, socket, sys
out = {}
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sys.argv[3] == "timeout":
        s.settimeout(10)
    s.connect((sys.argv[1], int(sys.argv[2])))
    out["proto"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)
    if sys.argv[3] == "exit":  # a program that connects and is gone at once
        print(json.dumps(out), flush=True)
        os._exit(0)
    s.sendall(b"ping\n")
    out["reply"] = s.makefile().readline().strip()
except OSError as e:
    out["errno"] = e.errno
print(json.dumps(out))
`

type result struct {
	Proto int    `json:"proto"`
	Reply string `json:"reply"`
	Errno int    `json:"errno"`
}

// app runs the probe under "mpdetour run --convert" in the client namespace.
func (e *env) app(t *testing.T, port int, mode string) result {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", e.client.Name, mpdetour, "run", "--convert", e.sock, "--log", e.log, "--",
		"python3", "-c", probe, serverIP, strconv.Itoa(port), mode)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, stderr.String())
	}
	var r result
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		t.Fatalf("probe output %q: %v (stderr %s)", out, err, stderr.String())
	}
	return r
}

func (e *env) waitFor(t *testing.T, what string, cond func(convclient.Status) bool) convclient.Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.router.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s; router status %+v", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const (
	direct    = "pong " + clientIP     // the server saw the client
	converted = "pong " + convServerIP // the server saw the converter
)

// learn makes a first connection to port (direct) and waits until the
// router knows the server does not speak MPTCP.
func (e *env) learn(t *testing.T, port int) {
	t.Helper()
	before := e.router.Status().Counters.LearnedNoMPTCP
	r := e.app(t, port, "timeout")
	if r.Reply != direct || r.Proto != unix.IPPROTO_MPTCP {
		t.Fatalf("first connection to an unknown server: %+v, want %q over an MPTCP socket (direct, falling back)", r, direct)
	}
	e.waitFor(t, "learned that the server does not speak MPTCP", func(st convclient.Status) bool {
		return st.Counters.LearnedNoMPTCP > before && len(st.NoMPTCP) > 0
	})
}

// A program that connects and exits at once (before the supervisor's
// first look at the socket) still teaches: the supervisor's duplicate
// keeps the socket, and it looks once more when the program is gone.
func TestLearnFromProgramThatExitsAtOnce(t *testing.T) {
	e := newEnv(t, convclient.Config{})
	e.serve(t, 7000)
	before := e.router.Status().Counters.LearnedNoMPTCP
	if r := e.app(t, 7000, "exit"); r.Proto != unix.IPPROTO_MPTCP || r.Errno != 0 {
		t.Fatalf("connect and exit: %+v", r)
	}
	e.waitFor(t, "learned from a program that exited at once", func(st convclient.Status) bool {
		return st.Counters.LearnedNoMPTCP > before && len(st.NoMPTCP) > 0
	})
}

func TestLearnThenConvert(t *testing.T) {
	e := newEnv(t, convclient.Config{})
	e.serve(t, 7000)
	e.learn(t, 7000)
	st := e.router.Status()
	if st.Counters.Direct["unknown"] != 1 || st.Counters.Converted != 0 {
		t.Fatalf("after the first connection: %+v", st.Counters)
	}
	for i, mode := range []string{"timeout", "blocking", "timeout"} {
		r := e.app(t, 7000, mode)
		if r.Reply != converted || r.Proto != unix.IPPROTO_MPTCP {
			t.Fatalf("connection %d (%s): %+v, want %q on the program's MPTCP socket", i+2, mode, r, converted)
		}
		select {
		case err := <-e.dones:
			if err != nil {
				t.Fatalf("converter: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the converter reported no conversion")
		}
	}
	st = e.waitFor(t, "three conversions reported", func(st convclient.Status) bool { return st.Counters.Converted == 3 })
	if len(st.Recent) != 3 || !strings.HasPrefix(st.Recent[0].Local, clientIP+":") || st.Recent[0].Destination != serverIP+":7000" {
		t.Fatalf("recent conversions: %+v", st.Recent)
	}
	// The program's socket went to the converter as MPTCP, and the later
	// conversions carried the message in the SYN (TFO cookie cached by the
	// first).
	out, _ := exec.Command("ip", "netns", "exec", e.client.Name, "nstat", "-az", "TcpExtTCPFastOpenActive").CombinedOutput()
	t.Logf("client namespace: %s", strings.TrimSpace(string(out)))
	if n := nstat(t, e.client, "TcpExtTCPFastOpenActive"); n < 2 {
		t.Errorf("TcpExtTCPFastOpenActive = %d in the client namespace, want >= 2 (0-RTT conversions)", n)
	}
	if n := nstat(t, e.conv, "MPTcpExtMPCapableSYNRX"); n < 3 {
		t.Errorf("MPTcpExtMPCapableSYNRX = %d at the converter, want >= 3", n)
	}
}

func TestConverterRefusesGoesDirect(t *testing.T) {
	e := newEnv(t, convclient.Config{Hold: time.Minute})
	e.serve(t, 7000)
	e.learn(t, 7000)
	e.refuse.Store(true)
	// The converter refuses the ticket: this connection still works,
	// direct, on a fresh socket in place of the used one. The stock is
	// dropped and refetched (a restarted relay forgot its tickets).
	r := e.app(t, 7000, "timeout")
	if r.Reply != direct || r.Proto != unix.IPPROTO_MPTCP {
		t.Fatalf("refused conversion: %+v, want %q (direct fallback)", r, direct)
	}
	st := e.waitFor(t, "converter failure reported", func(st convclient.Status) bool { return st.Counters.ConverterFailed == 1 })
	if !st.Converters[0].FailedUntil.IsZero() || st.Converters[0].Failures != 1 {
		t.Fatalf("first ticket refusal: %+v, want fresh tickets and no hold", st.Converters[0])
	}
	e.waitFor(t, "fresh tickets", func(st convclient.Status) bool { return st.Converters[0].Tickets > 0 })
	// Fresh tickets refused too: direct again, and now the converter is held.
	if r := e.app(t, 7000, "blocking"); r.Reply != direct {
		t.Fatalf("second refused conversion: %+v", r)
	}
	st = e.waitFor(t, "converter held", func(st convclient.Status) bool { return !st.Converters[0].FailedUntil.IsZero() })
	used := st.Converters[0].Used
	// Held: the next connection goes direct without trying it.
	r = e.app(t, 7000, "blocking")
	if r.Reply != direct {
		t.Fatalf("connection while the converter is held: %+v", r)
	}
	st = e.router.Status()
	if st.Converters[0].Used != used || st.Counters.Direct["no-converter"] != 1 {
		t.Fatalf("held converter was used: %+v %+v", st.Converters[0], st.Counters)
	}
}

func TestConverterUnreachableGoesDirect(t *testing.T) {
	e := newEnv(t, convclient.Config{})
	e.serve(t, 7000)
	e.learn(t, 7000)
	// Tickets now name a converter port nobody listens on: the SYN is
	// answered with a reset, the connection goes direct at once.
	dead := netip.AddrPortFrom(e.convAddr.Addr(), 9)
	e.advertise.Store(&dead)
	// Use up the stock so that the next tickets carry the new address.
	other := netip.MustParseAddrPort("10.0.2.99:1")
	e.router.Learn(convclient.Root, other, false)
	for e.router.Route(convclient.Root, other).Convert {
	}
	e.waitFor(t, "tickets for the dead address", func(st convclient.Status) bool {
		return st.Converters[0].Address == dead.String() && st.Converters[0].Tickets > 0
	})
	start := time.Now()
	r := e.app(t, 7000, "blocking")
	if r.Reply != direct {
		t.Fatalf("unreachable converter: %+v, want %q", r, direct)
	}
	t.Logf("program with an unreachable converter took %v", time.Since(start))
	e.waitFor(t, "converter failure reported", func(st convclient.Status) bool { return st.Counters.ConverterFailed == 1 })
}

func TestDestinationRefusedReachesProgram(t *testing.T) {
	e := newEnv(t, convclient.Config{})
	stop := e.serve(t, 7000)
	e.learn(t, 7000)
	stop() // the server port now refuses
	r := e.app(t, 7000, "blocking")
	if r.Errno != int(unix.ECONNREFUSED) {
		t.Fatalf("converted connection to a closed port: %+v, want errno ECONNREFUSED", r)
	}
	st := e.waitFor(t, "destination error reported", func(st convclient.Status) bool { return st.Counters.DestinationError == 1 })
	if st.Counters.ConverterFailed != 0 || !st.Converters[0].FailedUntil.IsZero() {
		t.Fatalf("a destination's refusal held the converter: %+v", st)
	}
	r = e.app(t, 7000, "timeout")
	if r.Errno != int(unix.ECONNREFUSED) {
		t.Fatalf("second try: %+v", r)
	}
}

func TestLearnedAnswerExpires(t *testing.T) {
	e := newEnv(t, convclient.Config{TTL: 2 * time.Second})
	e.serve(t, 7000)
	e.learn(t, 7000)
	if r := e.app(t, 7000, "timeout"); r.Reply != converted {
		t.Fatalf("within the lifetime: %+v, want converted", r)
	}
	time.Sleep(2100 * time.Millisecond)
	// Expired: unknown again, so direct (and learned anew).
	if r := e.app(t, 7000, "timeout"); r.Reply != direct {
		t.Fatalf("after the lifetime: %+v, want direct", r)
	}
	e.waitFor(t, "learned again", func(st convclient.Status) bool {
		return st.Counters.Direct["unknown"] == 2 && st.Counters.LearnedNoMPTCP == 2
	})
	if r := e.app(t, 7000, "timeout"); r.Reply != converted {
		t.Fatalf("after learning again: %+v, want converted", r)
	}
}

// nstat reads one counter of /proc/net/netstat or snmp in ns.
func nstat(t *testing.T, ns *netnstest.NS, name string) int64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns.Name, "nstat", "-az", name).Output()
	if err != nil {
		t.Fatalf("nstat: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == name {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// supervisorsGone waits for every supervisor re-parented to this process
// to exit by itself, and reaps it.
func supervisorsGone(t *testing.T) {
	deadline := time.Now().Add(20 * time.Second)
	me := strconv.Itoa(os.Getpid())
	for {
		alive := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			i := bytes.LastIndexByte(st, ')')
			f := strings.Fields(string(st[i+1:]))
			if i < 0 || len(f) < 2 || f[1] != me {
				continue
			}
			if f[0] == "Z" {
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WNOHANG, nil)
				continue
			}
			alive++
		}
		if alive == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d supervisor(s) still running 20 s after their programs ended", alive)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
