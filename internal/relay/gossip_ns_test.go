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
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// Relay discovery: four relays in namespaces form a gossip
// cluster; a member whose agent knows one bootstrap relay reads the roster
// from it, verifies it, and gets grants from the three others, usable for
// a connection; a relay killed with SIGKILL leaves the roster of the
// others and the member's relay set (the measured times are logged; the
// target is 5 s, the assertion a generous 15 s).
func TestGossipDiscovery(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	const nRelays = 4
	attach := starNet(t, "tgh", 77) // a star: every namespace off a router on its own /24
	client, clientAddr := attach("tgc", 100)
	server, serverAddr := attach("tgs", 200)
	_ = clientAddr
	startSink(t, server.Name, serverAddr+":5201")

	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	dir := t.TempDir()
	type relayNS struct {
		ns   *netnstest.NS
		addr string
		key  proto.Key
		proc *relayProc
	}
	relays := make([]*relayNS, nRelays)
	for i := range relays {
		ns, addr := attach("tgr", i+1)
		if err := ns.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
			t.Fatal(err)
		}
		k, _ := proto.GenerateKey()
		certPath := writeRelayCert(t, auth, dir, fmt.Sprintf("relay%d.cert", i), fmt.Sprintf("relay%d", i), k, now)
		cfg := fmt.Sprintf(`listen: %s:%d
private_key: %s
ports: 40000-40999
allow_destinations: [10.77.0.0/16]
collective:
  authority: %s
  certificate_file: %s
  gossip:
    bind: %s:7946
    join: [10.77.1.2:7946]
    region: lab-%d
    secret_file: %s
`, addr, DefaultPort, k, auth.Public(), certPath, addr, i%2, writeGossipKey(t, dir))
		cfgPath := filepath.Join(dir, fmt.Sprintf("relay%d.yaml", i))
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		relays[i] = &relayNS{ns: ns, addr: addr, key: k}
	}
	started := time.Now()
	for _, r := range relays {
		r.proc = startRelay(t, r.ns.Name, filepath.Join(dir, fmt.Sprintf("relay%d.yaml", indexOf(relays, r))))
	}
	rosterOf := func(r *relayNS) map[string]bool {
		var st *Status
		var err error
		in(t, r.ns.Name, func() { st, err = QueryStatus(2 * time.Second) })
		if err != nil || st.Roster == nil {
			return nil
		}
		m := map[string]bool{}
		for _, e := range st.Roster.Relays {
			m[e.Name] = true
		}
		return m
	}
	waitLong(t, 20*time.Second, "all four relays in every roster", func() bool {
		for _, r := range relays {
			if len(rosterOf(r)) != nRelays {
				return false
			}
		}
		return true
	})
	t.Logf("roster of %d relays converged %v after the relays were started", nRelays, time.Since(started).Round(100*time.Millisecond))

	// The member: certificate (client), one bootstrap relay, discovery on.
	member, _ := proto.GenerateKey()
	mc, err := auth.Issue(member.Public(), "alice", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	src, err := relayclient.NewSource(relayclient.SourceConfig{
		PrivateKey: member,
		Relays:     []relayconn.Relay{{Name: "bootstrap", Addr: netip.MustParseAddrPort(relays[0].addr + ":45673"), PublicKey: relays[0].key.Public()}},
		Options: relayconn.Options{Certificate: mc.Bytes(), Logger: slog.New(slog.NewTextHandler(logs, nil)),
			ListenPacket: func() (net.PacketConn, error) { return udpIn(t, client.Name, ""), nil }},
		Discovery: &relayclient.Discovery{Trust: collective.NewTrust(auth.Public()), Max: 4, Every: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	defer func() {
		if t.Failed() {
			t.Logf("source log:\n%s", logs.String())
		}
	}()
	srv := netip.MustParseAddrPort(serverAddr + ":5201")
	t0 := time.Now()
	src.Prepare(srv)
	waitLong(t, 15*time.Second, "grants from the bootstrap relay and the three discovered ones", func() bool {
		src.Prepare(srv) // as new connections would
		return len(src.Detours(srv)) == nRelays
	})
	t.Logf("member with one bootstrap relay: %d relays discovered, %d detours granted %v after start (target 5 s)",
		len(src.Discovered()), len(src.Detours(srv)), time.Since(t0).Round(100*time.Millisecond))
	// Every detour carries a connection to the server.
	for _, d := range src.Detours(srv) {
		c, err := dialFrom(t, client.Name, d.Remote.String())
		if err != nil {
			t.Fatalf("connect through %s: %v", d, err)
		}
		msg := []byte("through " + d.Relay)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != string(msg) {
			t.Fatalf("echo through %s: %q %v", d, buf, err)
		}
		c.Close()
	}

	// The roster digest: a member that holds the roster gets "unchanged";
	// an older member (no digest) gets the roster as before.
	conn, err := relayconn.Dial(relayconn.Relay{Name: "r0", Addr: netip.MustParseAddrPort(relays[0].addr + ":45673"), PublicKey: relays[0].key.Public()},
		member, relayconn.Options{Certificate: mc.Bytes(), ListenPacket: func() (net.PacketConn, error) { return udpIn(t, client.Name, ""), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rosterRead := func(have uint64, digest bool) relayconn.RosterRead {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := conn.RosterSince(ctx, 256, have, digest)
		if err != nil {
			t.Fatalf("roster read (have %x, digest %v): %v", have, digest, err)
		}
		return r
	}
	first := rosterRead(0, true)
	if len(first.Entries) != nRelays || first.Digest == 0 || first.Unchanged {
		t.Fatalf("first roster read: %d entries, digest %x, unchanged %v", len(first.Entries), first.Digest, first.Unchanged)
	}
	if again := rosterRead(first.Digest, true); !again.Unchanged || len(again.Entries) != 0 || again.Digest != first.Digest || again.Total != nRelays {
		t.Fatalf("read with the digest held: %+v", again)
	}
	if stale := rosterRead(first.Digest^1, true); stale.Unchanged || len(stale.Entries) != nRelays {
		t.Fatalf("read with a stale digest: unchanged %v, %d entries", stale.Unchanged, len(stale.Entries))
	}
	if old := rosterRead(0, false); old.Digest != 0 || len(old.Entries) != nRelays {
		t.Fatalf("read without a digest (older member): digest %x, %d entries", old.Digest, len(old.Entries))
	}
	waitLong(t, 5*time.Second, "the member's source reading the roster unchanged (it polls every second)", func() bool {
		_, unchanged := src.RosterReads()
		return unchanged >= 2
	})
	// (Whole reads after the first: a relay re-signs its entry when its
	// load changes, as the grants above did.)
	full, unchanged := src.RosterReads()
	t.Logf("member's roster reads so far: %d whole, %d unchanged", full, unchanged)

	// Kill relay3 (no leave message): it leaves every roster and the
	// member's relay set.
	victim := relays[nRelays-1]
	if err := victim.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitLong(t, 15*time.Second, "relay3 out of the other relays' rosters", func() bool {
		for _, r := range relays[:nRelays-1] {
			if m := rosterOf(r); m == nil || m["relay3"] || len(m) != nRelays-1 {
				return false
			}
		}
		return true
	})
	outOfRoster := time.Since(killed)
	waitLong(t, 15*time.Second, "relay3 dropped by the member", func() bool {
		for _, r := range src.Discovered() {
			if r.PublicKey == victim.key.Public() {
				return false
			}
		}
		return len(src.Detours(srv)) == nRelays-1
	})
	t.Logf("killed relay out of every roster %v after SIGKILL (target 5 s), dropped by the member after %v (roster poll 1 s)",
		outOfRoster.Round(100*time.Millisecond), time.Since(killed).Round(100*time.Millisecond))
	if after := rosterRead(first.Digest, true); after.Unchanged || len(after.Entries) != nRelays-1 || after.Digest == first.Digest {
		t.Fatalf("read with the digest from before the kill: unchanged %v, %d entries, digest %x", after.Unchanged, len(after.Entries), after.Digest)
	}
}

func indexOf[T comparable](s []T, x T) int {
	for i, y := range s {
		if y == x {
			return i
		}
	}
	return -1
}

func waitLong(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeGossipKey writes a gossip secret_file for the relays of a test
// (gossip is authenticated; every relay of the cluster shares it).
func writeGossipKey(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "gossip.key")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if err := os.WriteFile(p, []byte(roster.NewSecret()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
