package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// detourLab is the lab's "detours" topology (client, server, K relays)
// with static NAT detours installed by the test in each relay: relay:4000
// is DNATed to the server's port 5201 and masqueraded.
type detourLab struct {
	l      *lab.Lab
	server netip.AddrPort
	relays []netip.AddrPort // relay address:4000 per detour node
}

var labSeq int

func upDetourLab(t testing.TB, k int) *detourLab {
	testenv.MPTCP(t)
	testenv.Tools(t, "nft", "ip")
	labSeq++
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := labtest.UpDetours(ctx, t, fmt.Sprintf("ta%d-%d", os.Getpid(), labSeq), k)
	dl := &detourLab{l: l, server: netip.AddrPortFrom(l.Addr("server"), 5201)}
	for i := 1; i <= k; i++ {
		node := fmt.Sprintf("detour%d", i)
		dl.nft(t, node, fmt.Sprintf(`table ip tanat {
	chain pre { type nat hook prerouting priority -100; tcp dport 4000 dnat to %s; }
	chain post { type nat hook postrouting priority 100; ip daddr %s tcp dport %d masquerade; }
}`, dl.server, dl.server.Addr(), dl.server.Port()))
		dl.relays = append(dl.relays, netip.AddrPortFrom(l.Addr(node), 4000))
	}
	dl.run(t, "server", "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8")
	return dl
}

func (dl *detourLab) run(t testing.TB, node string, argv ...string) string {
	t.Helper()
	out, err := dl.l.Command(t.Context(), node, argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %s: %v: %s", node, strings.Join(argv, " "), err, out)
	}
	return string(out)
}

func (dl *detourLab) nft(t testing.TB, node, rules string) {
	t.Helper()
	cmd := dl.l.Command(t.Context(), node, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: nft: %v: %s", node, err, out)
	}
}

// kill makes relay i reset every subflow packet it forwards: the path dies
// the way a crashed relay's NAT would.
func (dl *detourLab) kill(t *testing.T, i int) {
	dl.nft(t, fmt.Sprintf("detour%d", i), `table ip takill {
	chain fw { type filter hook forward priority 0; tcp dport 5201 reject with tcp reset; }
}`)
}

func (dl *detourLab) revive(t *testing.T, i int) {
	dl.run(t, fmt.Sprintf("detour%d", i), "nft", "delete", "table", "ip", "takill")
}

// serve runs an MPTCP sink on the server; dial opens an MPTCP connection
// from the client that keeps sending until the test ends.
func (dl *detourLab) serve(t *testing.T) {
	var ln net.Listener
	err := dl.l.Do("server", func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp4", fmt.Sprintf("0.0.0.0:%d", dl.server.Port())) // any address: the server may announce others
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
}

func (dl *detourLab) dial(t *testing.T) net.Conn {
	var c net.Conn
	err := dl.l.Do("client", func() (err error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true) // an unmodified application would use mptcpize
		c, err = d.Dial("tcp4", dl.server.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-done:
				return
			default:
			}
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(buf); err != nil && !os.IsTimeout(err) {
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); c.Close(); wg.Wait() })
	return c
}

func (dl *detourLab) config(t *testing.T, subflows int) Options {
	cfg := DefaultOptions()
	cfg.Subflows, cfg.Backoff = subflows, 300*time.Millisecond
	cfg.NetNS = dl.l.NetnsName("client")
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	return cfg
}

// detours is the lab's static detours: one NAT detour per relay.
func (dl *detourLab) detours() detour.Source {
	var ds []static.Entry
	for i, r := range dl.relays {
		ds = append(ds, static.Entry{
			Detour:  detour.Detour{Kind: detour.NAT, Relay: fmt.Sprintf("d%d", i+1), Remote: r},
			Servers: []netip.Prefix{netip.PrefixFrom(dl.server.Addr(), 32)}, Port: dl.server.Port(),
		})
	}
	return static.New(ds)
}

type running struct {
	cancel context.CancelFunc
	done   chan error
	socket string
}

func start(t *testing.T, cfg Options, sources ...detour.Source) *running {
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: testLogLevel}))
	r := &running{cancel: cancel, done: make(chan error, 1), socket: cfg.Socket}
	go func() { r.done <- RunLinux(ctx, cfg, log, nil, sources...) }()
	t.Cleanup(func() { r.stop(t) })
	// Ready once the status socket answers.
	waitFor(t, 10*time.Second, "agent status socket", func() (bool, string) {
		_, err := FetchStatus(cfg.Socket)
		return err == nil, fmt.Sprint(err)
	})
	return r
}

