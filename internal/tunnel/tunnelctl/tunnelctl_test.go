package tunnelctl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relay/tunnels"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/relayd"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv("MPDETOUR_TEST_RELAY_CONFIG"); cfg != "" {
		// `mpdetour relay` as the binary runs it, in the namespace the test
		// started us in (ip netns exec).
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		tunnels := func(sec *config.Doc, key proto.Key, top destination.Policy, log *slog.Logger) (relay.Tunnels, error) {
			a, err := tunnels.Factory(sec, key, top, log)
			if err != nil {
				return nil, err
			}
			return a, nil
		}
		if err := relayd.Run(ctx, cfg, log, tunnels); err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestKeysShared(t *testing.T) {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if wgtypes.Key(k).PublicKey() != wgtypes.Key(k.Public()) {
		t.Fatal("a member's WireGuard public key differs from its control-protocol public key")
	}
}

// TestControlChannelTunnel: `mpdetour relay` (relayd.Run with a tunnel:
// section) serves the tunnel request; a member asks over the Noise control
// channel with relayclient and gets a working tunnel; a non-member gets
// nothing; SIGTERM leaves no tunnel state on the relay.
func TestControlChannelTunnel(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	line := newLine(t)
	cl, rl, sv, cmd, dialRelay := line.cl, line.rl, line.sv, line.cmd, line.dial
	stranger := line.stranger
	client := openTunnel(t, line, line.member)
	if !netip.MustParsePrefix("100.88.0.0/16").Contains(client.Address()) {
		t.Fatalf("client address %s not from the relay's subnet", client.Address())
	}

	// Server: say which address connected.
	var ln net.Listener
	if err := netnstest.DoNamed(sv, func() (err error) { ln, err = net.Listen("tcp4", "203.0.113.10:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		c.Close()
	})
	var seen string
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var c net.Conn
		err = netnstest.DoNamed(cl, func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(client.Address(), 0))}
			c, err = d.Dial("tcp4", ln.Addr().String())
			return err
		})
		if err == nil {
			seen, err = bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil || err == io.EOF {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.HasPrefix(seen, "203.0.113.1:") {
		t.Fatalf("through the tunnel the server saw %q (err %v), want the relay 203.0.113.1", seen, err)
	}

	out := netnstest.MustRun(t, "ip", "netns", "exec", rl, "nft", "list", "chain", "ip", tunnel.TableName, "destinations")
	for _, want := range []string{"ip daddr 203.0.113.10 accept", "ip daddr 203.0.113.0/24", "ip daddr 10.0.0.0/8"} {
		if !strings.Contains(out, want) {
			t.Errorf("tunnel policy lacks %q:\n%s", want, out)
		}
	}

	// A key that is not a member gets no tunnel: the control handshake is refused.
	sctx, scancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer scancel()
	if c, err := Open(sctx, dialRelay(stranger), tunnel.ClientConfig{Netns: cl, Index: 1, PrivateKey: wgtypes.Key(stranger)}); err == nil {
		c.Close()
		t.Fatal("a non-member got a tunnel")
	}

	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("relay exit: %v", err)
	}
	if out := netnstest.MustRun(t, "ip", "-n", rl, "-o", "link"); strings.Contains(out, tunnel.IfacePrefix) {
		t.Errorf("relay left a tunnel interface:\n%s", out)
	}
	if out := netnstest.MustRun(t, "ip", "netns", "exec", rl, "nft", "list", "tables"); strings.Contains(out, tunnel.TableName) {
		t.Errorf("relay left its tunnel table:\n%s", out)
	}
}

func keyText(k proto.Key) string { return wgtypes.Key(k).String() }

// line: client -- relay -- server; the relay runs `mpdetour relay` (this
// test binary re-executed under ip netns exec) with a tunnel: section.
type line struct {
	cl, rl, sv       string
	cmd              *exec.Cmd
	member, stranger proto.Key
	relayPub         proto.Key
	dial             func(priv proto.Key) *relayconn.Conn
	// restart kills the relay (no cleanup) and starts it again with these
	// members, keeping its key and state file.
	restart func(members ...proto.Key)
}

func newLine(t *testing.T, tunnelExtra ...string) *line {
	t.Helper()
	return newLineNamed(t, "twl", tunnelExtra...)
}

// newLineNamed is newLine with namespaces named prefix+c/r/s-...
func newLineNamed(t *testing.T, prefix string, tunnelExtra ...string) *line {
	t.Helper()
	return newLineTop(t, prefix, "", "  # the server is on one of the relay's own networks, restricted by default\n  allow_destinations: [203.0.113.10/32]\n", tunnelExtra...)
}

