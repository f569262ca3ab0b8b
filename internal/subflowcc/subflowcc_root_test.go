package subflowcc

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// ccOf polls `ss -tin` in ns until the established TCP socket toward dst
// (an MPTCP subflow) shows an algorithm, or the deadline passes.
func ccOf(t *testing.T, ns *netnstest.NS, dst netip.Addr, deadline time.Time) string {
	t.Helper()
	var out string
	for {
		out, _ = ns.Try("ss", "-tinH", "state", "established", "dst", dst.String())
		for _, f := range strings.Fields(out) {
			switch f {
			case "cubic", "bbr", "reno":
				return f
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subflow toward %s with an algorithm in ss -tin:\n%s", dst, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func protoRoutes(t *testing.T, ns *netnstest.NS) string {
	t.Helper()
	return strings.TrimSpace(ns.Run("ip", "route", "show", "table", "all", "proto", fmt.Sprint(int(Protocol))))
}

// A real MPTCP connection whose socket asks for cubic (as the lab's bench
// does): its subflow toward the detour's destination runs the configured
// bbr, the initial subflow on the default path keeps cubic, and Close
// leaves no route behind.
func TestDetourSubflowRunsConfiguredAlgorithm(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "ss")
	for _, a := range []string{"bbr", "cubic"} {
		if err := Check(a); err != nil {
			t.Skip(err)
		}
	}
	c, s := netnstest.New(t, "sfcc-c"), netnstest.New(t, "sfcc-s")
	_, sIf := netnstest.Link(t, c, "10.231.0.1/24", s, "10.231.0.2/24")
	// The "relay": another address of the server host, reached through the
	// same gateway, as a NAT detour's relay is reached on the default route.
	s.Addr(t, sIf, "10.232.0.2/32")
	c.Route(t, "10.232.0.0/24", "10.231.0.2")
	server, relay := netip.MustParseAddr("10.231.0.2"), netip.MustParseAddr("10.232.0.2")
	for _, ns := range []*netnstest.NS{c, s} {
		if err := ns.Sysctl("net/mptcp/pm_type", "0"); err != nil {
			t.Fatal(err)
		}
		ns.Run("ip", "mptcp", "limits", "set", "subflows", "2", "add_addr_accepted", "2")
	}
	// The server announces the relay address; the client's in-kernel path
	// manager opens a subflow to it (what the agent's SUBFLOW_CREATE does
	// toward a relay's port).
	s.Run("ip", "mptcp", "endpoint", "add", relay.String(), "signal")

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := Open(c.Path, "bbr", log)
	t.Cleanup(func() { _ = r.Close() })
	if st := r.Status(); st.State != "active" {
		t.Fatalf("status %+v", st)
	}
	r.Prepare(netip.Addr{}, relay)
	r.Prepare(netip.Addr{}, relay) // once is enough: the route says bbr already
	st := r.Status()
	if len(st.Routes) != 1 || st.Routes[0].Dst != relay || len(st.Failed) != 0 {
		t.Fatalf("status after Prepare: %+v", st)
	}
	if got := protoRoutes(t, c); !strings.Contains(got, "10.232.0.2 via 10.231.0.2") || !strings.Contains(got, "congctl bbr") {
		t.Fatalf("route not added as expected:\n%s", got)
	}
	// The default path's route is untouched.
	if rs, err := c.Netlink().RouteGet(server.AsSlice()); err != nil || len(rs) == 0 || rs[0].Congctl != "" {
		t.Fatalf("route to the server: %+v, %v", rs, err)
	}

	lc := net.ListenConfig{}
	lc.SetMultipathTCP(true)
	ln, err := s.Listen(lc, "tcp", "0.0.0.0:5401")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(conn net.Conn) { _, _ = io.Copy(io.Discard, conn); conn.Close() })
	d := &net.Dialer{Timeout: 5 * time.Second}
	d.SetMultipathTCP(true)
	var ccErr error
	d.Control = func(_, _ string, rc syscall.RawConn) error {
		if err := rc.Control(func(fd uintptr) {
			ccErr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, "cubic")
		}); err != nil {
			return err
		}
		return ccErr
	}
	conn, err := c.Dial(d, "tcp", server.String()+":5401")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stop := netnstest.KeepWriting(conn)
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	if got := ccOf(t, c, relay, deadline); got != "bbr" {
		t.Errorf("detour subflow runs %s, want bbr", got)
	}
	if got := ccOf(t, c, server, deadline); got != "cubic" {
		t.Errorf("default-path subflow runs %s, want cubic (the socket's)", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := protoRoutes(t, c); got != "" {
		t.Fatalf("routes left after Close:\n%s", got)
	}
}

// Open removes routes an agent that died left (any table); a host route
// that exists already is left as it is, said in Status; an algorithm the
// kernel lacks fails Open with the kernel's list.
func TestOpenCleansAndNeverReplaces(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip")
	if err := Check("bbr"); err != nil {
		t.Skip(err)
	}
	c, s := netnstest.New(t, "sfcc-c"), netnstest.New(t, "sfcc-s")
	cIf, _ := netnstest.Link(t, c, "10.233.0.1/24", s, "10.233.0.2/24")
	// Left by a dead agent: ours in table 100 (a tunnel's table) and main.
	c.Run("ip", "route", "add", "10.234.0.9/32", "via", "10.233.0.2", "table", "100", "proto", fmt.Sprint(int(Protocol)), "congctl", "bbr")
	c.Run("ip", "route", "add", "10.234.0.8/32", "via", "10.233.0.2", "proto", fmt.Sprint(int(Protocol)), "congctl", "bbr")
	// Someone else's host route to a detour destination.
	c.Run("ip", "route", "add", "10.234.0.7/32", "via", "10.233.0.2", "dev", cIf)
	c.Route(t, "10.234.0.0/24", "10.233.0.2")

	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))
	r := Open(c.Path, "bbr", log)
	defer r.Close()
	if st := r.Status(); st.State != "active" {
		t.Fatalf("status %+v", st)
	}
	if got := protoRoutes(t, c); got != "" {
		t.Fatalf("routes of a dead agent not removed:\n%s", got)
	}
	other := netip.MustParseAddr("10.234.0.7")
	r.Prepare(netip.Addr{}, other)
	r.Prepare(netip.Addr{}, other)
	st := r.Status()
	if len(st.Routes) != 0 || len(st.Failed) != 1 || st.Failed[0].Dst != other || !strings.Contains(st.Failed[0].Error, "exists") {
		t.Fatalf("status %+v", st)
	}
	if n := strings.Count(logged.String(), "not applied"); n != 1 {
		t.Errorf("%d log lines for the failed destination, want 1:\n%s", n, logged.String())
	}
	if out := c.Run("ip", "route", "show", "10.234.0.7/32"); strings.Contains(out, "congctl") || !strings.Contains(out, "10.234.0.7") {
		t.Errorf("someone else's route changed: %q", out)
	}

	bad := Open(c.Path, "no-such-cc", log)
	if st := bad.Status(); st.State != "failed" || !strings.Contains(st.Error, "not available") {
		t.Fatalf("unknown algorithm: %+v", st)
	}
	bad.Prepare(netip.Addr{}, netip.MustParseAddr("10.234.0.5")) // does nothing
	if err := bad.Close(); err != nil {
		t.Fatal(err)
	}
	if got := protoRoutes(t, c); got != "" {
		t.Fatalf("a failed start added routes:\n%s", got)
	}
}

