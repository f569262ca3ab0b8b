package tunnel

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

var encapSubnet6 = netip.MustParsePrefix("fd64:81::/64")

// TestEncapIPv6Inside: with a vxlan subnet6 a member gets an inner IPv6
// address (its IPv4 inner address's host offset in subnet6) and the
// relay's as gateway; the client configures them, and TCP from the inner
// IPv6 address reaches an IPv6 server through the VXLAN device,
// masqueraded to the relay's IPv6 address and MSS-clamped to MTU-60; a
// restricted IPv6 destination is dropped (counted); an inner IPv6 source
// other than the member's, sent through the member's own device, is
// dropped by the relay's per-member rule (counted); IPv4 through the same
// tunnel keeps working. Close removes the IPv6 rule, routes and both
// tables.
func TestEncapIPv6Inside(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft", "ss")
	tp := newTopo(t)
	nsRun(t, tp.relay, "ip", "-6", "addr", "add", "fd00:5::1/64", "dev", "s0", "nodad")
	nsRun(t, tp.server, "ip", "-6", "addr", "add", "fd00:5::10/64", "dev", "r0", "nodad")
	nsRun(t, tp.server, "ip", "-6", "addr", "add", "fd00:5::20/64", "dev", "r0", "nodad")
	srv := newEncapServer(t, tp, func(c *EncapServerConfig) {
		c.Subnet6 = encapSubnet6
		c.Destinations.Restricted = append(append([]netip.Prefix(nil), c.Destinations.Restricted...), netip.MustParsePrefix("fc00::/7"))
		c.Destinations.Allow = []netip.Prefix{netip.MustParsePrefix("fd00:5::10/128")}
	})
	a1, err := srv.Open(genKey(t), netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1"))
	if err != nil {
		t.Fatal(err)
	}
	off := a1.Address.Addr().As4()
	if a6 := a1.Address6.Addr().As16(); !encapSubnet6.Contains(a1.Address6.Addr()) || a1.Address6.Bits() != 64 ||
		a6[14] != off[2] || a6[15] != off[3] || a1.Gateway6 != netip.MustParseAddr("fd64:81::1") {
		t.Fatalf("allocation %v / %v via %v: want %v's host offset in %v via fd64:81::1", a1.Address, a1.Address6, a1.Gateway6, a1.Address, encapSubnet6)
	}
	if err := a1.Validate(); err != nil {
		t.Fatalf("the relay's allocation does not validate as a grant: %v", err)
	}
	dev := fmt.Sprintf("%s%d", EncapServerIfacePrefix, a1.VNI)
	table6 := nsRun(t, tp.relay, "nft", "list", "table", "ip6", EncapTableName)
	t.Logf("relay ip6 table:\n%s", table6)
	for _, want := range []string{"masquerade", fmt.Sprintf("iifname %q ip6 saddr != %s", dev, a1.Address6.Addr()),
		"ip6 daddr fd00:5::10 accept", "ip6 daddr fc00::/7", fmt.Sprintf("maxseg size set %d", DefaultEncapMTU-60)} {
		if !strings.Contains(table6, want) {
			t.Fatalf("ip6 encap table lacks %q", want)
		}
	}

	c1 := newEncapClient(t, tp.c1, 0, a1)
	if c1.Address6() != a1.Address6.Addr() {
		t.Fatalf("client inner IPv6 address %v, want %v", c1.Address6(), a1.Address6.Addr())
	}
	server6 := netip.MustParseAddrPort("[fd00:5::10]:5301")
	if d := c1.Detours(server6); len(d) != 1 || d[0].Local != a1.Address6.Addr() || d[0].Remote != server6 {
		t.Fatalf("IPv6 detours %+v, want one from %v", d, a1.Address6.Addr())
	}
	var ln net.Listener
	if err := netnstest.DoNamed(tp.server, func() (err error) { ln, err = net.Listen("tcp6", "[::]:5301"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { fmt.Fprintf(c, "%s\n", c.RemoteAddr()); c.Close() })
	dial6 := func(from netip.Addr, dst string, timeout time.Duration, ss *string) (string, error) {
		var c net.Conn
		err := netnstest.DoNamed(tp.c1, func() (err error) {
			d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: from.AsSlice()}}
			c, err = d.Dial("tcp6", dst)
			return err
		})
		if err != nil {
			return "", err
		}
		defer c.Close()
		if ss != nil {
			*ss = nsRun(t, tp.c1, "ss", "-tni", "src", "["+from.String()+"]")
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	// Poll: the first connection waits for neighbour discovery both ways.
	var seen, ss string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if seen, err = dial6(c1.Address6(), server6.String(), 2*time.Second, &ss); err == nil {
			break
		}
	}
	if err != nil || !strings.HasPrefix(seen, "[fd00:5::1]:") {
		t.Fatalf("IPv6 through vxlan: server saw %q (%v), want the relay's fd00:5::1 (masquerade)", seen, err)
	}
	if mss := a1.MTU - 60; !strings.Contains(ss, fmt.Sprintf("mss:%d", mss)) && !strings.Contains(ss, fmt.Sprintf("mss:%d", mss-12)) {
		t.Errorf("client MSS through a %d-byte vxlan with IPv6 inside not %d:\n%s", a1.MTU, mss, ss)
	}
	// A restricted IPv6 destination: dropped, counted.
	before := forwardDrops(t, tp.relay, "ip6 daddr fc00::/7")
	if _, err := dial6(c1.Address6(), "[fd00:5::20]:5301", 500*time.Millisecond, nil); err == nil {
		t.Error("restricted IPv6 destination reachable through vxlan")
	}
	if after := forwardDrops(t, tp.relay, "ip6 daddr fc00::/7"); after == before {
		t.Errorf("restricted-destination drop counter unchanged (%d)", after)
	}

	// Inner spoofing: another source in subnet6 sent through the member's
	// own device (a rule sends it to the tunnel table). The relay's rule
	// for the device admits only the member's inner IPv6 address.
	spoofed := netip.MustParseAddr("fd64:81::99")
	nsRun(t, tp.c1, "ip", "-6", "addr", "add", spoofed.String()+"/128", "dev", c1.Iface(), "nodad")
	nsRun(t, tp.c1, "ip", "-6", "rule", "add", "from", spoofed.String(), "lookup", fmt.Sprint(EncapTableBase), "pref", fmt.Sprint(EncapRulePriority))
	// (The relay has no route back to the spoofed address, so a failed
	// connection proves nothing: what counts is that nothing left the
	// relay, i.e. the masquerade saw no new connection.)
	spoofRule := fmt.Sprintf("ip6 saddr != %s", a1.Address6.Addr())
	before, masq := forwardDrops(t, tp.relay, spoofRule), chainCount(t, tp.relay, "masquerade")
	if seen, err := dial6(spoofed, server6.String(), 500*time.Millisecond, nil); err == nil {
		t.Fatalf("a spoofed inner IPv6 source reached the server (it saw %q)", seen)
	}
	if after := forwardDrops(t, tp.relay, spoofRule); after == before {
		t.Errorf("the per-member anti-spoofing rule counted nothing (%d): the spoofed packets were not dropped by it", after)
	}
	if after := chainCount(t, tp.relay, "masquerade"); after != masq {
		t.Errorf("the masquerade counted %d new connections during the spoof: spoofed packets left the relay", after-masq)
	}
	// The member still passes, and IPv4 through the same tunnel works.
	if seen, err := dial6(c1.Address6(), server6.String(), 2*time.Second, nil); err != nil || !strings.HasPrefix(seen, "[fd00:5::1]:") {
		t.Fatalf("member's IPv6 after the spoof: %q %v", seen, err)
	}
	echo := echoServer(t, tp.server, serverAddr, false)
	if seen, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 5*time.Second); err != nil || !strings.HasPrefix(seen, relayUplink.String()+":") {
		t.Fatalf("IPv4 through vxlan beside IPv6: %q %v", seen, err)
	}

	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if out := nsRun(t, tp.c1, "ip", "-6", "rule"); strings.Contains(out, fmt.Sprintf("lookup %d", EncapTableBase)) {
		t.Fatalf("client IPv6 rule left after Close:\n%s", out)
	}
	if out := nsRun(t, tp.c1, "ip", "-6", "route", "show", "table", "all"); strings.Contains(out, fmt.Sprintf("table %d", EncapTableBase)) {
		t.Fatalf("client IPv6 routes left after Close:\n%s", out)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	assertEncapClean(t, tp.relay)
}

// forwardDrops is the packet counter of the ip6 encap table's forward
// drop rule whose line contains match.
func forwardDrops(t *testing.T, ns, match string) int {
	t.Helper()
	return chainCount(t, ns, match+" counter", "drop")
}

// chainCount is the packet counter of the rule of the ip6 encap table
// whose line contains every one of match.
func chainCount(t *testing.T, ns string, match ...string) int {
	t.Helper()
	// The whole table: nft's parser takes no chain named masquerade (a
	// keyword) on its command line; the matches name the rule.
	out := nsRun(t, ns, "nft", "list", "table", "ip6", EncapTableName)
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, m := range match {
			all = all && strings.Contains(l, m)
		}
		if all {
			var n int
			if i := strings.Index(l, "packets "); i >= 0 {
				fmt.Sscanf(l[i:], "packets %d", &n)
				return n
			}
		}
	}
	t.Fatalf("no rule with %q in:\n%s", match, out)
	return 0
}

// TestEncapInside6Config (no root): a subnet6 of the wrong family or too
// small for the IPv4 subnet's host offsets is refused naming it; a member
// whose inner MTU is below IPv6's minimum gets IPv4 inside only, with one
// log line saying why; without a subnet6 there is no IPv6 inside.
func TestEncapInside6Config(t *testing.T) {
	for _, c := range []struct {
		p6   string
		want string
	}{
		{"100.82.0.0/16", "not an IPv6 unicast prefix"},
		{"fd64:81::/120", "host bits"},
		{"fe80::/64", "not an IPv6 unicast prefix"},
		{"fd64:81::1/64", "host bits set"},
	} {
		cfg := EncapServerConfig{Subnet: encapSubnet, Subnet6: netip.MustParsePrefix(c.p6)}
		if err := cfg.check(); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "vxlan") {
			t.Errorf("subnet6 %s: %v, want a vxlan error naming %q", c.p6, err, c.want)
		}
	}
	var logs bytes.Buffer
	s := &EncapServer{cfg: EncapServerConfig{Subnet: encapSubnet, Subnet6: encapSubnet6},
		log: slog.New(slog.NewTextHandler(&logs, nil))}
	var err error
	if s.alloc, err = newAllocator(encapSubnet, genKey(t)); err != nil {
		t.Fatal(err)
	}
	a := EncapAllocation{Address: netip.MustParsePrefix("100.81.2.3/16"), Member: netip.MustParseAddr("2001:db8::2"), MTU: 1250}
	if p, gw := s.inside6(a); p.IsValid() || gw.IsValid() {
		t.Fatalf("MTU 1250: IPv6 inside %v via %v, want none", p, gw)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "IPv4 inside only") || !strings.Contains(logs.String(), "mtu=1250") {
		t.Fatalf("want one log line saying IPv4 inside only and the MTU, got %d:\n%s", n, logs.String())
	}
	a.MTU = 1280
	if p, gw := s.inside6(a); p != netip.MustParsePrefix("fd64:81::203/64") || gw != netip.MustParseAddr("fd64:81::1") {
		t.Fatalf("MTU 1280: IPv6 inside %v via %v, want fd64:81::203/64 via fd64:81::1", p, gw)
	}
	s.cfg.Subnet6 = netip.Prefix{}
	if p, _ := s.inside6(a); p.IsValid() {
		t.Fatalf("without subnet6: IPv6 inside %v", p)
	}
}

