package relayclient

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// rosterLab is a configured (bootstrap) fake relay on 127.0.0.1 that
// serves a roster the test sets, and discovered fake relays of that
// roster listening on 127.0.0.1, ::1 or both with one key.
type rosterLab struct {
	t       *testing.T
	auth    *collective.Authority
	member  proto.Key
	boot    *fakeRelay
	mu      sync.Mutex
	entries [][]byte
	digest  atomic.Uint64
}

func newRosterLab(t *testing.T) *rosterLab {
	t.Helper()
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	l := &rosterLab{t: t, auth: auth, member: memberKey(t)}
	l.boot = newFakeRelay(t, l.member.Public())
	l.boot.mu.Lock()
	l.boot.answer = func(req proto.Request, _ int32) proto.Reply {
		rq, ok := req.Body.(*proto.RosterRequest)
		if !ok {
			return grantAnswer(l.boot, req, netip.MustParseAddr("127.0.0.1"))
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		p := proto.RosterPage{Total: uint16(len(l.entries)), Start: rq.Start, Digest: l.digest.Load()}
		if !rq.HasDigest || rq.Have != p.Digest {
			p.Entries = page(l.entries, int(rq.Start))
		}
		return proto.Reply{Body: &proto.RosterReply{Roster: p}}
	}
	l.boot.mu.Unlock()
	return l
}

// grantAnswer answers grants (detour at, port 40000+n), renewals and
// releases as the fake relay's default does.
func grantAnswer(r *fakeRelay, req proto.Request, at netip.Addr) proto.Reply {
	switch req.Op {
	case proto.OpGrant:
		g := r.grants.Add(1)
		return proto.Reply{Body: &proto.GrantReply{Detour: netip.AddrPortFrom(at, uint16(40000+g)), Lease: 2 * time.Second}}
	case proto.OpRenew:
		return proto.Reply{Body: &proto.RenewReply{Lease: 2 * time.Second}}
	}
	return proto.Reply{}
}

// discoveredRelay is one relay of the roster: its listener per family
// (nil: the entry does not list that family).
type discoveredRelay struct {
	priv   proto.Key
	v4, v6 *fakeRelay
	entry  []byte
}

// addRelay starts a relay named name on the families asked and lists it
// in the roster (kind NAT, signed by its key, certified by the authority).
func (l *rosterLab) addRelay(name string, v4, v6 bool) *discoveredRelay {
	l.t.Helper()
	priv := memberKey(l.t)
	d := &discoveredRelay{priv: priv}
	var addrs []netip.AddrPort
	if v4 {
		d.v4 = newFakeRelayAt(l.t, l.member.Public(), priv, net.IPv4(127, 0, 0, 1))
		addrs = append(addrs, d.v4.relay().Addr)
	}
	if v6 {
		d.v6 = newFakeRelayAt(l.t, l.member.Public(), priv, net.IPv6loopback)
		d.v6.mu.Lock()
		d.v6.answer = func(req proto.Request, _ int32) proto.Reply { return grantAnswer(d.v6, req, netip.IPv6Loopback()) }
		d.v6.mu.Unlock()
		addrs = append(addrs, d.v6.relay().Addr)
	}
	d.entry = l.sign(name, priv, addrs)
	l.mu.Lock()
	l.entries = append(l.entries, d.entry)
	l.mu.Unlock()
	l.digest.Add(1)
	return d
}

// sign is the roster entry of relay name (key priv) at addrs.
func (l *rosterLab) sign(name string, priv proto.Key, addrs []netip.AddrPort) []byte {
	l.t.Helper()
	now := time.Now()
	cert, err := l.auth.Issue(priv.Public(), name, collective.RoleRelay, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		l.t.Fatal(err)
	}
	e := &roster.Entry{Issued: now.Add(-time.Second).Truncate(time.Millisecond), Capacity: 10, Kinds: roster.KindNAT, Addrs: addrs, Cert: cert}
	if err := e.Sign(priv); err != nil {
		l.t.Fatal(err)
	}
	b, err := e.Bytes()
	if err != nil {
		l.t.Fatal(err)
	}
	return b
}

// remove takes d out of the roster; with a new entry, lists that instead.
func (l *rosterLab) remove(d *discoveredRelay, instead ...[]byte) {
	l.mu.Lock()
	l.entries = append(slices.DeleteFunc(l.entries, func(b []byte) bool { return &b[0] == &d.entry[0] }), instead...)
	l.mu.Unlock()
	l.digest.Add(1)
}

func (l *rosterLab) source(cfg SourceConfig) *NATSource {
	l.t.Helper()
	cfg.PrivateKey = l.member
	cfg.Relays = []relayconn.Relay{l.boot.relay()}
	cfg.Discovery = &Discovery{Trust: collective.NewTrust(l.auth.Public()), Every: 20 * time.Millisecond}
	s, err := NewSource(cfg)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { s.Close() })
	return s
}

