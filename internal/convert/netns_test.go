package convert

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// line is client -- converter -- server, three namespaces. The converter
// does not forward: the client can only reach the server through it.
type line struct {
	client, conv, server *netnstest.NS
	convAddr             netip.AddrPort // the converter's listener
	srv                  *Server
	dones                chan doneCall
	srvStopped           chan error
}

type doneCall struct {
	member   string
	dst      netip.AddrPort
	up, down int64
	err      error
}

const (
	lnClient     = "10.0.1.1"
	lnConv       = "10.0.1.2"
	lnConvServer = "10.0.2.1"
	lnServer     = "10.0.2.2"
)

var goodTicket = []byte("ticket-of-alice-0123456789")

// newLine builds the namespaces and starts a converter with srv's settings
// filled in (Authorize accepts goodTicket as "alice", Allowed accepts
// 10.0.2.0/24, Dial dials from the converter's namespace, Done records).
// Everything goes in t.Cleanup.
func newLine(t *testing.T, tune func(*Server)) *line {
	t.Helper()
	testenv.MPTCP(t)
	l := &line{
		client: netnstest.New(t, "tcvc"),
		conv:   netnstest.New(t, "tcvv"),
		server: netnstest.New(t, "tcvs"),
		dones:  make(chan doneCall, 64),
	}
	netnstest.LinkNamed(t, l.client, "c0", lnClient+"/24", l.conv, "v0", lnConv+"/24")
	netnstest.LinkNamed(t, l.conv, "v1", lnConvServer+"/24", l.server, "s0", lnServer+"/24")
	// TFO: client bit 1 (default), server bit 2 on the converter.
	for _, ns := range []*netnstest.NS{l.client, l.conv} {
		if err := ns.Sysctl("net/ipv4/tcp_fastopen", "3"); err != nil {
			t.Fatal(err)
		}
	}
	l.srv = &Server{
		Authorize: func(ticket []byte, from netip.AddrPort) (string, any, error) {
			if bytes.Equal(ticket, goodTicket) {
				return "alice", nil, nil
			}
			return "", nil, errors.New("unknown ticket")
		},
		Allowed: func(dst netip.AddrPort) error {
			if netip.MustParsePrefix("10.0.2.0/24").Contains(dst.Addr()) {
				return nil
			}
			return fmt.Errorf("%v is not in the test's allow list", dst)
		},
		Dial: func(ctx context.Context, network, address string) (c net.Conn, err error) {
			var d net.Dialer
			err = l.conv.Do(func() error {
				c, err = d.DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
		Done: func(member string, _ any, dst netip.AddrPort, up, down int64, err error) {
			l.dones <- doneCall{member, dst, up, down, err}
		},
		Log:           slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		HeaderTimeout: 2 * time.Second,
		DialTimeout:   2 * time.Second,
		LingerTimeout: 500 * time.Millisecond,
	}
	if tune != nil {
		tune(l.srv)
	}
	var ln net.Listener
	err := l.conv.Do(func() error {
		var tfoErr, err error
		ln, tfoErr, err = Listen(context.Background(), "tcp", lnConv+":0", 0)
		if tfoErr != nil {
			t.Logf("listener without TFO: %v", tfoErr)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	l.convAddr = ln.Addr().(*net.TCPAddr).AddrPort()
	ctx, cancel := context.WithCancel(context.Background())
	l.srvStopped = make(chan error, 1)
	go func() { l.srvStopped <- l.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-l.srvStopped:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return 10 s after its context ended")
		}
	})
	return l
}

// testWriter sends the converter's log to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// destServer listens in the server namespace on port and counts the
// connections it accepted; handle runs for each. Closed in t.Cleanup.
type destServer struct {
	addr     netip.AddrPort
	accepted atomic.Int64
}

func (l *line) destination(t *testing.T, handle func(*net.TCPConn)) *destServer {
	t.Helper()
	return l.destinationOn(t, 0, handle)
}

func (l *line) destinationOn(t *testing.T, port uint16, handle func(*net.TCPConn)) *destServer {
	t.Helper()
	ln, err := l.server.Listen(net.ListenConfig{}, "tcp", net.JoinHostPort(lnServer, strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	d := &destServer{addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.accepted.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if handle != nil {
					handle(c.(*net.TCPConn))
				}
			}()
		}
	}()
	return d
}

// dial runs Dial from the client namespace.
func (l *line) dial(t *testing.T, dst netip.AddrPort, ticket []byte) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := l.client.Do(func() (err error) {
		c, err = Dial(t.Context(), l.convAddr, dst, ticket, DialOptions{Timeout: 5 * time.Second})
		return err
	})
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// rawDial opens a plain TCP connection to the converter from the client
// namespace (for misbehaving clients).
func (l *line) rawDial(t *testing.T) *net.TCPConn {
	t.Helper()
	c, err := l.client.Dial(&net.Dialer{}, "tcp", l.convAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

func (l *line) done(t *testing.T) doneCall {
	t.Helper()
	select {
	case d := <-l.dones:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the converter reported no ended conversion within 10 s")
	}
	return doneCall{}
}

// counters reads /proc/net/netstat and /proc/net/snmp of ns (the thread's
// namespace: /proc/self/net would be the main thread's).
func counters(t *testing.T, ns *netnstest.NS) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	err := ns.Do(func() error {
		for _, f := range []string{"/proc/thread-self/net/netstat", "/proc/thread-self/net/snmp"} {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			for i := 0; i+1 < len(lines); i += 2 {
				names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
				if len(names) != len(values) || len(names) == 0 {
					continue
				}
				prefix := strings.TrimSuffix(names[0], ":")
				for j := 1; j < len(names); j++ {
					v, _ := strconv.ParseInt(values[j], 10, 64)
					out[prefix+names[j]] = v
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEndToEnd(t *testing.T) {
	l := newLine(t, nil)
	up := bytes.Repeat([]byte("client to server "), 200_000) // 3.4 MB
	down := bytes.Repeat([]byte("server to client "), 300_000)
	gotUp := make(chan [32]byte, 1)
	dst := l.destination(t, func(c *net.TCPConn) {
		// Read to EOF (the client's half-close), then answer and close.
		h := sha256.New()
		if _, err := io.Copy(h, c); err != nil {
			t.Errorf("server read: %v", err)
		}
		gotUp <- [32]byte(h.Sum(nil))
		if _, err := c.Write(down); err != nil {
			t.Errorf("server write: %v", err)
		}
	})
	c, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("Dial returned %T, want *net.TCPConn (splice)", c)
	}
	mp, err := tc.MultipathTCP()
	if err != nil || !mp {
		t.Fatalf("client connection to the converter is not MPTCP (MultipathTCP() = %v, %v)", mp, err)
	}
	if out := l.conv.Run("ss", "-Mnt", "state", "established"); !strings.Contains(out, lnClient) {
		t.Errorf("ss -M in the converter shows no MPTCP connection from %s:\n%s", lnClient, out)
	}
	if _, err := tc.Write(up); err != nil {
		t.Fatal(err)
	}
	if err := tc.CloseWrite(); err != nil { // half-close: the server must see EOF and still answer
		t.Fatal(err)
	}
	select {
	case sum := <-gotUp:
		if sum != sha256.Sum256(up) {
			t.Fatal("server received different bytes")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server did not see the client's half-close")
	}
	tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(tc)
	if err != nil {
		t.Fatalf("client read: %v", err)
	}
	if !bytes.Equal(got, down) {
		t.Fatalf("client received %d bytes, want %d identical", len(got), len(down))
	}
	d := l.done(t)
	if d.member != "alice" || d.dst != dst.addr || d.up != int64(len(up)) || d.down != int64(len(down)) || d.err != nil {
		t.Fatalf("Done(%q, %v, %d, %d, %v); want alice, %v, %d, %d, nil", d.member, d.dst, d.up, d.down, d.err, dst.addr, len(up), len(down))
	}
}

// TestZeroRTTData: bytes written right after Dial returns arrive; and
// bytes the client sends before the converter's reply (behind the Convert
// message) are forwarded once the ticket is valid.
func TestServerSpeaksFirst(t *testing.T) {
	l := newLine(t, nil)
	dst := l.destination(t, func(c *net.TCPConn) {
		c.Write([]byte("220 hello\r\n"))
		r := bufio.NewReader(c)
		line, _ := r.ReadString('\n')
		c.Write([]byte("echo " + line))
	})
	c, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if s, err := r.ReadString('\n'); err != nil || s != "220 hello\r\n" {
		t.Fatalf("banner %q, %v", s, err)
	}
	c.Write([]byte("ping\n"))
	if s, err := r.ReadString('\n'); err != nil || s != "echo ping\n" {
		t.Fatalf("echo %q, %v", s, err)
	}
}

func TestServerResetReachesClient(t *testing.T) {
	l := newLine(t, nil)
	dst := l.destination(t, func(c *net.TCPConn) {
		io.ReadFull(c, make([]byte, 4))
		c.SetLinger(0)
		c.Close()
	})
	c, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("boom"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 10))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after the server's reset: %v, want ECONNRESET", err)
	}
	if d := l.done(t); d.err == nil {
		t.Fatalf("Done reported no error after a reset: %+v", d)
	}
}

func TestClientResetReachesServer(t *testing.T) {
	l := newLine(t, nil)
	serverErr := make(chan error, 1)
	dst := l.destination(t, func(c *net.TCPConn) {
		io.ReadFull(c, make([]byte, 4))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 10))
		serverErr <- err
	})
	c, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("boom"))
	time.Sleep(100 * time.Millisecond)
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
	if err := <-serverErr; !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server read after the client's reset: %v, want ECONNRESET", err)
	}
}

func TestDestinationRefuses(t *testing.T) {
	l := newLine(t, nil)
	// A port nobody listens on in the server namespace.
	dst := l.destination(t, nil)
	closed := netip.AddrPortFrom(dst.addr.Addr(), dst.addr.Port()+1)
	_, err := l.dial(t, closed, goodTicket)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Dial to a closed port: %v, want ECONNREFUSED", err)
	}
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeConnectionReset {
		t.Fatalf("Dial error %v is not the converter's Connection Reset", err)
	}
	if d := l.done(t); !errors.Is(d.err, syscall.ECONNREFUSED) || d.member != "alice" {
		t.Fatalf("Done: %+v", d)
	}
}

func TestDestinationUnreachable(t *testing.T) {
	l := newLine(t, nil)
	l.conv.Run("ip", "route", "add", "unreachable", "10.0.2.128/25")
	_, err := l.dial(t, netip.MustParseAddrPort("10.0.2.200:80"), goodTicket)
	if !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("Dial to an unreachable destination: %v, want EHOSTUNREACH", err)
	}
}

func TestDestinationTimeout(t *testing.T) {
	testenv.Tools(t, "nft")
	l := newLine(t, func(s *Server) { s.DialTimeout = 500 * time.Millisecond })
	dst := l.destination(t, nil)
	l.server.Run("nft", "add table inet t; add chain inet t in { type filter hook input priority 0; }; add rule inet t in tcp dport "+
		strconv.Itoa(int(dst.addr.Port()))+" drop")
	start := time.Now()
	_, err := l.dial(t, dst.addr, goodTicket)
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("Dial to a silent destination: %v, want ETIMEDOUT", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("error %v is not a net.Error with Timeout()", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("took %v with a 500 ms dial timeout", el)
	}
}

// TestBadTicket: no ticket, a wrong one: EACCES, and the destination never
// sees a connection (nor does the converter open one: ActiveOpens).
func TestBadTicket(t *testing.T) {
	l := newLine(t, nil)
	dst := l.destination(t, nil)
	before := counters(t, l.conv)["TcpActiveOpens"]
	_, err := l.dial(t, dst.addr, []byte("ticket-of-mallory-012345"))
	if !errors.Is(err, syscall.EACCES) {
		t.Fatalf("Dial with a bad ticket: %v, want EACCES", err)
	}
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeNotAuthorized || first(re.Value) != NotAuthorizedTicket {
		t.Fatalf("Dial error %v: want Not Authorized, value %d", err, NotAuthorizedTicket)
	}
	if d := l.done(t); d.member != "" || d.err == nil {
		t.Fatalf("Done: %+v", d)
	}
	// No ticket at all, with payload behind the message.
	c := l.rawDial(t)
	msg := mustMarshal(t, &Message{Connect: &Connect{Dst: dst.addr}})
	c.Write(append(msg, "GET / HTTP/1.0\r\n\r\n"...))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, err := ReadMessage(c)
	if err != nil || reply.Error == nil || reply.Error.Code != CodeNotAuthorized {
		t.Fatalf("reply to a message without ticket: %+v, %v", reply, err)
	}
	l.done(t)
	if n := dst.accepted.Load(); n != 0 {
		t.Fatalf("destination accepted %d connections from unauthenticated clients", n)
	}
	if after := counters(t, l.conv)["TcpActiveOpens"]; after != before {
		t.Fatalf("the converter opened %d connections for unauthenticated clients", after-before)
	}
}

// TestPolicyDenied uses the relay's destination.Policy: 10.0.2.0/24 is
// allowed (private, but the test's server network), port 25 is denied.
func TestPolicyDenied(t *testing.T) {
	pol := &destination.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}, DenyPorts: map[uint16]bool{25: true}}
	l := newLine(t, func(s *Server) { s.Allowed = pol.Check })
	smtp := l.destinationOn(t, 25, nil)
	_, err := l.dial(t, smtp.addr, goodTicket)
	var re *RemoteError
	if !errors.Is(err, syscall.EACCES) || !errors.As(err, &re) || first(re.Value) != NotAuthorizedDestination {
		t.Fatalf("Dial to a denied destination: %v, want EACCES (destination policy)", err)
	}
	if d := l.done(t); d.member != "alice" || d.err == nil || !strings.Contains(d.err.Error(), "port 25") {
		t.Fatalf("Done: %+v", d)
	}
	if n := smtp.accepted.Load(); n != 0 {
		t.Fatalf("destination accepted %d connections although denied", n)
	}
	// The policy's private ranges: 10.0.1.1 (the client's side) is refused.
	if _, err := l.dial(t, netip.MustParseAddrPort(lnClient+":80"), goodTicket); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("Dial to a private address outside the allow list: %v, want EACCES", err)
	}
}

// TestProtocolAnswers: an Info query, a TCP option the converter does not
// offer, an Error TLV from a client, no Connect TLV.
func TestProtocolAnswers(t *testing.T) {
	l := newLine(t, nil)
	dst := l.destination(t, nil)
	ask := func(m *Message) *Message {
		t.Helper()
		c := l.rawDial(t)
		c.Write(mustMarshal(t, m))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		r, err := ReadMessage(c)
		if err != nil {
			t.Fatalf("no answer to %+v: %v", m, err)
		}
		l.done(t)
		return r
	}
	if r := ask(&Message{Info: true, Ticket: goodTicket}); r.Error != nil || !bytes.Equal(r.SupportedTCPExtensions, []byte{MPTCPKind}) {
		t.Errorf("Info: answer %+v, want Supported TCP Extensions [30]", r)
	}
	if r := ask(&Message{Connect: &Connect{Dst: dst.addr, TCPOptions: []byte{1, 1, 4, 2}}, Ticket: goodTicket}); r.Error == nil ||
		r.Error.Code != CodeUnsupportedTCPOption || first(r.Error.Value) != 4 {
		t.Errorf("SACK-permitted asked for: answer %+v, want Unsupported TCP Option 4", r)
	}
	if r := ask(&Message{Connect: &Connect{Dst: dst.addr}, Error: &ErrorTLV{Code: CodeNetworkFailure}, Ticket: goodTicket}); r.Error == nil ||
		r.Error.Code != CodeUnsupportedMessage || first(r.Error.Value) != byte(TypeError) {
		t.Errorf("client Error TLV: answer %+v, want Unsupported Message 30", r)
	}
	if r := ask(&Message{Ticket: goodTicket}); r.Error == nil || r.Error.Code != CodeMalformedMessage {
		t.Errorf("no Connect: answer %+v, want Malformed Message", r)
	}
	if r := ask(&Message{Connect: &Connect{Dst: dst.addr}, Cookie: []byte{1, 2, 3, 4}}); r.Error == nil || r.Error.Code != CodeNotAuthorized {
		t.Errorf("cookie but no ticket: answer %+v, want Not Authorized", r)
	}
	if n := dst.accepted.Load(); n != 0 {
		t.Errorf("destination accepted %d connections", n)
	}
}

// TestMisbehavingClients: silence, a slow drip, garbage, an early close:
// each ends within the header timeout with the right answer, and once Serve
// has returned no goroutine or descriptor is left over.
func TestMisbehavingClients(t *testing.T) {
	fdsBefore, goroutinesBefore := countFDs(t), runtime.NumGoroutine()
	// Registered first, so it runs last: after the clients closed, Serve
	// returned and the namespaces are gone.
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for (countFDs(t) > fdsBefore || runtime.NumGoroutine() > goroutinesBefore) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if n := countFDs(t); n > fdsBefore {
			t.Errorf("%d file descriptors left over (before %d, after %d)", n-fdsBefore, fdsBefore, n)
		}
		if n := runtime.NumGoroutine(); n > goroutinesBefore {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines left over:\n%s", n-goroutinesBefore, buf[:runtime.Stack(buf, true)])
		}
	})
	l := newLine(t, func(s *Server) { s.HeaderTimeout = 300 * time.Millisecond })
	dst := l.destination(t, nil)

	silent := l.rawDial(t)
	drip := l.rawDial(t)
	garbage := l.rawDial(t)
	early := l.rawDial(t)
	version := l.rawDial(t)
	go func() {
		msg := mustMarshal(t, &Message{Connect: &Connect{Dst: dst.addr}, Ticket: goodTicket})
		for _, b := range msg {
			if _, err := drip.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	garbage.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	early.Write([]byte{1, 9, 0x22, 0x63, 10})
	early.CloseWrite()
	version.Write([]byte{2, 1, 0x22, 0x63})

	for name, c := range map[string]*net.TCPConn{"silent": silent, "drip": drip, "early": early} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		n, err := c.Read(make([]byte, 64))
		if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s client: read %d bytes, %v; want the converter to close without an answer", name, n, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("%s client: closed after %v, header timeout is 300 ms", name, el)
		}
	}
	garbage.SetReadDeadline(time.Now().Add(5 * time.Second))
	if m, err := ReadMessage(garbage); err != nil || m.Error == nil || m.Error.Code != CodeUnsupportedVersion {
		t.Errorf("HTTP request: answer %+v, %v; want Unsupported Version", m, err)
	}
	version.SetReadDeadline(time.Now().Add(5 * time.Second))
	if m, err := ReadMessage(version); err != nil || m.Error == nil || m.Error.Code != CodeUnsupportedVersion || first(m.Error.Value) != Version {
		t.Errorf("version 2: answer %+v, %v; want Unsupported Version, value 1", m, err)
	}
	if n := dst.accepted.Load(); n != 0 {
		t.Errorf("destination accepted %d connections", n)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestFastOpen: the second connection carries the Convert message in the
// SYN (the first fetched the cookie): the TFO counters in both namespaces
// move.
func TestFastOpen(t *testing.T) {
	l := newLine(t, nil)
	dst := l.destination(t, func(c *net.TCPConn) { io.Copy(c, c) })
	cb, vb := counters(t, l.client), counters(t, l.conv)
	for i := range 3 {
		c, err := l.dial(t, dst.addr, goodTicket)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if mp, err := c.(*net.TCPConn).MultipathTCP(); !mp || err != nil {
			t.Fatalf("connection %d is not MPTCP: %v, %v", i, mp, err)
		}
		c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatalf("connection %d: echo: %v", i, err)
		}
		c.Close()
	}
	ca, va := counters(t, l.client), counters(t, l.conv)
	delta := func(m0, m1 map[string]int64, k string) int64 { return m1[k] - m0[k] }
	t.Logf("client: TCPFastOpenActive +%d, TCPFastOpenActiveFail +%d, TCPFastOpenCookieReqd(conv) +%d; converter: TCPFastOpenPassive +%d, TCPFastOpenPassiveFail +%d",
		delta(cb, ca, "TcpExtTCPFastOpenActive"), delta(cb, ca, "TcpExtTCPFastOpenActiveFail"),
		delta(vb, va, "TcpExtTCPFastOpenCookieReqd"), delta(vb, va, "TcpExtTCPFastOpenPassive"), delta(vb, va, "TcpExtTCPFastOpenPassiveFail"))
	if delta(vb, va, "TcpExtTCPFastOpenCookieReqd") < 1 {
		t.Errorf("the first connection did not ask the converter for a TFO cookie")
	}
	if delta(cb, ca, "TcpExtTCPFastOpenActive") < 2 || delta(vb, va, "TcpExtTCPFastOpenPassive") < 2 {
		t.Errorf("connections 2 and 3 did not use TCP Fast Open")
	}
}