func (r *running) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("agent: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("agent did not stop within 10s")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last: %s", d, what, last)
}

// statusUntil polls the agent's status until cond holds and returns it. The
// kernel's view (inet_diag) can show a subflow open, carrying data or gone
// before the agent has handled the event that tells it so: a test that
// waited for the kernel must not read the agent's status once.
func statusUntil(t *testing.T, sock string, d time.Duration, what string, cond func(Status) bool) Status {
	t.Helper()
	var st Status
	waitFor(t, d, what, func() (bool, string) {
		var err error
		if st, err = FetchStatus(sock); err != nil {
			return false, err.Error()
		}
		return cond(st), fmt.Sprintf("%+v", st)
	})
	return st
}

// kernelSubflows asks the kernel (inet_diag) which remotes the connection's
// established subflows go to (a destroyed subflow on a silent path lingers
// in FIN_WAIT1 until its FIN times out; it carries nothing).
func kernelSubflows(t *testing.T, ns string, local netip.AddrPort) []netip.AddrPort {
	conns, err := mptcppm.Dump(mptcppm.Options{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if c.Local == local {
			var out []netip.AddrPort
			for _, s := range c.Subflows {
				if s.State == 1 {
					out = append(out, s.Remote)
				}
			}
			return out
		}
	}
	return nil
}

// fellBack reports whether the kernel turned the connection into plain TCP
// (a burst of simultaneous handshakes sometimes does).
func fellBack(t *testing.T, ns string, local netip.AddrPort) bool {
	conns, err := mptcppm.Dump(mptcppm.Options{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if c.Local == local {
			if c.Info.Flags&mptcppm.InfoFlagFallback != 0 {
				t.Logf("connection from %s fell back to TCP", local)
				return true
			}
			return false
		}
	}
	return false
}

func has(list []netip.AddrPort, x netip.AddrPort) bool {
	for _, y := range list {
		if y == x {
			return true
		}
	}
	return false
}

func TestAgentDetourSubflowReplaceAndAdopt(t *testing.T) {
	dl := upDetourLab(t, 2)
	ns := dl.l.NetnsName("client")
	pmBefore, err := readSysctl(ns, "net.mptcp.pm_type")
	if err != nil {
		t.Fatal(err)
	}
	dl.serve(t)
	cfg := dl.config(t, 1)
	ag := start(t, cfg, dl.detours())
	if v, _ := readSysctl(ns, "net.mptcp.pm_type"); v != "1" {
		t.Fatalf("pm_type while the agent runs = %s, want 1", v)
	}

	c := dl.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	d1, d2 := dl.relays[0], dl.relays[1]

	// 1. A second subflow through the first detour, carrying data.
	waitFor(t, 10*time.Second, "a subflow via d1", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, d1) && len(sfs) == 2, fmt.Sprint(sfs)
	})
	var st Status
	waitFor(t, 10*time.Second, "status: nat:d1 established and carrying data", func() (bool, string) {
		var err error
		if st, err = FetchStatus(cfg.Socket); err != nil {
			return false, err.Error()
		}
		if len(st.Connections) != 1 {
			return false, fmt.Sprintf("%+v", st.Connections)
		}
		paths := map[string]SubflowStatus{}
		for _, s := range st.Connections[0].Subflows {
			paths[s.Path] = s
		}
		s, ok := paths["nat:d1"]
		_, def := paths["default"]
		return ok && def && len(paths) == 2 && s.State == "ESTABLISHED" && s.BytesSent > 0 && s.Remote == d1.String(),
			fmt.Sprintf("%+v", st.Connections[0].Subflows)
	})

	// 2. d1's path dies: the agent replaces the subflow through d2.
	dl.kill(t, 1)
	waitFor(t, 15*time.Second, "the d1 subflow replaced via d2", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, d2) && !has(sfs, d1), fmt.Sprint(sfs)
	})
	st = statusUntil(t, cfg.Socket, 5*time.Second, "status: d1 shows a failure after its path died", func(st Status) bool {
		for _, d := range st.Detours {
			if d.Relay == "d1" {
				return d.Failed != 0
			}
		}
		return true // no d1 entry: nothing to check
	})
	t.Logf("status after d1 died: detours %+v", st.Detours)

	// 3. Restart: the agent restores pm_type on exit, and the new one adopts
	// the connection, recognising the d2 subflow.
	ag.stop(t)
	if v, _ := readSysctl(ns, "net.mptcp.pm_type"); v != pmBefore {
		t.Fatalf("pm_type after the agent stopped = %s, want %s", v, pmBefore)
	}
	dl.revive(t, 1)
	start(t, cfg, dl.detours())
	st, err = FetchStatus(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Connections) != 1 || !st.Connections[0].Adopted || st.Counters.Adopted != 1 {
		t.Fatalf("restarted agent did not adopt the connection: %+v", st)
	}
	adoptedPaths := ""
	for _, s := range st.Connections[0].Subflows {
		adoptedPaths += s.Path + " "
	}
	if !strings.Contains(adoptedPaths, "nat:d2") {
		t.Fatalf("adopted connection's subflows %q: want the d2 subflow recognised", adoptedPaths)
	}
	// The adopted connection is managed: when d2 dies, d1 takes over.
	dl.kill(t, 2)
	waitFor(t, 15*time.Second, "the adopted connection's d2 subflow replaced via d1", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, d1) && !has(sfs, d2), fmt.Sprint(sfs)
	})
}