func discoveredNames(s *NATSource) []string {
	var out []string
	for _, r := range s.Discovered() {
		out = append(out, r.Name)
	}
	return out
}

// detourVia is server's detour through the relay session named name.
func detourVia(s *NATSource, server netip.AddrPort, name string) (netip.AddrPort, bool) {
	for _, d := range s.Detours(server) {
		if d.Relay == name {
			return d.Remote, true
		}
	}
	return netip.AddrPort{}, false
}

// waitDetour prepares server (as new connections would) until it has a
// detour through the session named name.
func waitDetour(t *testing.T, s *NATSource, server netip.AddrPort, name string) netip.AddrPort {
	t.Helper()
	var d netip.AddrPort
	waitFor(t, "a detour toward "+server.String()+" through "+name, func() bool {
		s.Prepare(server)
		var ok bool
		d, ok = detourVia(s, server, name)
		return ok
	})
	return d
}

var (
	server4 = netip.MustParseAddrPort("198.51.100.7:443")
	server6 = netip.MustParseAddrPort("[2001:db8::7]:443")
)

// A discovered relay listing both families has a session per family,
// each opened only when a server of its family is prepared: none before
// any server, only the IPv4 one for an IPv4 server (the IPv6 listener
// sees no handshake at all), the IPv6 one once an IPv6 server is
// prepared, which then gets its grant through it.
func TestRosterSessionPerFamily(t *testing.T) {
	l := newRosterLab(t)
	r := l.addRelay("dual", true, true)
	s := l.source(SourceConfig{})
	waitFor(t, "the relay discovered for both families", func() bool {
		return slices.Equal(discoveredNames(s), []string{"roster:dual/v4", "roster:dual/v6"})
	})
	time.Sleep(100 * time.Millisecond) // five roster polls
	if r.v4.inits.Load() != 0 || r.v6.inits.Load() != 0 {
		t.Fatalf("before any server: %d IPv4 and %d IPv6 handshakes with the discovered relay; want none (sessions open for a server of their family)", r.v4.inits.Load(), r.v6.inits.Load())
	}

	d4 := waitDetour(t, s, server4, "roster:dual/v4")
	time.Sleep(100 * time.Millisecond)
	if d4.Addr() != netip.MustParseAddr("127.0.0.1") || r.v6.inits.Load() != 0 || r.v6.reqs.Load() != 0 {
		t.Fatalf("IPv4 server: detour %v, %d IPv6 handshakes, %d IPv6 requests; want a 127.0.0.1 detour and no IPv6 session", d4, r.v6.inits.Load(), r.v6.reqs.Load())
	}

	d6 := waitDetour(t, s, server6, "roster:dual/v6")
	if d6.Addr() != netip.IPv6Loopback() || r.v6.count(proto.OpGrant) != 1 || r.v4.count(proto.OpGrant) != 1 {
		t.Fatalf("IPv6 server: detour %v, %d grants over IPv6, %d over IPv4; want a ::1 detour, 1 and 1 (each family asked for its own servers only)", d6, r.v6.count(proto.OpGrant), r.v4.count(proto.OpGrant))
	}
	if _, ok := detourVia(s, server4, "roster:dual/v6"); ok {
		t.Fatal("the IPv6 session granted toward an IPv4 server")
	}
}

// An IPv6-only relay in the roster is used, for IPv6 servers only.
func TestRosterIPv6OnlyRelay(t *testing.T) {
	l := newRosterLab(t)
	r := l.addRelay("six", false, true)
	s := l.source(SourceConfig{})
	waitFor(t, "the IPv6-only relay discovered", func() bool { return slices.Equal(discoveredNames(s), []string{"roster:six"}) })
	s.Prepare(server4)
	d := waitDetour(t, s, server6, "roster:six")
	if d.Addr() != netip.IPv6Loopback() || r.v6.count(proto.OpGrant) != 1 {
		t.Fatalf("IPv6 server through an IPv6-only relay: detour %v, %d grants; want a ::1 detour, 1 grant", d, r.v6.count(proto.OpGrant))
	}
	if _, ok := detourVia(s, server4, "roster:six"); ok {
		t.Fatal("an IPv6-only relay granted toward an IPv4 server")
	}
}

