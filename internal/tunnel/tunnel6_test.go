package tunnel

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// TestTunnelIPv6Inside: with an IPv6 tunnel subnet, the relay gives each
// client an IPv6 tunnel address beside its IPv4 one (the IPv4 host offset
// in the IPv6 subnet), admits it as the peer's allowed IP, and forwards
// IPv6 from the tunnel with masquerade (the ip6 table), under the IPv6
// destination policy (a restricted ULA is answered with a reset, an allowed
// one is reached), while IPv4 through the same tunnel keeps working.
// Close removes both tables. The client configures its IPv6 address, rule,
// route and allowed IP from Allocation.Address6, and removes them on Close.
func TestTunnelIPv6Inside(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	nsRun(t, tp.relay, "ip", "-6", "addr", "add", "fd00:5::1/64", "dev", "s0", "nodad")
	nsRun(t, tp.server, "ip", "-6", "addr", "add", "fd00:5::10/64", "dev", "r0", "nodad")
	nsRun(t, tp.server, "ip", "-6", "addr", "add", "fd00:5::20/64", "dev", "r0", "nodad")
	sub6 := netip.MustParsePrefix("fd64:1::/64")
	relayKey := genKey(t)
	srv := newServer(t, tp, relayKey, func(c *ServerConfig) {
		c.Subnet6 = sub6
		c.Destinations.Restricted = append(append([]netip.Prefix(nil), c.Destinations.Restricted...), netip.MustParsePrefix("fc00::/7"))
		c.Destinations.Restricted = append(c.Destinations.Restricted, netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("8000::/1"))
		// NAT64 allowed: its embeddings of refused IPv4 prefixes stay refused.
		c.Destinations.Allow = []netip.Prefix{netip.MustParsePrefix("fd00:5::10/128"), netip.MustParsePrefix("64:ff9b::/96")}
	})
	k1 := genKey(t)
	a1, err := srv.Offer(k1.PublicKey(), tp.relayEndpoint(1).Addr())
	if err != nil {
		t.Fatal(err)
	}
	p6 := srv.Address6(a1.Address)
	off := a1.Address.Addr().As4()[3]
	if !sub6.Contains(p6.Addr()) || p6.Bits() != 64 || p6.Addr().As16()[15] != off {
		t.Fatalf("IPv6 tunnel address %v for %v, want the same host offset in %v", p6, a1.Address, sub6)
	}
	if out := nsRun(t, tp.relay, "ip", "-6", "addr", "show", "dev", DefaultServerIface); !strings.Contains(out, "fd64:1::1/64") {
		t.Fatalf("relay's tunnel interface lacks its IPv6 address fd64:1::1/64:\n%s", out)
	}
	out := nsRun(t, tp.relay, "nft", "list", "table", "ip6", TableName)
	for _, want := range []string{"masquerade", "ip6 daddr fd00:5::10 accept", "ip6 daddr fc00::/7", "reject with tcp reset",
		"ip6 daddr 64:ff9b::a00:0/104", "ip6 daddr 8000::/1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("ip6 tunnel table lacks %q:\n%s", want, out)
		}
	}
	// The client half of IPv6 (client6.go): address, rule, route and the
	// peer's allowed IPs from the allocation.
	a1.Address6 = p6
	c1 := newClient(t, tp.c1, 0, k1, a1)
	if c1.Address6() != p6.Addr() {
		t.Fatalf("client IPv6 address %v, want %v", c1.Address6(), p6.Addr())
	}
	if d := c1.Detours(netip.MustParseAddrPort("[fd00:5::10]:5301")); len(d) != 1 || d[0].Local != p6.Addr() {
		t.Fatalf("IPv6 detours %+v, want one from %v", d, p6.Addr())
	}
	for _, want := range []string{"from " + p6.Addr().String() + " lookup 52000"} {
		if out := nsRun(t, tp.c1, "ip", "-6", "rule"); !strings.Contains(out, want) {
			t.Fatalf("client IPv6 rules lack %q:\n%s", want, out)
		}
	}

	var ln net.Listener
	if err := netnstest.DoNamed(tp.server, func() (err error) { ln, err = net.Listen("tcp6", "[::]:5301"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { fmt.Fprintf(c, "%s\n", c.RemoteAddr()); c.Close() })
	dial6 := func(dst string) (string, error) {
		var c net.Conn
		err := netnstest.DoNamed(tp.c1, func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: p6.Addr().AsSlice()}}
			c, err = d.Dial("tcp6", dst)
			return err
		})
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	var seen string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if seen, err = dial6("[fd00:5::10]:5301"); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || !strings.HasPrefix(seen, "[fd00:5::1]:") {
		t.Fatalf("IPv6 through the tunnel: server saw %q (%v), want the relay's fd00:5::1 (masquerade)", seen, err)
	}
	// A restricted IPv6 destination: refused at once (reset), not dropped.
	start := time.Now()
	if _, err := dial6("[fd00:5::20]:5301"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("restricted IPv6 destination through the tunnel: %v, want connection refused", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refusal took %v: dropped instead of answered", took)
	}
	if n, err := srv.Refused(); err != nil || n == 0 {
		t.Fatalf("Refused() = %d, %v: the ip6 table's reject not counted", n, err)
	}
	// IPv4 through the same tunnel still works.
	echo := echoServer(t, tp.server, serverAddr, false)
	if seen, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 10*time.Second); err != nil || netip.MustParseAddrPort(seen).Addr() != relayUplink {
		t.Fatalf("IPv4 through the tunnel beside IPv6: %q %v", seen, err)
	}
	c1.Close()
	if out := nsRun(t, tp.c1, "ip", "-6", "rule"); strings.Contains(out, "lookup 52000") {
		t.Fatalf("client IPv6 rule left after Close:\n%s", out)
	}
	if out := nsRun(t, tp.c1, "ip", "-6", "route", "show", "table", "all"); strings.Contains(out, "table 52000") {
		t.Fatalf("client IPv6 route left after Close:\n%s", out)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	assertClean(t, tp.relay)
}