// With a receive buffer too small for a burst, the kernel drops events; the
// agent notices (ENOBUFS), resynchronises from inet_diag and still gives
// every connection its detour subflow.
func TestAgentResyncAfterLostEvents(t *testing.T) {
	dl := upDetourLab(t, 1)
	ns := dl.l.NetnsName("client")
	dl.serve(t)
	cfg := dl.config(t, 1)
	cfg.EventBuffer = 1 // the kernel rounds it up to its minimum (a few events)
	start(t, cfg, dl.detours())
	const n = 20
	locals := make([]netip.AddrPort, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			locals[i] = netip.MustParseAddrPort(dl.dial(t).LocalAddr().String())
		}()
	}
	wg.Wait()
	waitFor(t, 20*time.Second, "every connection with a subflow via d1", func() (bool, string) {
		var missing []string
		for _, l := range locals {
			if fellBack(t, ns, l) {
				continue // plain TCP now: no subflow can be added
			}
			if sfs := kernelSubflows(t, ns, l); !has(sfs, dl.relays[0]) {
				missing = append(missing, fmt.Sprintf("%s: kernel %v", l, sfs))
			}
		}
		if len(missing) == 0 {
			return true, ""
		}
		st, _ := FetchStatus(cfg.Socket)
		return false, fmt.Sprintf("%d of %d connections without a detour subflow: %v; agent: %+v", len(missing), n, missing, st.Connections)
	})
	st := statusUntil(t, cfg.Socket, 5*time.Second, "counters: the burst should have overflowed the buffer and caused a resync", func(st Status) bool {
		return st.Counters.EventsLost != 0 && st.Counters.Resyncs >= 2
	})
	t.Logf("counters: %+v", st.Counters)
}

// Replacing the in-kernel path manager must not lose what it did for the
// client: the server's ADD_ADDR announcements still get subflows.
func TestAgentHonoursServerAnnouncements(t *testing.T) {
	dl := upDetourLab(t, 1)
	ns := dl.l.NetnsName("client")
	extra := netip.MustParseAddr("10.0.3.3")
	dl.run(t, "server", "ip", "addr", "add", extra.String()+"/24", "dev", "A2")
	dl.run(t, "server", "ip", "mptcp", "endpoint", "add", extra.String(), "id", "5", "signal")
	dl.serve(t)
	cfg := dl.config(t, 0)    // no detours: only the announcement
	cfg.AnnouncedSubflows = 2 // opt-in (default 0, like the kernel's add_addr_accepted)
	start(t, cfg)
	c := dl.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	want := netip.AddrPortFrom(extra, dl.server.Port())
	waitFor(t, 10*time.Second, "a subflow to the announced address", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, want) && len(sfs) == 2, fmt.Sprint(sfs)
	})
	statusUntil(t, cfg.Socket, 5*time.Second, "status to show the announced subflow", func(st Status) bool {
		for _, c := range st.Connections {
			for _, s := range c.Subflows {
				if s.Path == "announced" && s.Remote == want.String() {
					return true
				}
			}
		}
		return false
	})
}

