package tunnelctl

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/agenttest"
	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// A member rotates its key while an MPTCP subflow runs inside its
// WireGuard tunnel detour: the relay replaces the member's WireGuard peer
// by one of the new key with the same tunnel address, the client's device
// takes the new private key, and the same subflow keeps carrying data
// after a new handshake. The old key is listed (static members), the new
// one certified under the same name.
func TestTunnelKeyRotation(t *testing.T) { testTunnelKeyRotation(t, true) }

// The same without the agent's explicit rekey: the tunnel source follows
// its relay connection's new key by itself (TunnelSource.follow), within about
// one followEvery.
func TestTunnelFollowsKeyRotation(t *testing.T) { testTunnelKeyRotation(t, false) }

// explicit: the agent's path, TunnelSource.Rekey right after Conn.Rotate.
func testTunnelKeyRotation(t *testing.T, explicit bool) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft")
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	line := newLineNamed(t, "mkr", fmt.Sprintf("collective: {authority: %s}\n", auth.Public()))
	newKey := line.stranger
	now := time.Now()
	newCert, _ := auth.Issue(newKey.Public(), "m1", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	conn := line.dial(line.member)
	srcs, err := StartAll(line.cl, []*relayconn.Conn{conn}, line.member, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := srcs[0]
	defer src.Close()
	up := time.Now().Add(20 * time.Second)
	for src.Client() == nil && time.Now().Before(up) {
		time.Sleep(100 * time.Millisecond)
	}
	client := src.Client()
	if client == nil {
		t.Fatal("tunnel source never came up")
	}
	tunAddr := client.Address()
	netnstest.MustRun(t, "ip", "-n", line.sv, "mptcp", "limits", "set", "subflows", "2")
	var ln net.Listener
	if err := netnstest.DoNamed(line.sv, func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp4", "203.0.113.10:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
	cfg := agent.DefaultOptions()
	cfg.Subflows, cfg.Backoff = 1, 300*time.Millisecond
	cfg.NetNS = line.cl
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	defer agenttest.Start(context.Background(), t, cfg, log, src).Stop(t)

	var c net.Conn
	if err := netnstest.DoNamed(line.cl, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp4", "203.0.113.10:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	defer netnstest.KeepWriting(c)()
	// tunnelSubflow returns the subflow; ok is false when the dump failed (a
	// transient netlink error is no evidence about the subflow).
	var dumpErrs int
	tunnelSubflow := func() (_ mptcppm.Subflow, found, ok bool) {
		s, found, err := mptcppm.FindSubflow(mptcppm.Options{NetNS: line.cl}, local, func(s mptcppm.Subflow) bool { return s.Local.Addr() == tunAddr })
		if err != nil {
			dumpErrs++
		}
		return s, found, err == nil
	}
	var first mptcppm.Subflow
	deadline := time.Now().Add(15 * time.Second)
	for {
		s, found, _ := tunnelSubflow()
		if found && s.BytesAcked > 1<<20 {
			first = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no subflow through the tunnel carrying data")
		}
		time.Sleep(100 * time.Millisecond)
	}
	type sample struct {
		at    time.Time
		acked uint64
		same  bool
	}
	var ss []sample
	sampleFor := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if s, found, ok := tunnelSubflow(); ok {
				ss = append(ss, sample{time.Now(), s.BytesAcked, found && s.Local == first.Local && s.Remote == first.Remote})
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	sampleFor(time.Second)

	// The agent's SIGHUP path: the relay connection rotates (the relay
	// moves the peer), then the tunnel takes the new key.
	rotStart := time.Now()
	rotated := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := conn.Rotate(ctx, newKey, newCert.Bytes())
		if err == nil && explicit {
			err = src.Rekey(newKey)
		}
		rotated <- err
	}()
	sampleFor(4 * time.Second)
	if !explicit {
		sampleFor(2 * followEvery)
	}
	if err := <-rotated; err != nil {
		t.Fatalf("rotation: %v", err)
	}
	var st *relay.Status
	if err := netnstest.DoNamed(line.rl, func() (err error) { st, err = relay.QueryStatus(5 * time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	if st.Tunnel == nil || len(st.Tunnel.Peers) != 1 {
		t.Fatalf("relay tunnel status: %+v", st.Tunnel)
	}
	p := st.Tunnel.Peers[0]
	if p.Key != wgtypes.Key(newKey.Public()).String() || len(p.Addresses) != 1 || p.Addresses[0] != tunAddr.String()+"/32" || p.LastHandshake.Before(rotStart) {
		t.Fatalf("relay's peer after the rotation: %+v (want key %s, address %s, a handshake after %s)", p, wgtypes.Key(newKey.Public()), tunAddr, rotStart.Format(time.RFC3339Nano))
	}
	if dev, err := client.Status(); err != nil || dev.PublicKey != wgtypes.Key(newKey.Public()) {
		t.Fatalf("client device key: %v %v", dev, err)
	}

	var gap time.Duration
	last := ss[0]
	for _, s := range ss {
		if !s.same {
			t.Fatalf("the tunnel subflow %v -> %v was gone at %s (rotation at %s)", first.Local, first.Remote, s.at.Format("15:04:05.000"), rotStart.Format("15:04:05.000"))
		}
		if s.acked != last.acked {
			gap = max(gap, s.at.Sub(last.at))
			last = s
		}
	}
	gap = max(gap, ss[len(ss)-1].at.Sub(last.at))
	moved := ss[len(ss)-1].acked - ss[0].acked
	t.Logf("the tunnel subflow carried %d bytes over %v of samples, longest stall %v (rotation at %s); %d failed dumps skipped",
		moved, ss[len(ss)-1].at.Sub(ss[0].at).Round(time.Millisecond), gap, rotStart.Format("15:04:05.000"), dumpErrs)
	limit := time.Second
	if !explicit {
		limit += 2 * followEvery // the follower's period, then a handshake
	}
	if gap > limit {
		t.Fatalf("the tunnel subflow stalled for %v", gap)
	}
	if moved < 1<<20 {
		t.Fatalf("the tunnel subflow carried only %d bytes", moved)
	}
}