// TestEncapDetoursFamilies (no root): an EncapClient offers IPv4 servers a
// detour from its inner address, IPv6 servers one from its inner IPv6
// address only when it has one configured (and never to a zoned address),
// and nothing once its lease ran out.
func TestEncapDetoursFamilies(t *testing.T) {
	c := &EncapClient{cfg: EncapClientConfig{Relay: "r1"}, alloc: EncapAllocation{Address: netip.MustParsePrefix("100.81.0.7/16")}}
	v4, v6 := netip.MustParseAddrPort("203.0.113.10:443"), netip.MustParseAddrPort("[2001:db8::10]:443")
	if d := c.Detours(v4); len(d) != 1 || d[0].Local != c.alloc.Address.Addr() || d[0].Remote != v4 {
		t.Fatalf("IPv4 server: %+v", d)
	}
	if d := c.Detours(v6); d != nil {
		t.Fatalf("IPv6 server without an inner IPv6 address: %+v", d)
	}
	c.addr6 = netip.MustParseAddr("fd64:81::7")
	if d := c.Detours(v6); len(d) != 1 || d[0].Local != c.addr6 || d[0].Remote != v6 {
		t.Fatalf("IPv6 server: %+v", d)
	}
	if d := c.Detours(netip.AddrPortFrom(netip.MustParseAddr("fe80::1%eth0"), 443)); d != nil {
		t.Fatalf("zoned IPv6 server: %+v", d)
	}
	if d := c.Detours(netip.MustParseAddrPort("[::ffff:203.0.113.10]:443")); len(d) != 1 || d[0].Local != c.alloc.Address.Addr() || d[0].Remote != v4 {
		t.Fatalf("IPv4-mapped server: %+v, want the IPv4 detour", d)
	}
	c.dead.Store(true)
	if d := c.Detours(v6); d != nil {
		t.Fatalf("after the lease ran out: %+v", d)
	}
}