// TestMaxConns: with one slot taken, the next client is told Resource
// Exceeded at once (EAGAIN, no connection to the destination); once the
// slot is free, clients get through again.
func TestMaxConns(t *testing.T) {
	l := newLine(t, func(s *Server) { s.MaxConns = 1 })
	dst := l.destination(t, func(c *net.TCPConn) { io.Copy(c, c) })
	c1, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.dial(t, dst.addr, goodTicket)
	var re *RemoteError
	if !errors.Is(err, syscall.EAGAIN) || !errors.As(err, &re) || re.Code != CodeResourceExceeded {
		t.Fatalf("second Dial while the only slot is taken: %v, want Resource Exceeded (EAGAIN)", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("Resource Exceeded took %v", el)
	}
	if d := l.done(t); d.err == nil || d.member != "" {
		t.Errorf("Done for the overflow: %+v", d)
	}
	if n := dst.accepted.Load(); n != 1 {
		t.Errorf("destination accepted %d connections, want 1", n)
	}
	c1.Close()
	l.done(t) // the first conversion ends; its slot frees right after Done
	for deadline := time.Now().Add(2 * time.Second); ; {
		_, err := l.dial(t, dst.addr, goodTicket)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EAGAIN) || time.Now().After(deadline) {
			t.Fatalf("Dial after the slot was freed: %v", err)
		}
		l.done(t)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClientNeverReads: the destination sends without end, the client
// never reads; with StallTimeout the converter gives up on the zero window
// and resets both sides instead of holding the conversion forever.
func TestClientNeverReads(t *testing.T) {
	l := newLine(t, func(s *Server) { s.StallTimeout = time.Second })
	serverErr := make(chan error, 1)
	dst := l.destination(t, func(c *net.TCPConn) {
		buf := make([]byte, 1<<16)
		c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for {
			if _, err := c.Write(buf); err != nil {
				serverErr <- err
				return
			}
		}
	})
	if _, err := l.dial(t, dst.addr, goodTicket); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d := l.done(t)
	t.Logf("conversion ended after %v: down %d bytes, %v", time.Since(start), d.down, d.err)
	if d.err == nil {
		t.Fatalf("Done without error for a client that never reads")
	}
	if err := <-serverErr; !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("destination write after the stall: %v, want a reset", err)
	}
}

// TestIdleIsNotStall: StallTimeout does not end an idle conversion, nor one
// whose client reads slowly but steadily.
func TestIdleIsNotStall(t *testing.T) {
	l := newLine(t, func(s *Server) { s.StallTimeout = 300 * time.Millisecond })
	dst := l.destination(t, func(c *net.TCPConn) { io.Copy(c, c) })
	c, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // idle for three stall timeouts
	for i := range 10 {     // then a slow reader: 100 ms between small exchanges
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case d := <-l.dones:
		t.Fatalf("conversion ended: %+v", d)
	default:
	}
}

// TestSpliceUsed: while a conversion moves data, the process holds new
// pipes: the copy splices through a pipe; a plain copy would create none.
func TestSpliceUsed(t *testing.T) {
	l := newLine(t, nil)
	release := make(chan struct{})
	dst := l.destination(t, func(c *net.TCPConn) {
		<-release // let the pipeline fill and the splice loop block
		io.Copy(io.Discard, c)
	})
	// The Server's pool starts empty; Go's own splice pipes (sync.Pool,
	// closed by a finalizer) are emptied so they do not blur the count.
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	before := countPipes(t)
	c, err := l.dial(t, dst.addr, goodTicket)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Write(make([]byte, 16<<20))
		wrote <- err
	}()
	during := before
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && during <= before; time.Sleep(20 * time.Millisecond) {
		during = countPipes(t)
	}
	close(release)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if during <= before {
		t.Fatalf("no splice pipe appeared during the transfer (%d pipe fds before, %d during)", before, during)
	}
	t.Logf("pipe fds: %d before, %d during the transfer", before, during)
}

