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

func TestControlChannelEncap(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLine(t, "  kinds: [wireguard, vxlan]\n  vxlan: {subnet: 100.89.0.0/16, lease: 30s}\n")
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
