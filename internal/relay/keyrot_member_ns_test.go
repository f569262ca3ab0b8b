package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent/agenttest"
	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// A member rotates its key in place while an MPTCP connection has a
// subflow through a NAT detour of a collective relay: the relay carries
// the mapping over to the new key (relayclient.NATSource.Rotate, OpRotate),
// the same subflow keeps carrying data without a gap, the relay attributes
// the mapping to the member under its new key, and revoking the old key's
// certificate afterwards does not cut the member.
func TestMemberKeyRotationMPTCP(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := labtest.UpDetours(ctx, t, fmt.Sprintf("mkr%d", os.Getpid()%100000), 1)
	relayNS, relayIP := l.NetnsName("detour1"), l.Addr("detour1")
	server := netip.AddrPortFrom(l.Addr("server"), 5201)
	if out, err := l.Command(ctx, "server", "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8").CombinedOutput(); err != nil {
		t.Fatalf("mptcp limits: %v %s", err, out)
	}

	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	k := newKeys(t)
	oldKey, newKey := k.member, k.stranger
	now := time.Now()
	oldCert, _ := auth.Issue(oldKey.Public(), "alice", collective.RoleClient, now.Add(-2*time.Minute), now.Add(time.Hour))
	newCert, _ := auth.Issue(newKey.Public(), "alice", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	dir := t.TempDir()
	crlPath := filepath.Join(dir, "crl.txt")
	crl := auth.Revoke(nil, now)
	writeAtomic(t, crlPath, crl.String())
	oldCertPath := filepath.Join(dir, "old.cert")
	writeAtomic(t, oldCertPath, oldCert.String())
	attrPath := filepath.Join(dir, "attribution.jsonl")
	cfgPath := filepath.Join(dir, "relay.yaml")
	writeAtomic(t, cfgPath, fmt.Sprintf("listen: %s:%d\nprivate_key: %s\nmembers: []\ncollective: {authority: %s, crl_file: %s}\nallow_destinations: [%s/32]\nattribution_log: %s\n",
		relayIP, DefaultPort, k.relay, auth.Public(), crlPath, server.Addr(), attrPath))
	p := startRelay(t, relayNS, cfgPath)

	acfg, err := agentd.ParseConfig([]byte(fmt.Sprintf("subflows: 1\nbackoff: 300ms\nrelays:\n  key: %s\n  certificate_file: %s\n  servers:\n    - {name: detour1, address: '%s:%d', public_key: %s}\n",
		oldKey, oldCertPath, relayIP, DefaultPort, k.relay.Public())))
	if err != nil {
		t.Fatal(err)
	}
	acfg.Agent.NetNS = l.NetnsName("client")
	acfg.Agent.Socket = filepath.Join(dir, "agent.sock")
	rc := *acfg.Relays
	rc.Options.ListenPacket = relayconn.ListenIn(acfg.Agent.NetNS)
	log := slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rc.Options.Logger = log
	src, err := relayclient.NewSource(rc)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	defer agenttest.Start(ctx, t, acfg.Agent, log, src).Stop(t)
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(attrPath)
			t.Logf("attribution log:\n%s\nrelay log:\n%s", b, p.stderr.String())
		}
	}()

	var ln net.Listener
	if err := l.Do("server", func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(ctx, "tcp4", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var got atomic.Int64
	netnstest.Serve(ln, func(c net.Conn) { n, _ := io.Copy(io.Discard, c); got.Add(n); c.Close() })
	var c net.Conn
	if err := l.Do("client", func() (err error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp4", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	stopWriter := netnstest.KeepWriting(c)
	defer stopWriter()

	// detour returns the connection's subflow through the relay.
	// detour returns the subflow; ok is false when the dump failed (a
	// transient netlink error is no evidence about the subflow).
	var dumpErrs int
	detour := func() (_ mptcppm.Subflow, found, ok bool) {
		s, found, err := mptcppm.FindSubflow(mptcppm.Options{NetNS: acfg.Agent.NetNS}, local, func(s mptcppm.Subflow) bool { return s.Remote.Addr() == relayIP })
		if err != nil {
			dumpErrs++
		}
		return s, found, err == nil
	}
	var first mptcppm.Subflow
	waitFor(t, "a subflow through the relay", func() bool {
		var found bool
		first, found, _ = detour()
		return found && first.BytesAcked > 0
	})

	// Sample the detour subflow's acknowledged bytes every 50 ms from now
	// on: the longest time it does not advance is the gap.
	type sample struct {
		at    time.Time
		acked uint64
		same  bool
	}
	samples := make(chan []sample, 1)
	stopSampling := make(chan struct{})
	go func() {
		var ss []sample
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stopSampling:
				samples <- ss
				return
			case <-tk.C:
			}
			s, found, ok := detour()
			if ok {
				ss = append(ss, sample{time.Now(), s.BytesAcked, found && s.Local == first.Local && s.Remote == first.Remote})
			}
		}
	}()
	time.Sleep(time.Second)

	// Rotate: the new key's session certifies and carries the detour over.
	rotStart := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	err = src.Rotate(rctx, newKey, newCert.Bytes(), nil)
	rcancel()
	if err != nil {
		t.Fatalf("rotation: %v", err)
	}
	rotTook := time.Since(rotStart)
	if src.Key() != newKey {
		t.Fatal("the source still uses the old key")
	}
	statusOf := func() map[string]MemberStatus {
		var st *Status
		var err error
		in(t, relayNS, func() { st, err = QueryStatus(5 * time.Second) })
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]MemberStatus{}
		for _, m := range st.Members {
			out[m.Key] = m
		}
		return out
	}
	ms := statusOf()
	if m := ms[newKey.Public().String()]; m.Name != "alice" || len(m.Mappings) != 1 || !strings.HasSuffix(m.Mappings[0].Client, fmt.Sprintf(":%d", first.Remote.Port())) {
		t.Fatalf("relay status after the rotation: new key %+v", m)
	}
	if m, ok := ms[oldKey.Public().String()]; ok && len(m.Mappings) != 0 {
		t.Fatalf("the old key still holds mappings: %+v", m)
	}
	rotated := false
	for _, ev := range readAttribution(t, attrPath) {
		if ev.Event == "rotate" && ev.Member == "alice" && ev.KeyID == newKey.Public().ID() && ev.DetourPort == first.Remote.Port() {
			rotated = true
		}
	}
	if !rotated {
		t.Fatal("no rotate line for the new key in the attribution log")
	}
	time.Sleep(2 * time.Second)

	// Revoke the old key's certificate: the relay drops the old key (its
	// sessions) within one file check, the rotated member keeps its detour.
	writeAtomic(t, crlPath, auth.Revoke(crl, time.Now(), oldCert.Serial).String())
	waitFor(t, "the relay to drop the old key", func() bool {
		return strings.Contains(p.stderr.String(), "certified member dropped") && strings.Contains(p.stderr.String(), oldKey.Public().ID())
	})
	time.Sleep(2 * time.Second)
	if n := elements(t, relayNS); n != 1 {
		t.Fatalf("%d mappings after revoking the old key, want 1", n)
	}
	ms = statusOf()
	if m := ms[newKey.Public().String()]; len(m.Mappings) != 1 {
		t.Fatalf("relay status after revoking the old key: %+v", m)
	}
	// A renewal (and a repeated grant) on the new key still works.
	rcctx, rccancel := context.WithTimeout(ctx, 5*time.Second)
	if _, _, err := src.Conns()[0].Grant(rcctx, server, 0); err != nil {
		t.Fatalf("grant on the new key after the revocation: %v", err)
	}
	rccancel()
	close(stopSampling)
	ss := <-samples
	if err := stopWriter(); err != nil {
		t.Fatalf("the connection failed: %v", err)
	}

	// The same subflow all along, advancing, with no long gap.
	var gap time.Duration
	var gapAt time.Time
	last := ss[0]
	for _, s := range ss {
		if !s.same {
			t.Fatalf("the detour subflow %v -> %v was gone at %s (rotation at %s)", first.Local, first.Remote, s.at.Format("15:04:05.000"), rotStart.Format("15:04:05.000"))
		}
		if s.acked != last.acked {
			if d := s.at.Sub(last.at); d > gap {
				gap, gapAt = d, last.at
			}
			last = s
		}
	}
	if d := ss[len(ss)-1].at.Sub(last.at); d > gap {
		gap, gapAt = d, last.at
	}
	moved := ss[len(ss)-1].acked - ss[0].acked
	t.Logf("rotation took %v; the detour subflow carried %d bytes over %v of samples (rotation and revocation included), longest stall %v at %s (rotation at %s); %d failed dumps skipped",
		rotTook.Round(time.Millisecond), moved, ss[len(ss)-1].at.Sub(ss[0].at).Round(time.Millisecond), gap, gapAt.Format("15:04:05.000"), rotStart.Format("15:04:05.000"), dumpErrs)
	if gap > time.Second {
		t.Fatalf("the detour subflow stalled for %v", gap)
	}
	if moved < 1<<20 {
		t.Fatalf("the detour subflow carried only %d bytes", moved)
	}
}

func writeAtomic(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