func countPipes(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range es {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "pipe:") {
			n++
		}
	}
	return n
}

// TestIdleConversionsHoldNoPipes: an idle conversion holds its two sockets
// and no splice pipe (the copy waits for data without one), so many idle
// conversions cost two descriptors each; after data moved, only the
// Server's bounded pool of spare pipes remains.
func TestIdleConversionsHoldNoPipes(t *testing.T) {
	l := newLine(t, nil)
	// An echo with a buffer: io.Copy(c, c) would splice (with pipes of
	// its own, in this process).
	dst := l.destination(t, func(c *net.TCPConn) {
		b := make([]byte, 32<<10)
		for {
			n, err := c.Read(b)
			if n > 0 {
				if _, err := c.Write(b[:n]); err != nil {
					return
				}
			}
			if err != nil {
				c.CloseWrite()
				return
			}
		}
	})
	// More conversions than l.dones holds: drain it (until the test
	// binary ends; the cleanups that end the conversions run after this
	// test's own).
	go func() {
		for range l.dones {
		}
	}()
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	before := countPipes(t)
	const n = 100 // more than spareSplicePipes
	var conns []net.Conn
	for i := range n {
		c, err := l.dial(t, dst.addr, goodTicket)
		if err != nil {
			t.Fatalf("conversion %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	time.Sleep(100 * time.Millisecond)
	if p := countPipes(t) - before; p != 0 {
		t.Errorf("%d pipe fds for %d idle conversions that never moved data, want 0", p, n)
	}
	// Data through every one of them at once, then idle again.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range conns {
		wg.Go(func() {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			b := make([]byte, 64<<10)
			if _, err := c.Write(b); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(c, b); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("echo: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if p := countPipes(t) - before; p > 2*spareSplicePipes {
		t.Errorf("%d pipe fds for %d idle conversions after data moved, want at most the pool's %d", p, n, 2*spareSplicePipes)
	} else {
		t.Logf("pipe fds after the echo, conversions idle: %d (pool bound %d)", p, 2*spareSplicePipes)
	}
}