// newLineTop is newLineNamed with top-level lines (top) and the tunnel
// section's destination lines (tunnelPolicy) given.
func newLineTop(t *testing.T, prefix, top, tunnelPolicy string, tunnelExtra ...string) *line {
	t.Helper()
	c, r, v := netnstest.New(t, prefix+"c"), netnstest.New(t, prefix+"r"), netnstest.New(t, prefix+"s")
	cl, rl, sv := c.Name, r.Name, v.Name
	netnstest.LinkNamed(t, c, "r0", "192.0.2.2/24", r, "c0", "192.0.2.1/24")
	netnstest.LinkNamed(t, r, "s0", "203.0.113.1/24", v, "r0", "203.0.113.10/24")
	// The default path: routed (not masqueraded) by the relay namespace.
	c.Route(t, "0.0.0.0/0", "192.0.2.1")
	v.Route(t, "192.0.2.0/24", "203.0.113.1")

	relayKey, _ := proto.GenerateKey()
	member, _ := proto.GenerateKey()
	stranger, _ := proto.GenerateKey()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "relay.yaml")
	writeConfig := func(members ...proto.Key) {
		var m strings.Builder
		for i, k := range members {
			fmt.Fprintf(&m, "  - name: m%d\n    public_key: %s\n", i+1, keyText(k.Public()))
		}
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 192.0.2.1:45673
private_key: %s
ports: 40000-40100
%smembers:
%stunnel:
  subnet: 100.88.0.0/16
  listen_port: 51820
  state_file: %s
%s%s`, keyText(relayKey), top, m.String(), filepath.Join(dir, "tunnel.json"), tunnelPolicy, strings.Join(tunnelExtra, ""))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := func() *exec.Cmd {
		cmd := exec.Command("ip", "netns", "exec", rl, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "MPDETOUR_TEST_RELAY_CONFIG="+cfg)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	writeConfig(member)
	cmd := start()

	dialRelay := func(priv proto.Key) *relayconn.Conn {
		c, err := relayconn.Dial(relayconn.Relay{Name: "r1", Addr: netip.MustParseAddrPort("192.0.2.1:45673"), PublicKey: relayKey.Public()},
			priv, relayconn.Options{ListenPacket: func() (net.PacketConn, error) {
				var pc net.PacketConn
				err := netnstest.DoNamed(cl, func() (err error) { pc, err = net.ListenPacket("udp4", ":0"); return err })
				return pc, err
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ln := &line{cl: cl, rl: rl, sv: sv, cmd: cmd, member: member, stranger: stranger, relayPub: relayKey.Public(), dial: dialRelay}
	ln.restart = func(members ...proto.Key) {
		ln.cmd.Process.Signal(syscall.SIGKILL)
		ln.cmd.Wait()
		writeConfig(members...)
		ln.cmd = start()
	}
	return ln
}

// openTunnel asks the relay until it answers (it may still be starting).
func openTunnel(t *testing.T, ln *line, priv proto.Key) *tunnel.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		var c *tunnel.Client
		c, err = Open(rctx, ln.dial(priv), tunnel.ClientConfig{Netns: ln.cl, Index: 0, PrivateKey: wgtypes.Key(priv)})
		rcancel()
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
	}
	t.Fatalf("tunnel over the control channel: %v", err)
	return nil
}

// Issue 29 item 2 (relay part): the tunnel section without destination
// lists inherits the relay's top-level allow_destinations (the server,
// on the relay's own network, is reachable through the tunnel), and a
// destination the policy refuses is answered at once (TCP reset) instead
// of dropped silently (a connect that hangs until its timeout).
func TestTunnelInheritsDestinationPolicy(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	ln := newLineTop(t, "tip", "allow_destinations: [203.0.113.10/32]\n", "")
	netnstest.MustRun(t, "ip", "-n", ln.sv, "addr", "add", "203.0.113.11/24", "dev", "r0")
	client := openTunnel(t, ln, ln.member)
	var lns []net.Listener
	for _, a := range []string{"203.0.113.10:7001", "203.0.113.11:7001"} {
		var l net.Listener
		if err := netnstest.DoNamed(ln.sv, func() (err error) { l, err = net.Listen("tcp4", a); return err }); err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		netnstest.Serve(l, func(c net.Conn) { c.Close() })
		lns = append(lns, l)
	}
	dial := func(to string) (time.Duration, error) {
		start := time.Now()
		err := netnstest.DoNamed(ln.cl, func() error {
			d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(client.Address(), 0))}
			c, err := d.Dial("tcp4", to)
			if err == nil {
				c.Close()
			}
			return err
		})
		return time.Since(start), err
	}
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err = dial(lns[0].Addr().String()); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the server allowed by the top-level allow_destinations is not reachable through the tunnel: %v", err)
	}
	took, err := dial(lns[1].Addr().String())
	if err == nil {
		t.Fatal("a destination the policy refuses was reachable through the tunnel")
	}
	if took > time.Second || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refused destination: %v after %v, want connection refused at once (a reset)", err, took)
	}
	out := netnstest.MustRun(t, "ip", "netns", "exec", ln.rl, "nft", "list", "chain", "ip", tunnel.TableName, "destinations")
	if !strings.Contains(out, "reject with tcp reset") || !strings.Contains(out, "ip daddr 203.0.113.10 accept") {
		t.Fatalf("tunnel policy:\n%s", out)
	}
	// The refusal is counted (the relay logs the counters' growth once a
	// minute: tunnel.Server.Refused, TestWatchRefused).
	if !regexp.MustCompile(`counter packets [1-9][0-9]* bytes [0-9]+ reject with tcp reset`).MatchString(out) {
		t.Fatalf("the refused SYN was not counted:\n%s", out)
	}
}
