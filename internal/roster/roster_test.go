package roster

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

type fixture struct {
	auth  *collective.Authority
	trust *collective.Trust
}

func newFixture(t testing.TB) *fixture {
	a, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{auth: a, trust: collective.NewTrust(a.Public())}
}

func (f *fixture) relay(t testing.TB, name string, roles collective.Roles) (proto.Key, *collective.Certificate) {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c, err := f.auth.Issue(k.Public(), name, roles, now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return k, c
}

func (f *fixture) entry(t testing.TB, name string) (proto.Key, *Entry) {
	k, c := f.relay(t, name, collective.RoleRelay|collective.RoleClient)
	e := &Entry{Issued: time.Now(), Capacity: 100, Load: 3, Kinds: KindNAT | KindTunnel, Region: "eu-west",
		Addrs: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:45673"), netip.MustParseAddrPort("[2001:db8::1]:45673")}, Cert: c}
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	return k, e
}

func TestXEdDSA(t *testing.T) {
	for i := 0; i < 200; i++ { // both signs of A occur
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte(fmt.Sprintf("message %d", i))
		sig, err := xSign(k, msg)
		if err != nil {
			t.Fatal(err)
		}
		if !xVerify(k.Public(), msg, sig) {
			t.Fatalf("key %d: own signature does not verify", i)
		}
		msg[0] ^= 1
		if xVerify(k.Public(), msg, sig) {
			t.Fatalf("key %d: signature verifies another message", i)
		}
		other, _ := proto.GenerateKey()
		msg[0] ^= 1
		if xVerify(other.Public(), msg, sig) {
			t.Fatalf("key %d: signature verifies under another key", i)
		}
	}
	var minus1 proto.Key // p-1 = u of no Edwards point
	minus1[0] = 0xec
	for i := 1; i < 31; i++ {
		minus1[i] = 0xff
	}
	minus1[31] = 0x7f
	if _, err := edwardsKey(minus1); err == nil {
		t.Fatal("u = -1 accepted")
	}
	var big proto.Key // >= p
	for i := range big {
		big[i] = 0xff
	}
	big[31] = 0x7f
	if _, err := edwardsKey(big); err == nil {
		t.Fatal("non-canonical u accepted")
	}
}

func TestEntryRoundTripAndRefusals(t *testing.T) {
	f := newFixture(t)
	k, e := f.entry(t, "relay-a")
	b, err := e.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxEntryLen {
		t.Fatalf("entry of %d bytes", len(b))
	}
	p, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(f.trust, time.Now()); err != nil {
		t.Fatalf("valid entry refused: %v", err)
	}
	b2, _ := p.Bytes()
	if !bytes.Equal(b, b2) || p.Region != "eu-west" || len(p.Addrs) != 2 || p.Key() != k.Public() {
		t.Fatalf("round trip differs: %+v", p)
	}

	refused := func(name, want string, mutate func(e *Entry) *Entry) {
		t.Helper()
		x := mutate(p)
		err := x.Verify(f.trust, time.Now())
		if err == nil || Reason(err) != want {
			t.Errorf("%s: got %v (%s), want reason %s", name, err, Reason(err), want)
		}
	}
	refused("load changed after signing", "forged", func(e *Entry) *Entry { c := *e; c.Load = 0; return &c })
	refused("address changed after signing", "forged", func(e *Entry) *Entry {
		c := *e
		c.Addrs = []netip.AddrPort{netip.MustParseAddrPort("198.51.100.7:45673")}
		return &c
	})
	refused("signed by another key", "forged", func(e *Entry) *Entry {
		c := *e
		other, _ := proto.GenerateKey()
		sig, _ := xSign(other, []byte("x"))
		copy(c.Signature[:], sig)
		return &c
	})
	other := newFixture(t)
	refused("another authority", "certificate-forged", func(e *Entry) *Entry {
		k, c := other.relay(t, "intruder", collective.RoleRelay)
		x := *e
		x.Cert = c
		if err := x.Sign(k); err != nil {
			t.Fatal(err)
		}
		return &x
	})
	refused("client-only certificate", "not-a-relay", func(e *Entry) *Entry {
		k, c := f.relay(t, "client", collective.RoleClient)
		x := *e
		x.Cert = c
		if err := x.Sign(k); err != nil {
			t.Fatal(err)
		}
		return &x
	})
	refused("issued in the future", "future", func(e *Entry) *Entry {
		x := *e
		x.Issued = time.Now().Add(time.Hour)
		if err := x.Sign(k); err != nil {
			t.Fatal(err)
		}
		return &x
	})
	expired := func(e *Entry) *Entry {
		x := *e
		c, err := f.auth.Issue(k.Public(), "old", collective.RoleRelay, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		x.Cert = c
		if err := x.Sign(k); err != nil {
			t.Fatal(err)
		}
		return &x
	}
	refused("expired certificate", "certificate-dates", expired)
	if err := f.trust.UpdateCRL(f.auth.Revoke(nil, time.Now(), p.Cert.Serial).String()); err != nil {
		t.Fatal(err)
	}
	refused("revoked certificate", "revoked", func(e *Entry) *Entry { return e })
	if err := (&Entry{Cert: p.Cert, Capacity: 1, Kinds: KindNAT, Addrs: p.Addrs}).Sign(f.relayKey(t)); err == nil {
		t.Error("signing with a key the certificate does not name succeeded")
	}
}

func (f *fixture) relayKey(t testing.TB) proto.Key {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestParseRefusals(t *testing.T) {
	f := newFixture(t)
	_, e := f.entry(t, "relay-a")
	b, _ := e.Bytes()
	cases := map[string][]byte{
		"empty":         nil,
		"truncated":     b[:len(b)-1],
		"trailing byte": append(append([]byte{}, b...), 0),
		"too long":      make([]byte, MaxEntryLen+1),
		"version":       append([]byte{9}, b[1:]...),
	}
	noKinds := append([]byte{}, b...)
	noKinds[17] = 0
	cases["no kinds"] = noKinds
	zeroCap := append([]byte{}, b...)
	copy(zeroCap[9:13], []byte{0, 0, 0, 0})
	cases["capacity 0"] = zeroCap
	for name, in := range cases {
		if _, err := Parse(in); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "roster entry:") {
			t.Errorf("%s: error %q does not name the record", name, err)
		}
	}
}

// cluster starts n relays on loopback UDP/TCP ports joining the first.
func startCluster(t *testing.T, f *fixture, n int, logs *syncBuf) []*Node {
	t.Helper()
	var nodes []*Node
	t.Cleanup(func() {
		for _, nd := range nodes {
			if nd != nil {
				_ = nd.Kill()
			}
		}
	})
	for i := 0; i < n; i++ {
		k, c := f.relay(t, fmt.Sprintf("r%d", i), collective.RoleRelay)
		port := freePort(t)
		cfg := Config{Bind: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Key: k, Cert: c, Trust: f.trust, Secret: testSecret,
			Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
		if i > 0 {
			cfg.Join = []string{nodes[0].list.LocalNode().Address()}
		}
		nd, err := Start(cfg, Info{Addrs: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 45673+uint16(i))}, Capacity: 10, Kinds: KindNAT})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	return nodes
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestClusterJoinForgedAndDeath(t *testing.T) {
	f := newFixture(t)
	var logs syncBuf
	nodes := startCluster(t, f, 3, &logs)
	d := waitFor(t, 10*time.Second, "three relays in every roster", func() bool {
		for _, nd := range nodes {
			if len(nd.Entries()) != 3 {
				return false
			}
		}
		return true
	})
	t.Logf("roster of 3 converged in %v", d.Round(time.Millisecond))

	// An intruder with another authority's certificate (it holds the
	// gossip secret) tries to join: the relay it joins through refuses its
	// entry before memberlist stores anything of it (so it is no member,
	// and no other relay hears of it).
	intruders := newFixture(t)
	ik, ic := intruders.relay(t, "intruder", collective.RoleRelay)
	bad, err := Start(Config{Bind: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)), Key: ik, Cert: ic, Trust: intruders.trust, Secret: testSecret,
		Join: []string{nodes[0].list.LocalNode().Address()}}, Info{Addrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}, Capacity: 1, Kinds: KindNAT})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Kill()
	waitFor(t, 10*time.Second, "the intruder refused", func() bool { return nodes[0].Refused()["certificate-forged"] > 0 })
	time.Sleep(time.Second) // gossip rounds in which the intruder could spread
	for _, nd := range nodes {
		if len(nd.Entries()) != 3 || nd.Members() != 3 {
			t.Fatalf("%s: roster has %d entries, memberlist %d members with the intruder around", nd.Name(), len(nd.Entries()), nd.Members())
		}
	}
	if !strings.Contains(logs.String(), "reason=certificate-forged") {
		t.Error("no log line for the refused entry")
	}

	// Load updates spread.
	if err := nodes[1].Update(Info{Addrs: nodes[1].info.Addrs, Capacity: 10, Load: 7, Kinds: KindNAT | KindConvert}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the load update", func() bool {
		for _, e := range nodes[2].Entries() {
			if e.Key() == nodes[1].cfg.Key.Public() {
				return e.Load == 7 && e.Kinds == KindNAT|KindConvert
			}
		}
		return false
	})

	// Kill one without leaving: the others drop it.
	victim := nodes[2].cfg.Key.Public()
	if err := nodes[2].Kill(); err != nil {
		t.Fatal(err)
	}
	nodes[2] = nil
	gone := waitFor(t, 15*time.Second, "the dead relay out of every roster", func() bool {
		for _, nd := range nodes[:2] {
			for _, e := range nd.Entries() {
				if e.Key() == victim {
					return false
				}
			}
		}
		return true
	})
	t.Logf("killed relay left every roster after %v (target 5 s)", gone.Round(time.Millisecond))

	// A clean leave is immediate.
	leaver := nodes[1].cfg.Key.Public()
	if err := nodes[1].Close(); err != nil {
		t.Fatal(err)
	}
	nodes[1] = nil
	left := waitFor(t, 5*time.Second, "the leaving relay out of the roster", func() bool {
		for _, e := range nodes[0].Entries() {
			if e.Key() == leaver {
				return false
			}
		}
		return true
	})
	t.Logf("leaving relay out of the roster after %v", left.Round(time.Millisecond))
	if os.Getenv("ROSTER_LOGS") != "" {
		t.Log(logs.String())
	}
}

