package tunnelctl

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// TestTunnelOverIPv6: a member whose control session reaches the relay
// over IPv6 (listen6) gets a WireGuard tunnel whose endpoint is the
// relay's IPv6 address, and IPv4 traffic inside the tunnel reaches an IPv4
// server through the relay: an IPv4 subflow on an IPv6 path. (Tunnel
// addresses are IPv4; docs/relay.md, "IPv6".)
func TestTunnelOverIPv6(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLineTop(t, "tv6", "listen6: '[::]:45673'\n", "  allow_destinations: [203.0.113.10/32]\n")
	for ns, dev := range map[string]string{ln.cl: "r0", ln.rl: "c0"} {
		for _, k := range []string{"all", "default", dev} {
			netnstest.MustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf."+k+".disable_ipv6=0")
		}
	}
	netnstest.MustRun(t, "ip", "-n", ln.cl, "addr", "add", "fd00:c::2/64", "dev", "r0", "nodad")
	netnstest.MustRun(t, "ip", "-n", ln.rl, "addr", "add", "fd00:c::1/64", "dev", "c0", "nodad")
	relay6 := netip.MustParseAddrPort("[fd00:c::1]:45673")

	dial6 := func(priv proto.Key) *relayconn.Conn {
		c, err := relayconn.Dial(relayconn.Relay{Name: "r6", Addr: relay6, PublicKey: ln.relayPub}, priv,
			relayconn.Options{ListenPacket: func() (net.PacketConn, error) {
				var pc net.PacketConn
				err := netnstest.DoNamed(ln.cl, func() (err error) { pc, err = net.ListenPacket("udp6", "[::]:0"); return err })
				return pc, err
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	// The grant over IPv6 names the relay's IPv6 address as endpoint.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var g proto.TunnelGrant
	var err error
	for ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		g, _, err = dial6(ln.member).Tunnel(rctx)
		rcancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("tunnel grant over IPv6: %v", err)
	}
	if g.Endpoint.Addr() != netip.MustParseAddr("fd00:c::1") || !g.ClientPrefix.Addr().Is4() {
		t.Fatalf("grant over IPv6: endpoint %v, address %v; want [fd00:c::1]:port and an IPv4 tunnel address", g.Endpoint, g.ClientPrefix)
	}

	client, err := Open(ctx, dial6(ln.member), tunnel.ClientConfig{Netns: ln.cl, Index: 0, PrivateKey: wgtypes.Key(ln.member)})
	if err != nil {
		t.Fatalf("tunnel over IPv6: %v", err)
	}
	defer client.Close()

	before := udp6Out(t, ln.cl)
	seen, err := seenThrough(t, ln, "tcp4", "203.0.113.10:0", client.Address(), "203.0.113.1:")
	if !strings.HasPrefix(seen, "203.0.113.1:") {
		t.Fatalf("through the tunnel over IPv6 the server saw %q (err %v), want the relay 203.0.113.1", seen, err)
	}
	// The WireGuard packets went over IPv6: the TCP connection through the
	// tunnel (and nothing else: the control session is idle) made the
	// client send IPv6 UDP datagrams.
	if after := udp6Out(t, ln.cl); after-before < 3 {
		t.Fatalf("client sent %d IPv6 UDP datagrams while talking through the tunnel: the tunnel did not run over IPv6", after-before)
	}
}

// udp6Out is the namespace's Udp6OutDatagrams counter.
func udp6Out(t *testing.T, ns string) int {
	t.Helper()
	out := netnstest.MustRun(t, "ip", "netns", "exec", ns, "cat", "/proc/net/snmp6")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Udp6OutDatagrams" {
			var n int
			fmt.Sscan(f[1], &n)
			return n
		}
	}
	t.Fatalf("no Udp6OutDatagrams in /proc/net/snmp6 of %s", ns)
	return 0
}

// TestTunnelIPv6AddressOverControl: a relay whose tunnel section has
// subnet6 answers a tunnel request that asks for IPv6 with both addresses
// (the IPv6 one at the IPv4 one's host offset) and a request that does not
// ask (every earlier client) with the IPv4 shape only.
func TestTunnelIPv6AddressOverControl(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLineTop(t, "ta6", "", "  allow_destinations: [203.0.113.10/32]\n", "  subnet6: 'fd64:1::/64'\n")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var g proto.TunnelGrant
	var err error
	for ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		g, _, err = ln.dial(ln.member).TunnelIPv6(rctx)
		rcancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("tunnel request with IPv6: %v", err)
	}
	want := netip.MustParsePrefix("fd64:1::/64")
	a4 := g.ClientPrefix.Addr().As4()
	a6 := g.ClientPrefix6.Addr().As16()
	if !want.Contains(g.ClientPrefix6.Addr()) || g.ClientPrefix6.Bits() != 64 || a6[14] != a4[2] || a6[15] != a4[3] {
		t.Fatalf("grant %v / %v: want the IPv4 host offset in %v", g.ClientPrefix, g.ClientPrefix6, want)
	}
	old, _, err := ln.dial(ln.member).Tunnel(ctx)
	if err != nil || old.ClientPrefix6.IsValid() || old.ClientPrefix != g.ClientPrefix {
		t.Fatalf("tunnel request without IPv6: %v / %v (%v), want %v alone", old.ClientPrefix, old.ClientPrefix6, err, g.ClientPrefix)
	}
	if out := netnstest.MustRun(t, "ip", "netns", "exec", ln.rl, "nft", "list", "table", "ip6", tunnel.TableName); !strings.Contains(out, "masquerade") {
		t.Fatalf("no ip6 tunnel table:\n%s", out)
	}
}

// TestOpenIPv6Inside: Open asks for an IPv6 tunnel address; against a
// relay with subnet6 the client configures it (address, rule, route,
// allowed IP) and an IPv6 connection from it reaches an IPv6 server
// through the tunnel, masqueraded to the relay's IPv6 address, beside
// IPv4. Close removes the client's IPv6 rule.
func TestOpenIPv6Inside(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLineTop(t, "to6", "", "  allow_destinations: [203.0.113.10/32, 'fd00:5::10/128']\n", "  subnet6: 'fd64:1::/64'\n")
	for ns, dev := range map[string]string{ln.rl: "s0", ln.sv: "r0"} {
		for _, k := range []string{"all", "default", dev} {
			netnstest.MustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf."+k+".disable_ipv6=0")
		}
	}
	netnstest.MustRun(t, "ip", "-n", ln.rl, "addr", "add", "fd00:5::1/64", "dev", "s0", "nodad")
	netnstest.MustRun(t, "ip", "-n", ln.sv, "addr", "add", "fd00:5::10/64", "dev", "r0", "nodad")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var client *tunnel.Client
	var err error
	for ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		client, err = Open(rctx, ln.dial(ln.member), tunnel.ClientConfig{Netns: ln.cl, Index: 0, PrivateKey: wgtypes.Key(ln.member)})
		rcancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer client.Close()
	a6 := client.Address6()
	if !netip.MustParsePrefix("fd64:1::/64").Contains(a6) {
		t.Fatalf("client IPv6 tunnel address %v, want one in fd64:1::/64", a6)
	}
	seen, err := seenThrough(t, ln, "tcp6", "[fd00:5::10]:0", a6, "[fd00:5::1]:")
	if !strings.HasPrefix(seen, "[fd00:5::1]:") {
		t.Fatalf("IPv6 through the tunnel: server saw %q (%v), want the relay's fd00:5::1", seen, err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.cl, "-6", "rule"); strings.Contains(out, "lookup 52000") {
		t.Fatalf("client IPv6 rule left after Close:\n%s", out)
	}
}
