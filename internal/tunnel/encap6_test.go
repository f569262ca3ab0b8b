package tunnel

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestEncapIPv6Underlay: VXLAN over an IPv6 outer path. The relay's
// per-member device has IPv6 local/remote addresses and an inner MTU 20
// bytes smaller (70 bytes of outer headers instead of 50); TCP from the
// member's inner (IPv4) address crosses it to the server, masqueraded and
// MSS-clamped; another host sending the member's VNI from its own IPv6
// address is dropped by the ip6 table's source filter; an IPv4 member is
// served beside it; mixed or link-local underlay addresses are refused;
// Close leaves neither table nor device, and a configured MTU that leaves
// less than 576 over IPv6 refuses IPv6 members with a clear error.
func TestEncapIPv6Underlay(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft", "ss")
	tp := newTopo(t)
	nsRun(t, tp.c1, "ip", "-6", "addr", "add", "2001:db8:71::2/64", "dev", "r0", "nodad")
	nsRun(t, tp.relay, "ip", "-6", "addr", "add", "2001:db8:71::1/64", "dev", "c1", "nodad")
	nsRun(t, tp.c2, "ip", "-6", "addr", "add", "2001:db8:72::2/64", "dev", "r0", "nodad")
	nsRun(t, tp.relay, "ip", "-6", "addr", "add", "2001:db8:72::1/64", "dev", "c2", "nodad")
	member, relay6 := netip.MustParseAddr("2001:db8:71::2"), netip.MustParseAddr("2001:db8:71::1")

	srv := newEncapServer(t, tp)
	k1, k2 := genKey(t), genKey(t)
	if _, err := srv.Open(k1, member, netip.MustParseAddr("198.18.1.1")); err == nil || !strings.Contains(err.Error(), "one family") {
		t.Fatalf("mixed-family underlay: %v", err)
	}
	if _, err := srv.Open(k1, netip.MustParseAddr("fe80::2"), netip.MustParseAddr("fe80::1")); err == nil || !strings.Contains(err.Error(), "global unicast") {
		t.Fatalf("link-local underlay: %v", err)
	}
	if n := len(srv.Members()); n != 0 {
		t.Fatalf("%d members after refusals", n)
	}
	a1, err := srv.Open(k1, member, relay6)
	if err != nil {
		t.Fatal(err)
	}
	if a1.MTU != DefaultEncapMTU-EncapIPv6Overhead || a1.Endpoint != netip.AddrPortFrom(relay6, DefaultEncapPort) || a1.Member != member ||
		!encapSubnet.Contains(a1.Address.Addr()) {
		t.Fatalf("allocation %+v: want MTU %d, endpoint [%s]:%d, member %s", a1, DefaultEncapMTU-EncapIPv6Overhead, relay6, DefaultEncapPort, member)
	}
	dev := fmt.Sprintf("%s%d", EncapServerIfacePrefix, a1.VNI)
	if out := nsRun(t, tp.relay, "ip", "-d", "link", "show", "dev", dev); !strings.Contains(out, "remote "+member.String()) ||
		!strings.Contains(out, "local "+relay6.String()) || !strings.Contains(out, fmt.Sprintf("mtu %d", a1.MTU)) {
		t.Fatalf("relay device %s is not IPv6 %s -> %s with mtu %d:\n%s", dev, relay6, member, a1.MTU, out)
	}
	out := nsRun(t, tp.relay, "nft", "list", "table", "ip6", EncapTableName)
	t.Logf("relay ip6 table:\n%s", out)
	if !strings.Contains(out, "ip6 saddr "+member.String()+" udp dport 4789") {
		t.Fatalf("ip6 table does not admit the member:\n%s", out)
	}
	// An IPv4 member beside it: the ip table keeps its own filter.
	if _, err := srv.Open(k2, netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("198.18.2.1")); err != nil {
		t.Fatal(err)
	}
	if out := nsRun(t, tp.relay, "nft", "list", "table", "ip", EncapTableName); !strings.Contains(out, "ip saddr 198.18.2.2 udp dport 4789") {
		t.Fatalf("ip table lacks the IPv4 member:\n%s", out)
	}
	if err := srv.Remove(k2); err != nil {
		t.Fatal(err)
	}

	c1 := newEncapClient(t, tp.c1, 0, a1)
	if out := nsRun(t, tp.c1, "ip", "-d", "link", "show", "dev", c1.Iface()); !strings.Contains(out, "remote "+relay6.String()) {
		t.Fatalf("client device is not toward %s:\n%s", relay6, out)
	}
	echo := echoServer(t, tp.server, serverAddr, false)
	seen, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 5*time.Second)
	if err != nil {
		t.Fatalf("through vxlan over IPv6: %v", err)
	}
	if !strings.HasPrefix(seen, relayUplink.String()+":") {
		t.Errorf("server saw %s, want the relay's %s (masquerade)", seen, relayUplink)
	}
	// The VXLAN packets really crossed IPv6: the member's accept rule in
	// the ip6 table counted them.
	if n := ruleCount(t, tp.relay, "ip6", "ip6 saddr "+member.String()+" "); n == "0" {
		t.Errorf("the member's ip6 accept rule counted no packets")
	}
	conn, err := dial(t, tp.c1, c1.Address(), echo, false, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ss := nsRun(t, tp.c1, "ss", "-tni", "src", c1.Address().String())
	conn.Close()
	if mss := a1.MTU - 40; !strings.Contains(ss, fmt.Sprintf("mss:%d", mss)) && !strings.Contains(ss, fmt.Sprintf("mss:%d", mss-12)) {
		t.Errorf("client MSS through a %d-byte vxlan over IPv6 not %d:\n%s", a1.MTU, mss, ss)
	}

	// c2 is not the member: it sends the member's VNI from its own IPv6
	// address to the relay. The ip6 table drops it at input.
	spoof := a1
	spoof.Member = netip.MustParseAddr("2001:db8:72::2")
	spoof.Endpoint = netip.MustParseAddrPort("[2001:db8:72::1]:4789")
	c2 := newEncapClient(t, tp.c2, 0, spoof)
	// Counters: what the device received beyond what the member's accept
	// rule let in (the member's own late packets, e.g. of the closed
	// connection above, may arrive meanwhile) came from elsewhere.
	memberRule := "ip6 saddr " + member.String() + " "
	before, rx, acc := dropCountIn(t, tp.relay, "ip6"), rxPackets(t, tp.relay, dev), ruleCount(t, tp.relay, "ip6", memberRule)
	if _, err := exchange(t, tp.c2, c2.Address(), echo, 10, time.Second); err == nil {
		t.Fatal("a non-member's packets with the member's VNI over IPv6 reached the server")
	}
	if after := dropCountIn(t, tp.relay, "ip6"); after == before {
		t.Errorf("ip6 drop counter unchanged (%s): packets not dropped by the source filter", after)
	}
	if got, member := delta(t, rx, rxPackets(t, tp.relay, dev)), delta(t, acc, ruleCount(t, tp.relay, "ip6", memberRule)); got > member {
		t.Errorf("the member's device received %d packets during the spoof, the member's rule admitted %d: not dropped at input", got, member)
	}
	// The member still passes after the spoofing attempt.
	if _, err := exchange(t, tp.c1, c1.Address(), echo, 1000, 2*time.Second); err != nil {
		t.Fatalf("member after the spoof: %v", err)
	}
	// The filter is what stops it: without the ip6 table the kernel's
	// VXLAN device takes the same packets from any source (this poisons
	// the member's tunnel, so it comes last).
	nsRun(t, tp.relay, "nft", "delete", "table", "ip6", EncapTableName)
	rx = rxPackets(t, tp.relay, dev)
	exchange(t, tp.c2, c2.Address(), echo, 10, time.Second)
	if after := rxPackets(t, tp.relay, dev); after == rx {
		t.Errorf("without the ip6 table the spoofed packets did not arrive either: the drop above proves nothing")
	}
	c1.Close()
	c2.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{tp.c1, tp.c2, tp.relay} {
		assertEncapClean(t, ns)
	}

	// 590 leaves 570 over IPv6: IPv6 members refused, nothing left.
	small := newEncapServer(t, tp, func(c *EncapServerConfig) { c.MTU = 590 })
	if _, err := small.Open(k1, member, relay6); err == nil || !strings.Contains(err.Error(), "below 576") {
		t.Fatalf("MTU 590 over IPv6: %v", err)
	}
	if err := small.Close(); err != nil {
		t.Fatal(err)
	}
	assertEncapClean(t, tp.relay)
}

// ruleCount is the packet counter of the input-chain rule of table family
// whose line contains match.
func ruleCount(t *testing.T, ns, family, match string) string {
	t.Helper()
	out := nsRun(t, ns, "nft", "list", "chain", family, EncapTableName, "input")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, match) {
			f := strings.Fields(l)
			for i := range f {
				if f[i] == "packets" && i+1 < len(f) {
					return f[i+1]
				}
			}
		}
	}
	t.Fatalf("no rule with %q in:\n%s", match, out)
	return ""
}

// rxPackets reads dev's received-packets counter in ns.
func rxPackets(t *testing.T, ns, dev string) string {
	t.Helper()
	return strings.TrimSpace(nsRun(t, ns, "cat", "/sys/class/net/"+dev+"/statistics/rx_packets"))
}

func delta(t *testing.T, before, after string) int {
	t.Helper()
	b, err1 := strconv.Atoi(before)
	a, err2 := strconv.Atoi(after)
	if err1 != nil || err2 != nil {
		t.Fatalf("counters %q, %q", before, after)
	}
	return a - b
}