// On the real kernel: the host's route toward a relay moves to another
// gateway; the next Prepare after followEvery moves our host route with it
// (before, ours kept the old gateway and black-holed the detour).
func TestRouteFollowsGatewayChangeOnKernel(t *testing.T) {
	testenv.Tools(t, "ip")
	if err := Check("reno"); err != nil {
		t.Skip(err)
	}
	c, s := netnstest.New(t, "sfgw-c"), netnstest.New(t, "sfgw-s")
	netnstest.Link(t, c, "10.233.0.1/24", s, "10.233.0.2/24")
	c.Run("ip", "route", "add", "10.234.0.0/24", "via", "10.233.0.2")
	r := Open(c.Path, "reno", slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { _ = r.Close() })
	relay := netip.MustParseAddr("10.234.0.9")
	r.Prepare(netip.Addr{}, relay)
	if got := protoRoutes(t, c); !strings.Contains(got, "10.234.0.9 via 10.233.0.2") || !strings.Contains(got, "congctl reno") {
		t.Fatalf("our route: %q", got)
	}
	// Another gateway on the same link takes over the relay's prefix; the
	// next Prepare after followEvery (the clock moved, not waited for)
	// moves ours.
	c.Run("ip", "route", "replace", "10.234.0.0/24", "via", "10.233.0.3")
	r.now = func() time.Time { return time.Now().Add(followEvery) }
	r.Prepare(netip.Addr{}, relay)
	if got := protoRoutes(t, c); !strings.Contains(got, "10.234.0.9 via 10.233.0.3") || !strings.Contains(got, "congctl reno") {
		t.Fatalf("our route after the gateway change: %q (status %+v)", got, r.Status())
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := protoRoutes(t, c); got != "" {
		t.Fatalf("left after Close: %q", got)
	}
}

// On the real kernel, with the table's default routes (netlink lists them
// as 0.0.0.0/0 and ::/0, not without a destination as the fake does): a
// new IPv4 default gateway, a multipath default without ours' gateway, and
// a new IPv6 default gateway each move ours.
func TestRouteFollowsDefaultRoutesOnKernel(t *testing.T) {
	testenv.Tools(t, "ip")
	if err := Check("reno"); err != nil {
		t.Skip(err)
	}
	c, s := netnstest.New(t, "sfdf-c"), netnstest.New(t, "sfdf-s")
	cIf, _ := netnstest.Link(t, c, "10.235.0.1/24", s, "10.235.0.2/24")
	c.Run("ip", "-6", "addr", "add", "fd00:235::1/64", "dev", "lo")
	c.Run("ip", "route", "add", "default", "via", "10.235.0.2")
	c.Run("ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", cIf)
	r := Open(c.Path, "reno", slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { _ = r.Close() })
	now := time.Now()
	r.now = func() time.Time { return now }
	relay, relay6 := netip.MustParseAddr("198.18.5.9"), netip.MustParseAddr("2001:db8:5::9")
	step := func(what string, dst netip.Addr, want string) {
		t.Helper()
		now = now.Add(followEvery)
		r.Prepare(netip.Addr{}, dst)
		if got := protoRoutes(t, c); !strings.Contains(got, want) {
			t.Fatalf("%s: our routes %q, want %q (status %+v)", what, got, want, r.Status())
		}
	}
	step("added", relay, "198.18.5.9 via 10.235.0.2 ")
	step("added", relay6, "2001:db8:5::9 via fe80::1 ")
	c.Run("ip", "route", "replace", "default", "via", "10.235.0.3")
	step("new default gateway", relay, "198.18.5.9 via 10.235.0.3 ")
	c.Run("ip", "route", "replace", "default", "nexthop", "via", "10.235.0.4", "nexthop", "via", "10.235.0.5")
	step("multipath default without ours' gateway", relay, "198.18.5.9 via 10.235.0.4 ")
	c.Run("ip", "-6", "route", "replace", "default", "via", "fe80::2", "dev", cIf)
	step("new IPv6 default gateway", relay6, "2001:db8:5::9 via fe80::2 ")
}
