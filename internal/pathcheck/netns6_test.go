package pathcheck

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// TestIPv6Paths: path-check's IPv6 probes, in one run beside an IPv4
// path. Topology (namespaces pc6<role>-<pid>-<n>):
//
//	cl ──A fd31:a::/64, 192.0.2.0/24── rt ──B fd31:b::/64, 198.51.100.0/24── srv    default paths (both families)
//	cl ──C fd31:c::/64── mb ──D fd31:d::/64── relay ──E fd31:e::/64── srv           IPv6 NAT detour
//
// mb overwrites MPTCP options with NOPs; relay DNATs [fd31:d::2]:4000 to
// the server (an ip6 nat table, as the relay's IPv6 NAT detours do). The
// IPv6 default path is ok with rt quoting the probe intact at hop 1; the
// IPv6 NAT detour loses MP_CAPABLE and MP_JOIN between hop 1 (mb) and hop
// 2 (relay); the IPv4 default path in the same run is ok; the agent's
// filter (path_check: true) withholds the IPv6 NAT detour. The namespaces
// skip duplicate address detection (it holds neighbour discovery back on
// fresh links); should a probe still go unanswered, the run is repeated
// until the verdicts hold or 15 s pass (one run takes well under a second).
func TestIPv6Paths(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "nft", "ip")
	cl, rt, mb, relay, srv := netnstest.New(t, "pc6cl"), netnstest.New(t, "pc6rt"), netnstest.New(t, "pc6mb"), netnstest.New(t, "pc6rl"), netnstest.New(t, "pc6sv")
	for _, ns := range []*netnstest.NS{cl, rt, mb, relay, srv} {
		// No duplicate address detection on the links to come: a
		// tentative link-local address holds neighbour discovery back
		// for a second or two, and the first probes with it.
		if err := ns.Sysctl("net/ipv6/conf/default/accept_dad", "0"); err != nil {
			t.Fatal(err)
		}
	}
	netnstest.LinkNamed(t, cl, "A", "fd31:a::2/64", rt, "A", "fd31:a::1/64")
	cl.Addr(t, "A", "192.0.2.2/24")
	rt.Addr(t, "A", "192.0.2.1/24")
	netnstest.LinkNamed(t, rt, "B", "fd31:b::1/64", srv, "B", "fd31:b::10/64")
	rt.Addr(t, "B", "198.51.100.1/24")
	srv.Addr(t, "B", "198.51.100.10/24")
	netnstest.LinkNamed(t, cl, "C", "fd31:c::2/64", mb, "C", "fd31:c::1/64")
	netnstest.LinkNamed(t, mb, "D", "fd31:d::1/64", relay, "D", "fd31:d::2/64")
	netnstest.LinkNamed(t, relay, "E", "fd31:e::1/64", srv, "E", "fd31:e::10/64")
	cl.Route(t, "::/0", "fd31:a::1")
	cl.Route(t, "0.0.0.0/0", "192.0.2.1")
	cl.Route(t, "fd31:d::/64", "fd31:c::1")
	srv.Route(t, "::/0", "fd31:b::1")
	srv.Route(t, "0.0.0.0/0", "198.51.100.1")
	relay.Route(t, "::/0", "fd31:d::1")
	for _, ns := range []*netnstest.NS{rt, mb, relay} {
		for _, k := range []string{"net/ipv6/conf/all/forwarding", "net/ipv4/ip_forward"} {
			if err := ns.Sysctl(k, "1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	nft(t, mb, `table inet mpstrip {
		chain strip {
			type filter hook forward priority 0; policy accept;
			reset tcp option mptcp
		}
	}`)
	nft(t, relay, `table ip6 natdetour6 {
		chain pre { type nat hook prerouting priority dstnat; tcp dport 4000 ip6 daddr fd31:d::2 dnat to [fd31:e::10]:8080; }
		chain post { type nat hook postrouting priority srcnat; oifname "E" masquerade; }
	}`)
	var ln net.Listener
	if err := srv.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", serverPort)) // both families
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { defer c.Close(); _, _ = io.Copy(c, c) })

	server6 := netip.MustParseAddrPort("[fd31:b::10]:8080")
	server4 := netip.MustParseAddrPort("198.51.100.10:8080")
	check := func(rep *Report) []string {
		var bad []string
		def := find(t, rep, "default6")
		c := def.Probes[0]
		if def.Verdict != OK || len(c.Hops) != 1 || c.Hops[0].From != netip.MustParseAddr("fd31:a::1") || c.Hops[0].MPTCP != Intact || len(c.Hops[0].Changes) != 0 ||
			c.Final == nil || c.Final.From != server6 || c.Final.MPTCP != "MP_CAPABLE" {
			bad = append(bad, fmt.Sprintf("IPv6 default path: %s (%s), hops %+v, end %+v; want ok, rt intact at hop 1, MP_CAPABLE from %v", def.Verdict, def.Detail, c.Hops, c.Final, server6))
		}
		nat := find(t, rep, "nat6:relay")
		if nat.Verdict != Stripped {
			bad = append(bad, fmt.Sprintf("IPv6 NAT detour: %s (%s), want %s", nat.Verdict, nat.Detail, Stripped))
		}
		for _, pr := range nat.Probes {
			if pr.LostAfter != 1 || pr.LostAt != 2 || pr.LostHow != Removed || len(pr.Hops) < 2 ||
				pr.Hops[0].From != netip.MustParseAddr("fd31:c::1") || pr.Hops[1].From != netip.MustParseAddr("fd31:d::2") {
				bad = append(bad, fmt.Sprintf("IPv6 NAT detour %s: lost after %d at %d (%s), hops %+v; want removed between mb (hop 1) and relay (hop 2)", pr.Probe, pr.LostAfter, pr.LostAt, pr.LostHow, pr.Hops))
			}
		}
		if f := nat.Probes[0].Final; f == nil || f.Flags != "SA" || f.MPTCP != "" {
			bad = append(bad, fmt.Sprintf("IPv6 NAT detour end: %+v, want a plain SYN/ACK", f))
		}
		if d4 := find(t, rep, "default4"); d4.Verdict != OK || d4.Path.Src != netip.MustParseAddr("192.0.2.2") {
			bad = append(bad, fmt.Sprintf("IPv4 default path in the same run: %s (%s) from %v, want ok from 192.0.2.2", d4.Verdict, d4.Detail, d4.Path.Src))
		}
		return bad
	}
	deadline := time.Now().Add(15 * time.Second)
	retried := 0
	defer func() { t.Logf("probed %d times", retried+1) }()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		rep, err := Run(ctx, Options{Netns: cl.Name, MaxTTL: 3, Wait: 300 * time.Millisecond, Join: true, Paths: []Path{
			{Name: "default6", Kind: Default, Dst: server6},
			{Name: "nat6:relay", Kind: NAT, Dst: netip.MustParseAddrPort("[fd31:d::2]:4000")},
			{Name: "default4", Kind: Default, Dst: server4},
		}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		bad := check(rep)
		if len(bad) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, b := range bad {
				t.Error(b)
			}
			return
		}
		t.Logf("not yet (%d differences; first: %s); probing again", len(bad), bad[0])
		retried++
		time.Sleep(200 * time.Millisecond)
	}
	// The agent's filter (path_check: true) withholds the IPv6 NAT detour
	// the same way, with IPv6 probes.
	d6 := detour.Detour{Kind: detour.NAT, Relay: "relay", Remote: netip.MustParseAddrPort("[fd31:d::2]:4000")}
	if why, bad := filterVerdict(t, cl.Name, d6, server6); !bad {
		t.Errorf("IPv6 NAT detour through the stripping middlebox kept by the filter (%q)", why)
	}
}
