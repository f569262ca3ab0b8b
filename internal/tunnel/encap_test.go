package tunnel

import (
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

var encapSubnet = netip.MustParsePrefix("100.81.0.0/16")

func newEncapServer(t *testing.T, tp topo, mut ...func(*EncapServerConfig)) *EncapServer {
	t.Helper()
	cfg := EncapServerConfig{Netns: tp.relay, Subnet: encapSubnet, Seed: genKey(t).PublicKey(), Destinations: testDestinations}
	for _, m := range mut {
		m(&cfg)
	}
	s, err := NewEncapServer(cfg)
	if err != nil {
		t.Fatalf("NewEncapServer: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newEncapClient(t *testing.T, ns string, index int, a EncapAllocation) *EncapClient {
	t.Helper()
	c, err := NewEncapClient(EncapClientConfig{Netns: ns, Relay: "r1", Index: index, Allocation: a})
	if err != nil {
		t.Fatalf("NewEncapClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// assertEncapClean fails if ns holds a VXLAN device, rule, route or table
// of the encapsulation kind.
func assertEncapClean(t *testing.T, ns string) {
	t.Helper()
	if links := nsRun(t, ns, "ip", "-o", "link"); strings.Contains(links, IfacePrefix+"v") {
		t.Errorf("%s: vxlan interface left:\n%s", ns, links)
	}
	if rules := nsRun(t, ns, "ip", "rule"); strings.Contains(rules, "lookup 53") {
		t.Errorf("%s: rule left:\n%s", ns, rules)
	}
	if out, _ := exec.Command("ip", "-n", ns, "route", "show", "table", "all").CombinedOutput(); bytes.Contains(out, []byte("table 53")) {
		t.Errorf("%s: encap routes left:\n%s", ns, out)
	}
	if tables := nsRun(t, ns, "nft", "list", "tables"); strings.Contains(tables, EncapTableName) {
		t.Errorf("%s: nftables table left:\n%s", ns, tables)
	}
}

// dropCount reads the counter of the input chain's catch-all VXLAN drop.
func dropCount(t *testing.T, ns string) string { return dropCountIn(t, ns, "ip") }

// dropCountIn is dropCount of the table of family ("ip" or "ip6").
func dropCountIn(t *testing.T, ns, family string) string {
	out := nsRun(t, ns, "nft", "list", "chain", family, EncapTableName, "input")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "udp dport 4789") && strings.Contains(l, "drop") && !strings.Contains(l, "saddr") {
			f := strings.Fields(l)
			for i := range f {
				if f[i] == "packets" && i+1 < len(f) {
					return f[i+1]
				}
			}
		}
	}
	t.Fatalf("no drop rule in:\n%s", out)
	return ""
}

// TestEncapEndToEnd: member -> relay -> server over VXLAN (masqueraded to
// the relay's address, MSS clamped), normal traffic untouched; another host
// sending the member's VNI is dropped by the source filter; release and
// lease expiry remove device and filter; Close leaves nothing.
func TestEncapEndToEnd(t *testing.T) {
	tp := newTopo(t)
	srv := newEncapServer(t, tp, func(c *EncapServerConfig) { c.Lease = 2 * time.Second })
	k1, k2 := genKey(t), genKey(t)
	a1, err := srv.Open(k1, netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := srv.Open(k1, netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1"))
	if err != nil || again != a1 {
		t.Fatalf("repeat Open: %+v %v, want %+v", again, err, a1)
	}
	if !encapSubnet.Contains(a1.Address.Addr()) || a1.VNI == 0 || a1.MTU != DefaultEncapMTU {
		t.Fatalf("allocation %+v", a1)
	}
	c1 := newEncapClient(t, tp.c1, 0, a1)
	t.Logf("relay table:\n%s", nsRun(t, tp.relay, "nft", "list", "table", "ip", EncapTableName))
	echo := echoServer(t, tp.server, serverAddr, false)

	seen, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 5*time.Second)
	if err != nil {
		t.Fatalf("through vxlan: %v", err)
	}
	if !strings.HasPrefix(seen, relayUplink.String()+":") {
		t.Errorf("server saw %s, want the relay's %s (masquerade)", seen, relayUplink)
	}
	if seen, err := exchange(t, tp.c1, netip.Addr{}, echo, 1000, 2*time.Second); err != nil || !strings.HasPrefix(seen, "192.0.2.2:") {
		t.Errorf("direct path: saw %q, %v", seen, err)
	}
	// MSS toward the client: clamped to the inner MTU - 40.
	conn, err := dial(t, tp.c1, c1.Address(), echo, false, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ss := nsRun(t, tp.c1, "ss", "-tni", "src", c1.Address().String())
	conn.Close()
	if !strings.Contains(ss, "mss:1410") && !strings.Contains(ss, "mss:1398") {
		t.Errorf("client MSS through a %d-byte vxlan not clamped:\n%s", DefaultEncapMTU, ss)
	}
	// Restricted destination refused.
	if _, err := exchange(t, tp.c1, c1.Address(), netip.AddrPortFrom(deniedAddr, echo.Port()), 10, time.Second); err == nil {
		t.Error("restricted destination reachable through vxlan")
	}

	// A connection opened from the relay's uplink toward the member's inner
	// address does not reach the member.
	inner := echoServer(t, tp.c1, c1.Address(), false)
	nsRun(t, tp.server, "ip", "route", "replace", encapSubnet.String(), "via", relayUplink.String())
	if c, err := dial(t, tp.server, netip.Addr{}, inner, false, time.Second); err == nil {
		c.Close()
		t.Errorf("a connection from the relay's uplink reached member %s through vxlan", inner)
	}
	nsRun(t, tp.server, "ip", "route", "del", encapSubnet.String())

	// c2 is not the member: it sends the member's VNI (as the member's inner
	// address) from its own address. The relay drops it at input.
	spoof := a1
	spoof.Member = netip.MustParseAddr("198.18.2.2")
	spoof.Endpoint = netip.AddrPortFrom(netip.MustParseAddr("198.18.2.1"), uint16(DefaultEncapPort))
	c2 := newEncapClient(t, tp.c2, 0, spoof)
	before := dropCount(t, tp.relay)
	if _, err := exchange(t, tp.c2, c2.Address(), echo, 10, time.Second); err == nil {
		t.Fatal("a non-member's packets with the member's VNI reached the server")
	}
	if after := dropCount(t, tp.relay); after == before {
		t.Errorf("drop counter unchanged (%s): packets not dropped by the source filter", after)
	}
	// A second member gets its own address and VNI.
	a2, err := srv.Open(k2, netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("198.18.2.1"))
	if err != nil || a2.VNI == a1.VNI || a2.Address == a1.Address {
		t.Fatalf("second member: %+v %v (first %+v)", a2, err, a1)
	}
	// Release: device and filter entry gone, traffic stops.
	if err := srv.Remove(k2); err != nil {
		t.Fatal(err)
	}
	if _, err := netlinkLinkIn(t, tp.relay, fmt.Sprintf("%s%d", EncapServerIfacePrefix, a2.VNI)); err == nil {
		t.Error("released member's device still present")
	}
	// The lease runs out, then the member asks again: the relay rebuilds its
	// device, and the member's traffic passes at once (the rebuilt device keeps
	// the hardware address the member's neighbour entry holds; with a random
	// one this exchange timed out).
	for wait := time.Now().Add(5 * time.Second); len(srv.Members()) > 0 && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(srv.Members()); n != 0 {
		t.Fatalf("%d members after the first lease ran out", n)
	}
	// The member renews (the lease restarts), then stops: expiry removes it.
	if _, err := srv.Open(k1, netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	if _, err := exchange(t, tp.c1, c1.Address(), echo, 1000, 2*time.Second); err != nil {
		t.Fatalf("member before expiry: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(srv.Members()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(srv.Members()); n != 0 {
		t.Fatalf("%d members after the lease ran out", n)
	}
	if _, err := exchange(t, tp.c1, c1.Address(), echo, 10, time.Second); err == nil {
		t.Error("traffic still passes after the lease expired")
	}
	if links := nsRun(t, tp.relay, "ip", "-o", "link"); strings.Contains(links, EncapServerIfacePrefix) {
		t.Errorf("device left after expiry:\n%s", links)
	}
	c1.Close()
	c2.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{tp.c1, tp.c2, tp.relay} {
		assertEncapClean(t, ns)
	}
}

// TestEncapServerRemovesStale: a crashed relay's devices and table are
// removed at start; Close with members removes their devices.
func TestEncapServerRemovesStale(t *testing.T) {
	tp := newTopo(t)
	nsRun(t, tp.relay, "ip", "link", "add", EncapServerIfacePrefix+"99", "type", "vxlan", "id", "99", "dstport", "4789")
	nsRun(t, tp.relay, "nft", "add", "table", "ip", EncapTableName)
	srv := newEncapServer(t, tp)
	if links := nsRun(t, tp.relay, "ip", "-o", "link"); strings.Contains(links, EncapServerIfacePrefix+"99") {
		t.Errorf("stale device not removed:\n%s", links)
	}
	if _, err := srv.Open(genKey(t), netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.1.1")); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	assertEncapClean(t, tp.relay)
	// Overlap with an existing route is refused and leaves nothing.
	_, err := NewEncapServer(EncapServerConfig{Netns: tp.relay, Subnet: netip.MustParsePrefix("198.18.0.0/16")})
	if err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Errorf("overlapping subnet: %v", err)
	}
	assertEncapClean(t, tp.relay)
}

// TestEncapClientNeedsLocalMember: an allocation naming an address this
// host does not have (NAT in between) is refused and leaves nothing.
func TestEncapClientNeedsLocalMember(t *testing.T) {
	tp := newTopo(t)
	a := EncapAllocation{Address: netip.MustParsePrefix("100.81.0.9/16"), Gateway: netip.MustParseAddr("100.81.0.1"),
		Endpoint: netip.MustParseAddrPort("198.18.1.1:4789"), Member: netip.MustParseAddr("192.0.2.99"), VNI: 8, MTU: 1450}
	_, err := NewEncapClient(EncapClientConfig{Netns: tp.c1, Index: 3, Allocation: a})
	if err == nil || !strings.Contains(err.Error(), "not an address") {
		t.Fatalf("got %v", err)
	}
	assertEncapClean(t, tp.c1)
}

func netlinkLinkIn(t *testing.T, ns, name string) (netlink.Link, error) {
	n, err := openNetns(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	h, err := n.netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return h.LinkByName(name)
}