var testLogLevel = func() slog.Level {
	if os.Getenv("MPDETOUR_AGENT_DEBUG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}()

// blackhole makes relay i drop every subflow packet silently (no reset).
func (dl *detourLab) blackhole(t *testing.T, i int) {
	dl.nft(t, fmt.Sprintf("detour%d", i), `table ip tadrop {
	chain fw { type filter hook forward priority 0; tcp dport 5201 drop; }
}`)
}

// Paths that die silently: a detour that swallows the SYN is abandoned
// after connect_timeout, and an established detour subflow whose path
// stops answering is detected by its retransmission timeouts, closed and
// replaced.
func TestAgentSilentDetourFailures(t *testing.T) {
	dl := upDetourLab(t, 2)
	ns := dl.l.NetnsName("client")
	dl.serve(t)
	cfg := dl.config(t, 1)
	cfg.ConnectTimeout = time.Second
	cfg.ProbeInterval = 500 * time.Millisecond
	start(t, cfg, dl.detours())
	d1, d2 := dl.relays[0], dl.relays[1]

	dl.blackhole(t, 1)
	c := dl.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	waitFor(t, 15*time.Second, "a subflow via d2 after d1 swallowed the SYN", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, d2), fmt.Sprint(sfs)
	})

	// d1 comes back, d2 goes silent under traffic.
	dl.run(t, "detour1", "nft", "delete", "table", "ip", "tadrop")
	dl.blackhole(t, 2)
	waitFor(t, 30*time.Second, "the silent d2 subflow closed and replaced via d1", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, d1) && !has(sfs, d2), fmt.Sprint(sfs)
	})
	statusUntil(t, cfg.Socket, 5*time.Second, "status: d2 shows the stall", func(st Status) bool {
		for _, d := range st.Detours {
			if d.Relay == "d2" && (d.Failed == 0 || !strings.Contains(d.LastError, "stalled")) {
				return false
			}
		}
		return true
	})
}

// The adaptive policy redials a dead default path on a fresh subflow (same
// addresses, another local port) when it retries it, and once the path is
// back the fresh subflow carries data and the old one is closed: the real
// kernel accepts a second subflow between the initial addresses from the
// userspace path manager. After the outage the old subflow's own 4-tuple
// stays dropped (a middlebox on the default path that lost its state, or,
// in effect, a peer whose retransmission timer backed off for seconds), so
// only the redial can bring the path back.
func TestAgentAdaptiveRedialsDeadDefaultPath(t *testing.T) {
	dl := upDetourLab(t, 1)
	ns := dl.l.NetnsName("client")
	dl.serve(t)
	cfg := dl.config(t, 1)
	cfg.Policy = policy.Adaptive
	cfg.ProbeInterval = 100 * time.Millisecond
	start(t, cfg, dl.detours())
	c := dl.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	waitFor(t, 10*time.Second, "a subflow via the detour", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, dl.relays[0]), fmt.Sprint(sfs)
	})
	time.Sleep(time.Second)
	// Black-hole the default path (client <-> server through r1) both ways;
	// the detour's packets are addressed to the relay and pass.
	client := dl.l.Addr("client")
	dl.nft(t, "r1", fmt.Sprintf(`table ip tahole {
	chain fw { type filter hook forward priority 0;
		ip saddr %s ip daddr %s drop; ip saddr %s ip daddr %s drop; }
}`, client, dl.server.Addr(), dl.server.Addr(), client))
	time.Sleep(3 * time.Second)
	dl.nft(t, "r1", fmt.Sprintf(`flush table ip tahole
table ip tahole {
	chain fw { type filter hook forward priority 0;
		ip saddr %s tcp sport %d drop; ip daddr %s tcp dport %d drop; }
}`, client, local.Port(), client, local.Port()))
	restored := time.Now()
	var fresh mptcppm.Subflow
	waitFor(t, 10*time.Second, "a fresh default-path subflow carrying data, the old one closed", func() (bool, string) {
		conns, err := mptcppm.Dump(mptcppm.Options{NetNS: ns})
		if err != nil {
			return false, err.Error()
		}
		var desc []string
		old, ok := false, false
		for _, mc := range conns {
			if mc.Local != local {
				continue
			}
			for _, s := range mc.Subflows {
				desc = append(desc, fmt.Sprintf("%s->%s state %d acked %d", s.Local, s.Remote, s.State, s.BytesAcked))
				if s.Remote != dl.server || s.State != 1 {
					continue
				}
				if s.Local == local {
					old = true
				} else if s.BytesAcked > 0 {
					ok, fresh = true, s
				}
			}
		}
		return ok && !old, strings.Join(desc, "; ")
	})
	t.Logf("default path redialled from %s, carrying data %s after the path came back", fresh.Local, time.Since(restored).Round(100*time.Millisecond))
	statusUntil(t, cfg.Socket, 5*time.Second, "status: the default path active from "+fresh.Local.String()+" only", func(st Status) bool {
		found := false
		for _, cs := range st.Connections {
			for _, sf := range cs.Subflows {
				if sf.Path == "default" {
					found = true
					if sf.Role != "active" || sf.Local != fresh.Local.String() {
						return false
					}
				}
			}
		}
		return found
	})
}
