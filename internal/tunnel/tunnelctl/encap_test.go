package tunnelctl

import (
	"context"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// TestControlChannelEncap: `mpdetour relay` with kinds [wireguard, vxlan]
// and a vxlan subnet6 serves a member's encap request; OpenEncap asks for
// the IPv6 inside and configures it beside IPv4 (the relay's grant, the
// client's rule); the request of clients before the IPv6 inside (no flag)
// gets the IPv4 shape alone; IPv4 through the tunnel reaches the server
// masqueraded; a non-member gets nothing; release and SIGTERM leave
// nothing.
func TestControlChannelEncap(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLine(t, "  kinds: [wireguard, vxlan]\n  vxlan: {subnet: 100.89.0.0/16, subnet6: 'fd64:89::/64', lease: 30s}\n")
	conn := ln.dial(ln.member)
	var c *tunnel.EncapClient
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err = OpenEncap(ctx, conn, tunnel.EncapClientConfig{Netns: ln.cl, Index: 0})
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("encap over the control channel: %v", err)
	}
	defer c.Close()
	if !netip.MustParsePrefix("100.89.0.0/16").Contains(c.Address()) {
		t.Fatalf("address %s not from the vxlan subnet", c.Address())
	}
	if !netip.MustParsePrefix("fd64:89::/64").Contains(c.Address6()) {
		t.Fatalf("inner IPv6 address %v not from the vxlan subnet6", c.Address6())
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.cl, "-6", "rule"); !strings.Contains(out, "from "+c.Address6().String()+" lookup 53000") {
		t.Fatalf("client has no IPv6 rule for %v:\n%s", c.Address6(), out)
	}
	gctx, gcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer gcancel()
	if old, _, err := conn.Encap(gctx); err != nil || old.ClientPrefix6.IsValid() || old.Gateway6.IsValid() || old.ClientPrefix.Addr() != c.Address() {
		t.Fatalf("request without the IPv6 flag: %+v %v, want %v and no IPv6 inside", old, err, c.Address())
	}
	if g6, _, err := conn.EncapIPv6(gctx); err != nil || g6.ClientPrefix6.Addr() != c.Address6() || g6.Gateway6 != netip.MustParseAddr("fd64:89::1") {
		t.Fatalf("request with the IPv6 flag: %+v %v, want %v via fd64:89::1", g6, err, c.Address6())
	}

	seen, err := seenThrough(t, ln, "tcp4", "203.0.113.10:0", c.Address(), "")
	if !strings.HasPrefix(seen, "203.0.113.1:") {
		t.Fatalf("through vxlan the server saw %q (err %v), want the relay 203.0.113.1", seen, err)
	}

	// A non-member: the control handshake is refused, no tunnel.
	sctx, scancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer scancel()
	if sc, err := OpenEncap(sctx, ln.dial(ln.stranger), tunnel.EncapClientConfig{Netns: ln.cl, Index: 1}); err == nil {
		sc.Close()
		t.Fatal("a non-member got a vxlan tunnel")
	}

	// Release: the relay removes the member's device.
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer rcancel()
	if err := conn.EncapRelease(rctx); err != nil {
		t.Fatal(err)
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.rl, "-o", "link"); strings.Contains(out, tunnel.EncapServerIfacePrefix) {
		t.Errorf("device left after release:\n%s", out)
	}
	// Again, then SIGTERM: nothing left.
	octx, ocancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer ocancel()
	if _, _, err := conn.Encap(octx); err != nil {
		t.Fatal(err)
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.rl, "-o", "link"); !strings.Contains(out, tunnel.EncapServerIfacePrefix) {
		t.Errorf("no device after a new request:\n%s", out)
	}
	ln.cmd.Process.Signal(syscall.SIGTERM)
	if err := ln.cmd.Wait(); err != nil {
		t.Errorf("relay exit: %v", err)
	}
	if out := netnstest.MustRun(t, "ip", "-n", ln.rl, "-o", "link"); strings.Contains(out, tunnel.IfacePrefix) {
		t.Errorf("relay left an interface:\n%s", out)
	}
	if out := netnstest.MustRun(t, "ip", "netns", "exec", ln.rl, "nft", "list", "tables"); strings.Contains(out, tunnel.EncapTableName) {
		t.Errorf("relay left its encap table:\n%s", out)
	}
}
