package tunnelctl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

func parseSection(t *testing.T, s string) (Settings, error) {
	t.Helper()
	var top struct {
		Tunnel config.Node `yaml:"tunnel"`
	}
	if _, err := config.Parse("relay.yaml", []byte("tunnel:\n"+indent(s)), &top); err != nil {
		t.Fatal(err)
	}
	return ParseSettings(config.NewDoc("relay.yaml", "tunnel", &top.Tunnel))
}

func TestParseKinds(t *testing.T) {
	st, err := parseSection(t, "subnet: 100.90.0.0/16\n")
	if err != nil || !st.WireGuard || st.VXLAN {
		t.Errorf("default kinds: %+v %v", st, err)
	}
	st, err = parseSection(t, "kinds: [vxlan]\nvxlan: {subnet: 100.91.0.0/16, port: 4790, mtu: 1400, lease: 1m}\n")
	if err != nil || st.WireGuard || !st.VXLAN || st.Encap.Port != 4790 || st.Encap.MTU != 1400 || st.Encap.Lease != time.Minute ||
		st.Encap.Subnet != netip.MustParsePrefix("100.91.0.0/16") {
		t.Errorf("vxlan only: %+v %v", st, err)
	}
	if st, err = parseSection(t, "kinds: [wireguard, vxlan]\n"); err != nil || st.Encap.Subnet != netip.MustParsePrefix("100.81.0.0/16") {
		t.Errorf("vxlan defaults: %+v %v", st.Encap, err)
	}
	for bad, want := range map[string]string{
		"kinds: [gre]\n":                                              "relay.yaml:2:11: tunnel.kinds[0]: \"gre\" is not wireguard or vxlan",
		"kinds: [vxlan, vxlan]\n":                                     "tunnel.kinds[1]: \"vxlan\" listed twice",
		"vxlan: {port: 4789}\n":                                       "tunnel.vxlan: set, but kinds does not list vxlan",
		"kinds: [vxlan]\nvxlan: {subnet: x}\n":                        "tunnel.vxlan.subnet:",
		"kinds: [vxlan]\nvxlan: {mtu: 100}\n":                         "tunnel.vxlan.mtu: 100 out of range",
		"kinds: [vxlan]\nvxlan: {lease: 1s}\n":                        "tunnel.vxlan.lease: 1s is shorter than 10s",
		"kinds: [vxlan]\nvxlan: {port: 70000}\n":                      "tunnel.vxlan.port: 70000 out of range",
		"kinds: [vxlan]\nvxlan: {sbnet: 1.0.0.0/8}\n":                 "tunnel.vxlan.sbnet: unknown key",
		"kinds: [wireguard, vxlan]\nvxlan: {subnet: 100.80.5.0/24}\n": "overlaps the WireGuard subnet",
	} {
		if _, err := parseSection(t, bad); err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "relay.yaml:") {
			t.Errorf("%q: got %v, want a positioned error containing %q", bad, err, want)
		}
	}
}

// TestControlChannelEncap: `mpdetour relay` with kinds [wireguard, vxlan]
// serves the encap request over the Noise control channel; the member's
// VXLAN tunnel carries TCP to the server (masqueraded); a non-member gets
// nothing; release removes the relay's device; SIGTERM leaves nothing.
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

	var l net.Listener
	if err := netnstest.DoNamed(ln.sv, func() (err error) { l, err = net.Listen("tcp4", "203.0.113.10:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	netnstest.Serve(l, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		c.Close()
	})
	var seen string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var tc net.Conn
		err = netnstest.DoNamed(ln.cl, func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(c.Address(), 0))}
			tc, err = d.Dial("tcp4", l.Addr().String())
			return err
		})
		if err == nil {
			seen, err = bufio.NewReader(tc).ReadString('\n')
			tc.Close()
			if err == nil || err == io.EOF {
				break
			}
		}
	}
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

// A relay whose section does not enable vxlan refuses the request.
func TestEncapNotOffered(t *testing.T) {
	a := &Allocator{}
	_, _, err := a.Encap(proto.Key{1}, netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.1"))
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Reason != proto.ReasonUnsupported {
		t.Fatalf("got %v, want unsupported", err)
	}
}