// A forged update of a relay's metadata (anybody in an unencrypted gossip
// cluster can send one) is refused and counted; the relay's valid entry
// stays.
func TestForgedUpdateKeepsEntry(t *testing.T) {
	f := newFixture(t)
	var logs syncBuf
	nodes := startCluster(t, f, 1, &logs)
	n := nodes[0]
	k, e := f.entry(t, "relay-x")
	good, _ := e.Bytes()
	name := NodeName(k.Public())
	n.learn(&memberlist.Node{Name: name, Meta: good})
	if n.Count() != 2 {
		t.Fatalf("%d entries after a valid one", n.Count())
	}
	forged := append([]byte{}, good...)
	forged[15] ^= 0xff // load
	n.learn(&memberlist.Node{Name: name, Meta: forged})
	if n.Count() != 2 || n.Refused()["forged"] != 1 {
		t.Fatalf("after a forged update: %d entries, refused %v", n.Count(), n.Refused())
	}
	// Carried by a node named for another key: refused.
	n.learn(&memberlist.Node{Name: "relay-somebody-else", Meta: good})
	if n.Refused()["name-mismatch"] != 1 || n.Count() != 2 {
		t.Fatalf("name mismatch: %d entries, refused %v", n.Count(), n.Refused())
	}
	// An older entry of the same relay (replayed) does not replace the newer.
	older := *e
	older.Issued = e.Issued.Add(-time.Minute)
	older.Load = 99
	if err := older.Sign(k); err != nil {
		t.Fatal(err)
	}
	ob, _ := older.Bytes()
	n.learn(&memberlist.Node{Name: name, Meta: ob})
	for _, x := range n.Entries() {
		if x.Key() == k.Public() && x.Load == 99 {
			t.Fatal("an older entry replaced the newer")
		}
	}
	n.forget(&memberlist.Node{Name: name})
	if n.Count() != 1 {
		t.Fatalf("%d entries after the relay left", n.Count())
	}
}