// A relay that leaves the roster is dropped with both its sessions: the
// detours of both families go, and each session releases its grant.
func TestRosterDropReleasesBothFamilies(t *testing.T) {
	l := newRosterLab(t)
	r := l.addRelay("dual", true, true)
	s := l.source(SourceConfig{})
	waitDetour(t, s, server4, "roster:dual/v4")
	waitDetour(t, s, server6, "roster:dual/v6")
	l.remove(r)
	waitFor(t, "both families' grants released", func() bool {
		return r.v4.count(proto.OpRelease) == 1 && r.v6.count(proto.OpRelease) == 1
	})
	_, ok4 := detourVia(s, server4, "roster:dual/v4")
	_, ok6 := detourVia(s, server6, "roster:dual/v6")
	if ok4 || ok6 || len(s.Discovered()) != 0 {
		t.Fatalf("after the relay left the roster: IPv4 detour %v, IPv6 detour %v, discovered %v; want none", ok4, ok6, discoveredNames(s))
	}
}

// A relay whose entry changes address (here its IPv6 one) is dropped,
// both sessions' grants released, and used again at its new addresses.
func TestRosterAddressChangeDropsBothFamilies(t *testing.T) {
	l := newRosterLab(t)
	r := l.addRelay("dual", true, true)
	s := l.source(SourceConfig{})
	waitDetour(t, s, server4, "roster:dual/v4")
	old6 := waitDetour(t, s, server6, "roster:dual/v6")
	moved := newFakeRelayAt(t, l.member.Public(), r.priv, net.IPv6loopback)
	moved.mu.Lock()
	moved.answer = func(req proto.Request, _ int32) proto.Reply { return grantAnswer(moved, req, netip.IPv6Loopback()) }
	moved.mu.Unlock()
	moved.grants.Store(100)         // its detours have other ports than the old address's
	t.Cleanup(func() { s.Close() }) // before moved stops listening: Close releases there
	l.remove(r, l.sign("dual", r.priv, []netip.AddrPort{r.v4.relay().Addr, moved.relay().Addr}))
	waitFor(t, "both families' grants released", func() bool {
		return r.v4.count(proto.OpRelease) == 1 && r.v6.count(proto.OpRelease) == 1
	})
	waitDetour(t, s, server6, "roster:dual/v6")
	waitDetour(t, s, server4, "roster:dual/v4")
	if d, _ := detourVia(s, server6, "roster:dual/v6"); d == old6 || moved.count(proto.OpGrant) != 1 || r.v4.inits.Load() != 2 {
		t.Fatalf("after the move: IPv6 detour %v (before %v), %d grants at the new address, %d IPv4 handshakes; want a new detour, 1, 2 (both sessions opened again)", d, old6, moved.count(proto.OpGrant), r.v4.inits.Load())
	}
}

// A family whose session does not hand shake (the relay does not answer
// on its IPv6 address: an agent without IPv6) is closed and backed off:
// however often IPv6 servers are prepared, few sessions are tried
// (RetryAfter, doubling), and the IPv4 session is not disturbed. Once
// the address answers, a later try gets the grant.
func TestRosterFamilyBackoff(t *testing.T) {
	l := newRosterLab(t)
	r := l.addRelay("dual", true, true)
	r.v6.silent.Store(true)
	var mu sync.Mutex
	failed := 0
	s := l.source(SourceConfig{RequestTimeout: 100 * time.Millisecond, RetryAfter: 200 * time.Millisecond,
		Observe: func(relay, op string, _ netip.AddrPort, err error) {
			if relay == "roster:dual/v6" && err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}})
	waitDetour(t, s, server4, "roster:dual/v4")
	// 1.5 s of IPv6 servers prepared every 10 ms: tries at 0, ~0.3,
	// ~0.7, ~1.5 s (backoff 0.2, 0.4, 0.8 s after each 0.1 s failure).
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		s.Prepare(server6)
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	n := failed
	mu.Unlock()
	// A hot retry would fail ~15 sessions; a loaded machine may delay the
	// tries, so the lower bound is 1.
	if n < 1 || n > 7 {
		t.Fatalf("IPv6 session without answer, IPv6 servers prepared for 1.5 s: %d failed sessions; want 1..7 (backed off; a hot retry makes ~15)", n)
	}
	if _, ok := detourVia(s, server4, "roster:dual/v4"); !ok {
		t.Fatal("the IPv4 detour went while the IPv6 session failed")
	}
	r.v6.silent.Store(false)
	waitDetour(t, s, server6, "roster:dual/v6")
	s.mu.Lock()
	dr := s.found[r.priv.Public()]
	backoff := dr.backoff
	slots := len(s.conns) - len(s.static)
	s.mu.Unlock()
	if backoff != [2]time.Duration{} {
		t.Fatalf("after grants on both families: backoff %v; want none (a failure starts again from RetryAfter)", backoff)
	}
	// Each failed session's slot is taken by the next try: two sessions
	// (IPv4, IPv6), two slots, however many tries failed.
	if slots != 2 {
		t.Fatalf("%d session slots for one discovered relay after %d failed IPv6 sessions; want 2 (closed sessions' slots reused)", slots, n)
	}
}
