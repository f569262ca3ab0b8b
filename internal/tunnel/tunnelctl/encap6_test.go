package tunnelctl

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// TestControlChannelEncapOverIPv6: `mpdetour relay` with kinds
// [wireguard, vxlan] and listen6 serves the encap request of a member
// whose control session runs over IPv6: the grant names the relay's and
// the member's IPv6 addresses and an MTU 20 bytes below the IPv4 one,
// the client's VXLAN device runs over IPv6 (inside IPv4 only: the relay
// has no vxlan subnet6, which the client logs once), TCP from the inner (IPv4)
// address reaches the server masqueraded, counted by the relay's ip6
// member rule. SIGTERM leaves no device and neither table.
func TestControlChannelEncapOverIPv6(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLineTop(t, "te6", "listen6: '[::]:45673'\n", "  allow_destinations: [203.0.113.10/32]\n",
		"  kinds: [wireguard, vxlan]\n  vxlan: {subnet: 100.89.0.0/16, lease: 30s}\n")
	for ns, dev := range map[string]string{ln.cl: "r0", ln.rl: "c0"} {
		for _, k := range []string{"all", "default", dev} {
			netnstest.MustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf."+k+".disable_ipv6=0")
		}
	}
	netnstest.MustRun(t, "ip", "-n", ln.cl, "addr", "add", "fd00:e6::2/64", "dev", "r0", "nodad")
	netnstest.MustRun(t, "ip", "-n", ln.rl, "addr", "add", "fd00:e6::1/64", "dev", "c0", "nodad")
	relay6 := netip.MustParseAddrPort("[fd00:e6::1]:45673")
	conn, err := relayconn.Dial(relayconn.Relay{Name: "r6", Addr: relay6, PublicKey: ln.relayPub}, ln.member,
		relayconn.Options{ListenPacket: func() (net.PacketConn, error) {
			var pc net.PacketConn
			err := netnstest.DoNamed(ln.cl, func() (err error) { pc, err = net.ListenPacket("udp6", "[::]:0"); return err })
			return pc, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	var g proto.EncapGrant
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		g, _, err = conn.Encap(ctx)
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("encap over an IPv6 control session: %v", err)
	}
	if g.Endpoint.Addr() != relay6.Addr() || g.Member != netip.MustParseAddr("fd00:e6::2") || g.MTU != tunnel.DefaultEncapMTU-tunnel.EncapIPv6Overhead {
		t.Fatalf("grant %+v: want endpoint %s, member fd00:e6::2, MTU %d", g, relay6.Addr(), tunnel.DefaultEncapMTU-tunnel.EncapIPv6Overhead)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	var logs bytes.Buffer
	c, err := OpenEncap(ctx, conn, tunnel.EncapClientConfig{Netns: ln.cl, Index: 0, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The relay has no vxlan subnet6: IPv4 inside only, said once.
	if c.Address6().IsValid() || strings.Count(logs.String(), "IPv4 only") != 1 || !strings.Contains(logs.String(), "no vxlan subnet6") {
		t.Fatalf("relay without vxlan subnet6: inner IPv6 %v, log:\n%s\nwant none and one line saying IPv4 only", c.Address6(), logs.String())
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.cl, "-d", "link", "show", "dev", c.Iface()); !strings.Contains(out, "remote fd00:e6::1") {
		t.Fatalf("client device not toward the relay's IPv6 address:\n%s", out)
	}

	seen, err := seenThrough(t, ln, "tcp4", "203.0.113.10:0", c.Address(), "")
	if !strings.HasPrefix(seen, "203.0.113.1:") {
		t.Fatalf("through vxlan over IPv6 the server saw %q (err %v), want the relay 203.0.113.1", seen, err)
	}
	out := netnstest.MustRun(t, "ip", "netns", "exec", ln.rl, "nft", "list", "chain", "ip6", tunnel.EncapTableName, "input")
	var counted bool
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "ip6 saddr fd00:e6::2 ") && strings.Contains(line, "accept") && !strings.Contains(line, "packets 0 ") {
			counted = true
		}
	}
	if !counted {
		t.Fatalf("the relay's ip6 member rule counted nothing: the tunnel did not run over IPv6:\n%s", out)
	}

	ln.cmd.Process.Signal(syscall.SIGTERM)
	if err := ln.cmd.Wait(); err != nil {
		t.Errorf("relay exit: %v", err)
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.rl, "-o", "link"); strings.Contains(out, tunnel.IfacePrefix) {
		t.Errorf("relay left an interface:\n%s", out)
	}
	if out := netnstest.MustRun(t, "ip", "netns", "exec", ln.rl, "nft", "list", "tables"); strings.Contains(out, tunnel.EncapTableName) {
		t.Errorf("relay left an encap table:\n%s", out)
	}
}

// seenThrough starts a server listening on network/listen in ln's server
// namespace that answers each connection with the peer address it sees,
// and dials it over network from local in the client namespace until an
// answer starting with want comes (any answer when want is ""), for 10 s;
// it returns the last answer and error.
func seenThrough(t *testing.T, ln *line, network, listen string, local netip.Addr, want string) (seen string, err error) {
	t.Helper()
	var l net.Listener
	if err := netnstest.DoNamed(ln.sv, func() (err error) { l, err = net.Listen(network, listen); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	netnstest.Serve(l, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		c.Close()
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var tc net.Conn
		err = netnstest.DoNamed(ln.cl, func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
			tc, err = d.Dial(network, l.Addr().String())
			return err
		})
		if err == nil {
			seen, err = bufio.NewReader(tc).ReadString('\n')
			tc.Close()
			if err == io.EOF {
				err = nil
			}
			if err == nil && strings.HasPrefix(seen, want) {
				return seen, nil
			}
		}
	}
	return seen, err
}