func TestSubnet6Checks(t *testing.T) {
	p4 := netip.MustParsePrefix("100.80.0.0/16")
	for _, s := range []string{"fd64::/64", "2001:db8::/96", "fd64::/112"} {
		if err := CheckSubnet6(netip.MustParsePrefix(s), p4); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	for _, s := range []string{"fd64::1/64", "fd64::/113", "fe80::/64", "ff00::/8", "::ffff:0:0/96", "10.0.0.0/8"} {
		if err := CheckSubnet6(netip.MustParsePrefix(s), p4); err == nil {
			t.Errorf("%s accepted", s)
		}
	}
	if got := addr6(p4, netip.MustParsePrefix("fd64::/64"), netip.MustParseAddr("100.80.3.7")); got != netip.MustParseAddr("fd64::307") {
		t.Errorf("addr6 = %v, want fd64::307", got)
	}
}

// TestCleanupClientsIPv6: the IPv6 rule and route a crashed agent's tunnel
// left (its embedded device vanished with it) are removed at the next
// start, as the IPv4 ones are.
func TestCleanupClientsIPv6(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip")
	ns := netnstest.New(t, "tcl6")
	for _, k := range []string{"all", "default", "lo"} {
		nsRun(t, ns.Name, "sysctl", "-qw", "net.ipv6.conf."+k+".disable_ipv6=0")
	}
	nsRun(t, ns.Name, "ip", "link", "set", "lo", "up")
	nsRun(t, ns.Name, "ip", "-6", "rule", "add", "from", "fd64:1::7", "lookup", "52003", "pref", "5200")
	nsRun(t, ns.Name, "ip", "-6", "route", "add", "default", "dev", "lo", "table", "52003")
	if err := CleanupClients(ns.Name); err != nil {
		t.Fatal(err)
	}
	if out := nsRun(t, ns.Name, "ip", "-6", "rule"); strings.Contains(out, "52003") {
		t.Fatalf("crashed client's IPv6 rule left:\n%s", out)
	}
	if out := nsRun(t, ns.Name, "ip", "-6", "route", "show", "table", "52003"); strings.TrimSpace(out) != "" {
		t.Fatalf("crashed client's IPv6 route left:\n%s", out)
	}
}
