package pathcheck

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// Topology (namespaces pc<role>-<pid>-<n>):
//
//	cl ──A 192.0.2.0/24── rt ──B 198.51.100.0/24── srv (198.51.100.10)      default path
//	cl ──C 198.18.1.0/24── mb ──D 198.18.2.0/24── relay ──E 203.0.113.0/24── srv
//
// mb is a middlebox that overwrites every MPTCP option with NOPs
// (nftables "reset tcp option mptcp"); relay DNATs 198.18.2.2:4000 to the
// server (a NAT detour, as the relay's nftables map does) and is a
// WireGuard tunnel endpoint (internal/tunnel, the product's tunnel detour)
// whose UDP carries the options through mb untouched.
type world struct {
	cl, rt, mb, relay, srv *netnstest.NS
	server                 netip.AddrPort // on the default path
	nat                    netip.AddrPort // the NAT detour
	tunnelAddr             netip.Addr     // the client's tunnel address
}

const serverPort = 8080

var (
	srvAddr   = netip.MustParseAddr("198.51.100.10")
	relayAddr = netip.MustParseAddr("198.18.2.2")
)

func build(t *testing.T, withTunnel bool) *world {
	t.Helper()
	testenv.MPTCP(t)
	testenv.Tools(t, "nft", "ip")
	w := &world{
		cl: netnstest.New(t, "pccl"), rt: netnstest.New(t, "pcrt"), mb: netnstest.New(t, "pcmb"),
		relay: netnstest.New(t, "pcrl"), srv: netnstest.New(t, "pcsv"),
	}
	netnstest.LinkNamed(t, w.cl, "A", "192.0.2.2/24", w.rt, "A", "192.0.2.1/24")
	netnstest.LinkNamed(t, w.rt, "B", "198.51.100.1/24", w.srv, "B", "198.51.100.10/24")
	netnstest.LinkNamed(t, w.cl, "C", "198.18.1.2/24", w.mb, "C", "198.18.1.1/24")
	netnstest.LinkNamed(t, w.mb, "D", "198.18.2.1/24", w.relay, "D", "198.18.2.2/24")
	netnstest.LinkNamed(t, w.relay, "E", "203.0.113.1/24", w.srv, "E", "203.0.113.10/24")
	w.cl.Route(t, "0.0.0.0/0", "192.0.2.1")
	w.cl.Route(t, "198.18.2.0/24", "198.18.1.1")
	w.srv.Route(t, "0.0.0.0/0", "198.51.100.1")
	w.relay.Route(t, "0.0.0.0/0", "198.18.2.1")
	w.relay.Route(t, "198.51.100.0/24", "203.0.113.10")
	for _, ns := range []*netnstest.NS{w.rt, w.mb, w.relay} {
		if err := ns.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
			t.Fatal(err)
		}
	}
	// The stripping middlebox.
	nft(t, w.mb, `table inet mpstrip {
		chain strip {
			type filter hook forward priority 0; policy accept;
			reset tcp option mptcp
		}
	}`)
	// The NAT detour: DNAT to the server, SNAT to the relay's uplink.
	nft(t, w.relay, fmt.Sprintf(`table ip natdetour {
		chain pre { type nat hook prerouting priority dstnat; tcp dport 4000 ip daddr %s dnat to 203.0.113.10:%d; }
		chain post { type nat hook postrouting priority srcnat; oifname "E" ip daddr 203.0.113.10 masquerade; }
	}`, relayAddr, serverPort))
	w.server = netip.AddrPortFrom(srvAddr, serverPort)
	w.nat = netip.AddrPortFrom(relayAddr, 4000)
	// An MPTCP server on every address of srv.
	var ln net.Listener
	err := w.srv.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp4", fmt.Sprintf("0.0.0.0:%d", serverPort))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { defer c.Close(); _, _ = io.Copy(c, c) })
	if withTunnel {
		w.tunnelAddr = startTunnel(t, w)
	}
	return w
}

func runStdin(ns, stdin string, argv ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func nft(t *testing.T, ns *netnstest.NS, ruleset string) {
	t.Helper()
	if out, err := runStdin(ns.Name, ruleset, "nft", "-f", "-"); err != nil {
		t.Fatalf("nft in %s: %v\n%s", ns.Name, err, out)
	}
}

// startTunnel brings up a WireGuard tunnel detour cl -> relay (through mb)
// and waits until it carries a connection.
func startTunnel(t *testing.T, w *world) netip.Addr {
	t.Helper()
	rk, _ := wgtypes.GeneratePrivateKey()
	ck, _ := wgtypes.GeneratePrivateKey()
	s, err := tunnel.NewServer(tunnel.ServerConfig{Netns: w.relay.Name, Subnet: netip.MustParsePrefix("100.80.0.0/24"),
		ListenPort: 51820, PrivateKey: rk, MTU: 1380})
	if err != nil {
		t.Fatalf("tunnel server: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	a, err := s.Offer(ck.PublicKey(), relayAddr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tunnel.NewClient(tunnel.ClientConfig{Netns: w.cl.Name, Relay: "relay", Index: 0, PrivateKey: ck, Allocation: a})
	if err != nil {
		t.Fatalf("tunnel client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := dial(w.cl, c.Address(), w.server, false)
		if err == nil {
			conn.Close()
			return c.Address()
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunnel never carried a connection: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dial(ns *netnstest.NS, local netip.Addr, dst netip.AddrPort, mptcp bool) (*net.TCPConn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		d.SetMultipathTCP(mptcp)
		if local.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
		}
		var err error
		c, err = d.Dial("tcp4", dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

func find(t *testing.T, rep *Report, name string) PathResult {
	t.Helper()
	for _, p := range rep.Paths {
		if p.Path.Name == name {
			return p
		}
	}
	t.Fatalf("no path %q in report", name)
	return PathResult{}
}

// TestStrippingDetected: the default path and the tunnel detour are
// clean, the NAT detour through the middlebox loses MP_CAPABLE between
// hop 1 (mb, which quotes it intact: routers quote before forwarding) and
// hop 2 (the relay, which quotes what mb let through); MP_JOIN likewise.
// An MPTCP connection through the NAT detour falls back to TCP, one
// through the tunnel stays MPTCP.
func TestStrippingDetected(t *testing.T) {
	w := build(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Run(ctx, Options{Netns: w.cl.Name, MaxTTL: 6, Wait: 700 * time.Millisecond, Join: true, Paths: []Path{
		{Name: "default", Kind: Default, Dst: w.server},
		{Name: "nat:relay", Kind: NAT, Dst: w.nat},
		{Name: "tunnel:relay", Kind: Tunnel, Dst: w.server, Src: w.tunnelAddr},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Paths {
		t.Logf("%s: %s: %s", p.Path.Name, p.Verdict, p.Detail)
		for _, pr := range p.Probes {
			for _, h := range pr.Hops {
				t.Logf("  %s ttl %d %v %s %v", pr.Probe, h.TTL, h.From, h.MPTCP, h.Changes)
			}
			if pr.Final != nil {
				t.Logf("  %s end %v %s %s %v", pr.Probe, pr.Final.From, pr.Final.Flags, pr.Final.MPTCP, pr.Final.Options)
			}
		}
	}

	def := find(t, rep, "default")
	if def.Verdict != OK {
		t.Errorf("default path: %s (%s), want ok", def.Verdict, def.Detail)
	}
	c := def.Probes[0]
	if len(c.Hops) != 1 || c.Hops[0].From != netip.MustParseAddr("192.0.2.1") || c.Hops[0].MPTCP != Intact || len(c.Hops[0].Changes) != 0 {
		t.Errorf("default path hops: %+v, want one hop 192.0.2.1 with everything intact", c.Hops)
	}
	if c.Final == nil || c.Final.From != w.server || c.Final.Flags != "SA" || c.Final.MPTCP != "MP_CAPABLE" {
		t.Errorf("default path end: %+v, want SYN/ACK with MP_CAPABLE from %v", c.Final, w.server)
	}
	if j := def.Probes[1]; len(j.Hops) != 1 || j.Hops[0].MPTCP != Intact || j.Final == nil || !strings.Contains(j.Final.Flags, "R") {
		t.Errorf("default path MP_JOIN probe: %+v, want intact at hop 1 and a reset from the server (unknown token)", j)
	}

	nat := find(t, rep, "nat:relay")
	if nat.Verdict != Stripped {
		t.Errorf("NAT detour: %s (%s), want %s", nat.Verdict, nat.Detail, Stripped)
	}
	for _, pr := range nat.Probes {
		if pr.LostAfter != 1 || pr.LostAt != 2 || pr.LostHow != Removed {
			t.Errorf("NAT detour %s: lost after hop %d at hop %d (%s), want removed between hop 1 and 2", pr.Probe, pr.LostAfter, pr.LostAt, pr.LostHow)
		}
		if len(pr.Hops) < 2 || pr.Hops[0].From != netip.MustParseAddr("198.18.1.1") || pr.Hops[1].From != netip.MustParseAddr("198.18.2.2") {
			t.Errorf("NAT detour %s hops: %+v, want mb then relay", pr.Probe, pr.Hops)
		}
	}
	if f := nat.Probes[0].Final; f == nil || f.Flags != "SA" || f.MPTCP != "" {
		t.Errorf("NAT detour end: %+v, want a plain SYN/ACK", f)
	}

	tun := find(t, rep, "tunnel:relay")
	if tun.Verdict != OK {
		t.Errorf("tunnel detour: %s (%s), want ok", tun.Verdict, tun.Detail)
	}
	if tun.Path.Src != w.tunnelAddr {
		t.Errorf("tunnel probes left from %v, want %v", tun.Path.Src, w.tunnelAddr)
	}

	// The kernel's own view: MPTCP through the NAT detour falls back,
	// through the tunnel it does not.
	for _, x := range []struct {
		name  string
		local netip.Addr
		dst   netip.AddrPort
		want  bool
	}{{"nat", netip.Addr{}, w.nat, false}, {"tunnel", w.tunnelAddr, w.server, true}, {"default", netip.Addr{}, w.server, true}} {
		c, err := dial(w.cl, x.local, x.dst, true)
		if err != nil {
			t.Errorf("%s: MPTCP connect: %v", x.name, err)
			continue
		}
		mp, err := c.MultipathTCP()
		c.Close()
		if err != nil || mp != x.want {
			t.Errorf("%s: connection MPTCP = %v (%v), want %v", x.name, mp, err, x.want)
		}
	}
}

// TestCleanPath: without the middlebox's rule the same NAT detour is
// reported clean (the detection is the middlebox's doing, not the NAT's),
// and its hops show the relay's address translation nowhere (conntrack
// translates the quotes back).
func TestCleanPath(t *testing.T) {
	w := build(t, false)
	netnstest.MustRun(t, "ip", "netns", "exec", w.mb.Name, "nft", "delete", "table", "inet", "mpstrip")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Run(ctx, Options{Netns: w.cl.Name, MaxTTL: 6, Wait: 700 * time.Millisecond, Paths: []Path{
		{Name: "nat:relay", Kind: NAT, Dst: w.nat},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Paths[0]
	if p.Verdict != OK {
		t.Fatalf("clean NAT detour: %s (%s), want ok", p.Verdict, p.Detail)
	}
	for _, h := range p.Probes[0].Hops {
		if h.MPTCP != Intact {
			t.Errorf("hop %d: mptcp %s, want intact", h.TTL, h.MPTCP)
		}
	}
	if len(p.Probes[0].Hops) != 2 {
		t.Errorf("hops: %+v, want mb and relay", p.Probes[0].Hops)
	}
	// A closed port is reported as such, not as stripping.
	rep, err = Run(ctx, Options{Netns: w.cl.Name, NoTTL: true, Wait: 700 * time.Millisecond, Paths: []Path{
		{Name: "closed", Kind: Default, Dst: netip.AddrPortFrom(srvAddr, 9)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v := rep.Paths[0].Verdict; v != Closed {
		t.Errorf("closed port: %s (%s), want %s", v, rep.Paths[0].Detail, Closed)
	}
}

// TestFilterInNamespaces: the agent's filter (path_check: true) with real
// probes withholds the NAT detour through the stripping middlebox and
// keeps it once the middlebox stops stripping.
func TestFilterInNamespaces(t *testing.T) {
	w := build(t, false)
	d := detour.Detour{Kind: detour.NAT, Relay: "relay", Remote: w.nat}
	verdict := func() (string, bool) { return filterVerdict(t, w.cl.Name, d, w.server) }
	if why, bad := verdict(); !bad {
		t.Errorf("NAT detour through the stripping middlebox kept (%q)", why)
	} else {
		t.Logf("withheld: %s", why)
	}
	netnstest.MustRun(t, "ip", "netns", "exec", w.mb.Name, "nft", "delete", "table", "inet", "mpstrip")
	if why, bad := verdict(); bad {
		t.Errorf("clean NAT detour withheld: %s", why)
	}
}

// filterVerdict runs the agent's filter (path_check: true) with real
// probes from netns over the one detour d toward server, polls until its
// check is done (5 s at most) and returns what Unusable says.
func filterVerdict(t *testing.T, netns string, d detour.Detour, server netip.AddrPort) (string, bool) {
	t.Helper()
	f := NewFilter(&listSource{ds: []detour.Detour{d}}, FilterConfig{Netns: netns, Wait: 700 * time.Millisecond})
	defer f.Close()
	f.Prepare(server)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		e := f.state[d.Remote]
		done := e != nil && e.done
		f.mu.Unlock()
		if done {
			why, bad := f.Unusable(d)
			if got := f.Detours(server); bad == (len(got) == 1) {
				t.Errorf("Detours %v disagrees with Unusable %v", got, bad)
			}
			return why, bad
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("check never finished")
	return "", false
}
