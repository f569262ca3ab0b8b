package relay

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// rotations reads mpdetour_relay_rotations_total{result}.
func rotations(t *testing.T, s *Server, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.met.rotations.WithLabelValues(result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// rotateFixture is a collective relay (fake data plane) where member alice
// holds a NAT mapping, two converter tickets and some ledger under her old
// key, certified by the authority.
type rotateFixture struct {
	s        *Server
	dp       *dataplane.Fake
	logs     *bytes.Buffer
	auth     *collective.Authority
	old      proto.Key // private
	oldCert  *collective.Certificate
	oldSes   *session
	mapping  *lease.Mapping
	client   netip.Addr
	server   netip.AddrPort
	notAfter time.Time
}

func newRotateFixture(t *testing.T) *rotateFixture {
	t.Helper()
	f := &rotateFixture{logs: &bytes.Buffer{}}
	var err error
	if f.auth, err = collective.NewAuthority(); err != nil {
		t.Fatal(err)
	}
	set := fairConfig(t, 0, "")
	set.Rate, set.Burst = 1000, 1000
	set.Trust = collective.NewTrust(f.auth.Public())
	f.s, f.dp = newTestServer(t, Static{}, set, nil, slog.New(slog.NewTextHandler(f.logs, nil)))
	s := f.s
	s.conv = &converter{tickets: newTicketStore()}
	f.old = testKey(t)
	now := time.Now()
	f.notAfter = now.Add(time.Hour)
	f.oldCert = f.issue(t, f.old.Public(), "alice", now.Add(-2*time.Minute), f.notAfter)
	f.oldSes = f.session(t, f.old.Public(), f.oldCert.Bytes())
	f.client = netip.MustParseAddr("10.0.1.1")
	f.server = netip.MustParseAddrPort("198.51.100.1:5201")
	rep := serveReq(s, f.oldSes, proto.NewRequest(0, &proto.GrantRequest{Server: f.server}))
	if rep.Reason != proto.OK {
		t.Fatalf("grant: %v", rep.Reason)
	}
	s.flush()
	f.mapping = s.leases.ByKey[dataplane.Key{Client: f.client, Port: detourOf(rep).Port()}]
	if _, err := s.conv.tickets.issue(f.old.Public(), "alice", f.client, 2, now.Add(time.Minute), now); err != nil {
		t.Fatal(err)
	}
	s.fair.led.AddConsumed(f.old.Public(), "alice", 5000, now, false)
	return f
}

func (f *rotateFixture) issue(t *testing.T, key proto.Key, name string, from, until time.Time) *collective.Certificate {
	t.Helper()
	c, err := f.auth.Issue(key, name, collective.RoleClient, from, until)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// session is a session of key from the fixture's client that presented
// cert (nil: none; a listed key needs none), registered as a handshake
// registers it.
func (f *rotateFixture) session(t *testing.T, key proto.Key, cert []byte) *session {
	t.Helper()
	_, listed := f.s.set.Members[key]
	ses := &session{peer: key, name: f.s.set.Members[key], addr: netip.MustParseAddrPort("10.0.1.1:40000"), pending: !listed, created: time.Now()}
	idx := uint32(len(f.s.ses.all) + 1)
	for f.s.ses.all[idx] != nil {
		idx++
	}
	f.s.ses.all[idx] = ses
	f.s.ses.byMember[key] = append(f.s.ses.byMember[key], idx)
	if cert != nil {
		rep := serveReq(f.s, ses, proto.NewRequest(0, &proto.CertifyRequest{Cert: cert}))
		if rep.Reason == proto.OK && !listed {
			ses.pending, ses.name = false, f.s.trust.Certified[key].Name
		}
	}
	return ses
}

func (f *rotateFixture) rotate(ses *session, r proto.Rotation) proto.Reason {
	rep := serveReq(f.s, ses, proto.NewRequest(0, &proto.RotateRequest{Rotate: r}))
	f.s.flush()
	return rep.Reason
}

// unmoved asserts that nothing of the old key moved.
func (f *rotateFixture) unmoved(t *testing.T, what string) {
	t.Helper()
	old := f.old.Public()
	if f.mapping.Owner.Key != old || f.s.leases.Find(lease.Owner{Key: old}, f.client, f.server) != f.mapping {
		t.Errorf("%s: the mapping moved to %s", what, f.mapping.Owner.Key.ID())
	}
	if ticketsOf(f.s, old) != 2 {
		t.Errorf("%s: the tickets moved", what)
	}
	if e := f.s.fair.led.Members[old]; e == nil || e.Consumed != 5000 {
		t.Errorf("%s: the ledger moved", what)
	}
	if !mapped(f.dp, f.mapping.Key) {
		t.Errorf("%s: the mapping left the data plane", what)
	}
}

// Forged, misdirected, stale, wrong-authority, expired, renamed and other
// bad rotations are refused with their reason in the log and the metric,
// and nothing moves.
func TestRotateRefusals(t *testing.T) {
	f := newRotateFixture(t)
	now := time.Now()
	mallory := testKey(t)
	newKey := testKey(t)
	newCert := f.issue(t, newKey.Public(), "alice", now.Add(-time.Minute), now.Add(time.Hour))
	other, _ := collective.NewAuthority()
	sign := func(priv, successor proto.Key, at time.Time) proto.Rotation {
		r, err := collective.SignRotation(priv, successor, at)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	good := sign(f.old, newKey.Public(), now)
	forged := good
	forged.Signature[7] ^= 1
	cases := []struct {
		name   string
		ses    func() *session
		r      proto.Rotation
		want   proto.Reason
		result string
	}{
		{"signed by another key", func() *session { return f.session(t, newKey.Public(), newCert.Bytes()) },
			func() proto.Rotation { r := sign(mallory, newKey.Public(), now); r.Old = f.old.Public(); return r }(), proto.ReasonUnauthorized, rotateForged},
		{"altered signature", func() *session { return f.session(t, newKey.Public(), newCert.Bytes()) }, forged, proto.ReasonUnauthorized, rotateForged},
		{"statement for another successor", func() *session {
			k := testKey(t)
			return f.session(t, k.Public(), f.issue(t, k.Public(), "alice", now.Add(-time.Minute), now.Add(time.Hour)).Bytes())
		}, good, proto.ReasonUnauthorized, rotateForged},
		{"stale statement", func() *session { return f.session(t, newKey.Public(), newCert.Bytes()) },
			sign(f.old, newKey.Public(), now.Add(-10*time.Minute)), proto.ReasonExpired, rotateStale},
		{"future statement", func() *session { return f.session(t, newKey.Public(), newCert.Bytes()) },
			sign(f.old, newKey.Public(), now.Add(10*time.Minute)), proto.ReasonExpired, rotateStale},
		{"new certificate of another authority", func() *session {
			c, err := other.Issue(newKey.Public(), "alice", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			return f.session(t, newKey.Public(), c.Bytes())
		}, good, proto.ReasonUnauthorized, rotateNewUncert},
		{"expired new certificate", func() *session {
			return f.session(t, newKey.Public(), f.issue(t, newKey.Public(), "alice", now.Add(-2*time.Hour), now.Add(-time.Hour)).Bytes())
		}, good, proto.ReasonUnauthorized, rotateNewUncert},
		{"no new certificate", func() *session { return f.session(t, newKey.Public(), nil) }, good, proto.ReasonUnauthorized, rotateNewUncert},
		{"another member's name", func() *session {
			return f.session(t, newKey.Public(), f.issue(t, newKey.Public(), "mallory", now.Add(-time.Minute), now.Add(time.Hour)).Bytes())
		}, good, proto.ReasonUnauthorized, rotateNameDiffers},
		{"old key not a member", func() *session { return f.session(t, newKey.Public(), newCert.Bytes()) },
			func() proto.Rotation { r := sign(mallory, newKey.Public(), now); return r }(), proto.ReasonUnauthorized, rotateNotMember},
		{"old key is the session's", func() *session { return f.oldSes }, sign(f.old, f.old.Public(), now), proto.ReasonMalformed, rotateSameKey},
	}
	for _, c := range cases {
		before := rotations(t, f.s, c.result)
		f.logs.Reset()
		ses := c.ses()
		if got := f.rotate(ses, c.r); got != c.want {
			t.Errorf("%s: answered %v, want %v", c.name, got, c.want)
		}
		if after := rotations(t, f.s, c.result); after != before+1 {
			t.Errorf("%s: rotations_total{result=%s} %v -> %v", c.name, c.result, before, after)
		}
		if c.result != rotateNewUncert && !strings.Contains(f.logs.String(), "reason="+c.result) {
			t.Errorf("%s: no log line with reason=%s:\n%s", c.name, c.result, f.logs.String())
		}
		f.unmoved(t, c.name)
		// Names certified for the new key in one case must not leak into the next.
		delete(f.s.trust.Certified, ses.peer)
	}
	if rotations(t, f.s, rotateOK) != 0 {
		t.Fatal("a refused rotation counted as ok")
	}
	// A revoked old key cannot hand its state on either.
	f.s.set.Trust.Install(f.auth.Revoke(nil, now, f.oldCert.Serial))
	if got := f.rotate(f.session(t, newKey.Public(), newCert.Bytes()), good); got != proto.ReasonUnauthorized {
		t.Fatalf("rotation away from a revoked key: %v", got)
	}
}

// A valid rotation carries the mapping (same detour port, kernel element
// untouched), the quota, the tickets and the ledger over to the new key;
// the new key's session renews it, the old key's may renew but not
// release it, a repeated grant of the new key returns it; revoking the old
// key afterwards leaves it alone.
func TestRotateCarriesOver(t *testing.T) {
	f := newRotateFixture(t)
	now := time.Now()
	newKey := testKey(t)
	newCert := f.issue(t, newKey.Public(), "alice", now.Add(-time.Minute), now.Add(time.Hour))
	ses := f.session(t, newKey.Public(), newCert.Bytes())
	r, err := collective.SignRotation(f.old, newKey.Public(), now)
	if err != nil {
		t.Fatal(err)
	}
	port := f.mapping.Key.Port
	if got := f.rotate(ses, r); got != proto.OK {
		t.Fatalf("rotation: %v\n%s", got, f.logs.String())
	}
	nk, ok := newKey.Public(), f.old.Public()
	if f.mapping.Owner != (lease.Owner{Key: nk, Name: "alice"}) || !mapped(f.dp, f.mapping.Key) || f.mapping.Key.Port != port {
		t.Fatalf("mapping after rotation: %+v mapped=%v", f.mapping.Owner, mapped(f.dp, f.mapping.Key))
	}
	if n := f.s.leases.QuotaUsed(lease.Owner{Key: nk, Name: "alice"}, f.client); n != 1 {
		t.Fatalf("alice's quota count after the rotation: %d, want 1", n)
	}
	if ticketsOf(f.s, nk) != 2 || ticketsOf(f.s, ok) != 0 || f.s.conv.tickets.perMember["alice"] != 2 {
		t.Fatalf("tickets: new key %d, old key %d, alice's count %d", ticketsOf(f.s, nk), ticketsOf(f.s, ok), f.s.conv.tickets.perMember["alice"])
	}
	if e := f.s.fair.led.Members[nk]; e == nil || e.Consumed != 5000 || f.s.fair.led.Members[ok] != nil {
		t.Fatalf("ledger: %+v", f.s.fair.led.Members)
	}
	if rotations(t, f.s, rotateOK) != 1 || !strings.Contains(f.logs.String(), "member key rotated") {
		t.Fatalf("ok not counted or logged:\n%s", f.logs.String())
	}
	// Grants and renewals.
	if rep := serveReq(f.s, ses, proto.NewRequest(0, &proto.GrantRequest{Server: f.server})); rep.Reason != proto.OK || detourOf(rep).Port() != port {
		t.Fatalf("repeated grant on the new key: %v port %d, want %d", rep.Reason, detourOf(rep).Port(), port)
	}
	if rep := serveReq(f.s, ses, proto.NewRequest(0, &proto.RenewRequest{Port: port})); rep.Reason != proto.OK {
		t.Fatalf("renew on the new key: %v", rep.Reason)
	}
	if rep := serveReq(f.s, f.oldSes, proto.NewRequest(0, &proto.RenewRequest{Port: port})); rep.Reason != proto.OK {
		t.Fatalf("renew on the old key's session during the switch: %v", rep.Reason)
	}
	if rep := serveReq(f.s, f.oldSes, proto.NewRequest(0, &proto.ReleaseRequest{Port: port})); rep.Reason != proto.ReasonNotFound {
		t.Fatalf("release on the old key's session: %v, want not-found", rep.Reason)
	}
	// A repeated statement (the member's retry) moves nothing more and harms nothing.
	if got := f.rotate(ses, r); got != proto.OK {
		t.Fatalf("repeated rotation: %v", got)
	}
	// Revoking the old key leaves the rotated member alone.
	f.s.set.Trust.Install(f.auth.Revoke(nil, now, f.oldCert.Serial))
	f.s.checkCollective(now)
	if f.s.leases.ByKey[f.mapping.Key] != f.mapping || !mapped(f.dp, f.mapping.Key) {
		t.Fatal("revoking the old key removed the rotated mapping")
	}
	if f.s.isMember(ok, now) || !f.s.isMember(nk, now) {
		t.Fatal("membership after revoking the old key")
	}
	if rep := serveReq(f.s, ses, proto.NewRequest(0, &proto.RenewRequest{Port: port})); rep.Reason != proto.OK {
		t.Fatalf("renew on the new key after the revocation: %v", rep.Reason)
	}
}

// Static member list: both keys listed under the same name rotate; a new
// key listed under another name does not.
func TestRotateStaticMembers(t *testing.T) {
	s, dp := newFairServer(t, 0, "")
	s.set.Rate, s.set.Burst = 1000, 1000
	s.lim.member = map[proto.Key]*bucket{}
	old, newKey, other := testKey(t), testKey(t), testKey(t)
	s.set.Members[old.Public()] = "bob"
	s.set.Members[newKey.Public()] = "bob"
	s.set.Members[other.Public()] = "carol"
	addr := netip.MustParseAddrPort("10.0.1.1:40000")
	oldSes := &session{peer: old.Public(), name: "bob", addr: addr}
	server := netip.MustParseAddrPort("198.51.100.1:80")
	rep := serveReq(s, oldSes, proto.NewRequest(0, &proto.GrantRequest{Server: server}))
	s.flush()
	if rep.Reason != proto.OK {
		t.Fatal(rep.Reason)
	}
	m := s.leases.ByKey[dataplane.Key{Client: addr.Addr(), Port: detourOf(rep).Port()}]
	r, _ := collective.SignRotation(old, other.Public(), time.Now())
	if rep := serveReq(s, &session{peer: other.Public(), name: "carol", addr: addr}, proto.NewRequest(0, &proto.RotateRequest{Rotate: r})); rep.Reason != proto.ReasonUnauthorized {
		t.Fatalf("rotation to another listed member: %v", rep.Reason)
	}
	r, _ = collective.SignRotation(old, newKey.Public(), time.Now())
	if rep := serveReq(s, &session{peer: newKey.Public(), name: "bob", addr: addr}, proto.NewRequest(0, &proto.RotateRequest{Rotate: r})); rep.Reason != proto.OK {
		t.Fatalf("rotation between listed keys: %v", rep.Reason)
	}
	if m.Owner.Key != newKey.Public() || !mapped(dp, m.Key) {
		t.Fatal("mapping not carried over")
	}
}

// rotateTo rotates the fixture's member to a new certified key (same
// name) and returns the new key's session.
func (f *rotateFixture) rotateTo(t *testing.T, newKey proto.Key) *session {
	t.Helper()
	now := time.Now()
	ses := f.session(t, newKey.Public(), f.issue(t, newKey.Public(), "alice", now.Add(-time.Minute), now.Add(time.Hour)).Bytes())
	r, err := collective.SignRotation(f.old, newKey.Public(), now)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.rotate(ses, r); got != proto.OK {
		t.Fatalf("rotation: %v\n%s", got, f.logs.String())
	}
	return ses
}

// After a rotation, while the old certificate is still valid (two keys
// named alice), a conversion on a moved ticket is charged to the new key,
// and one that took its ticket before the rotation too.
func TestRotateConversionCharged(t *testing.T) {
	f := newRotateFixture(t)
	newKey := testKey(t)
	f.rotateTo(t, newKey)
	nk := newKey.Public()
	if !f.s.isMember(f.old.Public(), time.Now()) {
		t.Fatal("the old key should still be a member (certificate valid)")
	}
	var ticket [proto.TicketLen]byte
	for k := range f.s.conv.tickets.tickets {
		ticket = k
		break
	}
	member, key, err := f.s.conv.tickets.take(ticket[:], netip.AddrPortFrom(f.client, 40000), time.Now())
	if err != nil || member != "alice" || key != nk {
		t.Fatalf("moved ticket: %q %s %v", member, key.ID(), err)
	}
	f.s.ledgerConversion(convertDone{member: member, key: key, up: 100, down: 200, at: time.Now()})
	if e := f.s.fair.led.Members[nk]; e == nil || e.Consumed != 5300 {
		t.Fatalf("conversion on the new key not charged: %+v", e)
	}
	f.s.ledgerConversion(convertDone{member: "alice", key: f.old.Public(), up: 1000, at: time.Now()})
	if e := f.s.fair.led.Members[nk]; e == nil || e.Consumed != 6300 || f.s.fair.led.Members[f.old.Public()] != nil {
		t.Fatalf("conversion on an old ticket: new %+v old %+v", e, f.s.fair.led.Members[f.old.Public()])
	}
	// A key that is no member is not charged.
	stranger := testKey(t).Public()
	f.s.ledgerConversion(convertDone{member: "alice", key: stranger, up: 1000, at: time.Now()})
	if f.s.fair.led.Members[stranger] != nil {
		t.Fatal("a non-member key was charged")
	}
}

// ticketsOf counts the outstanding converter tickets of key.
func ticketsOf(s *Server, key proto.Key) int {
	n := 0
	for _, ti := range s.conv.tickets.tickets {
		if ti.key == key {
			n++
		}
	}
	return n
}

// mapped says whether the fake data plane holds k.
func mapped(dp *dataplane.Fake, k dataplane.Key) bool {
	_, ok := dp.Mapped(k)
	return ok
}

// serveReq is serveRequest's reply alone.
func serveReq(s *Server, ses *session, req proto.Request) proto.Reply {
	rep, _ := s.serveRequest(ses, req)
	return rep
}

// fakeTunnels is a WireGuard tunnel allocator of one peer per key whose
// byte counters the test sets; Rekey fails while failRekey is set (the
// device configuration refused: the old peer stays).
type fakeTunnels struct {
	peers     map[proto.Key]int64
	failRekey bool
}

func (f *fakeTunnels) Allocate(member proto.Key, _, _ netip.Addr) (proto.TunnelGrant, time.Duration, error) {
	if _, ok := f.peers[member]; !ok {
		f.peers[member] = 0
	}
	return proto.TunnelGrant{}, time.Minute, nil
}
func (f *fakeTunnels) Release(member proto.Key) { delete(f.peers, member) }
func (f *fakeTunnels) Close() error             { return nil }
func (f *fakeTunnels) Rekey(old, successor proto.Key) (bool, error) {
	if _, ok := f.peers[old]; !ok {
		return false, nil
	}
	if f.failRekey {
		return true, errors.New("configuring the device: injected failure")
	}
	delete(f.peers, old)
	f.peers[successor] = 0 // a new peer: counters start at zero
	return true, nil
}
func (f *fakeTunnels) Encap(proto.Key, netip.Addr, netip.Addr) (proto.EncapGrant, time.Duration, error) {
	return proto.EncapGrant{}, 0, &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonUnsupported}
}
func (f *fakeTunnels) EncapRelease(proto.Key) error {
	return &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonUnsupported}
}
func (f *fakeTunnels) Readmit(func(proto.Key) bool) (int, error) { return 0, nil }
func (f *fakeTunnels) WireGuardOffered() bool                    { return true }
func (f *fakeTunnels) Status() (*wgtypes.Device, error) {
	d := &wgtypes.Device{}
	for k, b := range f.peers {
		d.Peers = append(d.Peers, wgtypes.Peer{PublicKey: wgtypes.Key(k), ReceiveBytes: b})
	}
	return d, nil
}

// A tunnel that fails to move answers the rotation internal (the member
// retries) and keeps the old peer's byte baseline: its bytes are not
// charged twice; the retry moves it and answers OK.
func TestRotateTunnelMoveFails(t *testing.T) {
	f := newRotateFixture(t)
	old := f.old.Public()
	tun := &fakeTunnels{peers: map[proto.Key]int64{old: 1000}, failRekey: true}
	f.s.tunnels = tun
	now := time.Now()
	f.s.ledgerTunnels(now) // the old peer's 1,000 bytes: 5,000 + 1,000
	newKey := testKey(t)
	nk := newKey.Public()
	ses := f.session(t, nk, f.issue(t, nk, "alice", now.Add(-time.Minute), now.Add(time.Hour)).Bytes())
	r, err := collective.SignRotation(f.old, nk, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.rotate(ses, r); got != proto.ReasonInternal {
		t.Fatalf("rotation with a failed tunnel move answered %v, want internal", got)
	}
	if rotations(t, f.s, rotateInternal) != 1 || rotations(t, f.s, rotateOK) != 0 {
		t.Fatal("a failed tunnel move counted as ok")
	}
	if f.mapping.Owner.Key != nk {
		t.Fatal("the mapping did not move")
	}
	// The old peer is still there with its counters: the next reading
	// charges nothing again.
	f.s.ledgerTunnels(now)
	consumed := func() uint64 {
		var n uint64
		for _, e := range f.s.fair.led.Members {
			n += e.Consumed
		}
		return n
	}
	if c := consumed(); c != 6000 {
		t.Fatalf("after the failed move the ledger holds %d bytes, want 6000 (the old peer's bytes charged twice?)", c)
	}
	tun.peers[old] = 1500
	f.s.ledgerTunnels(now)
	if c := consumed(); c != 6500 {
		t.Fatalf("the old peer's next 500 bytes: ledger %d, want 6500", c)
	}
	// The member's retry moves the tunnel.
	tun.failRekey = false
	if got := f.rotate(ses, r); got != proto.OK {
		t.Fatalf("retried rotation: %v", got)
	}
	if _, ok := tun.peers[nk]; !ok {
		t.Fatal("the retry did not move the tunnel")
	}
	tun.peers[nk] = 200
	f.s.ledgerTunnels(now)
	if c := consumed(); c != 6700 {
		t.Fatalf("after the move: ledger %d, want 6700", c)
	}
	if e := f.s.fair.led.Members[nk]; e == nil || e.Consumed != 6700 {
		t.Fatalf("the new key's account: %+v", e)
	}
}

// The rotation record (renewals on the old key's sessions) exists only
// while the old key has sessions and is no longer than its membership:
// not made when the old key had no session, gone when the old key is
// revoked (with its sessions) or leaves the member list, or when the new
// key does.
func TestRotatedRecordLifetime(t *testing.T) {
	t.Run("no old session", func(t *testing.T) {
		f := newRotateFixture(t)
		old := f.old.Public()
		for _, id := range f.s.ses.byMember[old] {
			delete(f.s.ses.all, id)
		}
		delete(f.s.ses.byMember, old)
		f.rotateTo(t, testKey(t))
		if _, ok := f.s.ses.rotated[old]; ok {
			t.Fatal("rotation record kept for an old key without sessions: nothing would ever clear it")
		}
	})
	t.Run("old key revoked", func(t *testing.T) {
		f := newRotateFixture(t)
		old := f.old.Public()
		f.rotateTo(t, testKey(t))
		if _, ok := f.s.ses.rotated[old]; !ok {
			t.Fatal("no rotation record while the old key has a session")
		}
		f.s.set.Trust.Install(f.auth.Revoke(nil, time.Now(), f.oldCert.Serial))
		f.s.checkCollective(time.Now())
		if _, ok := f.s.ses.rotated[old]; ok {
			t.Fatal("rotation record outlived the old key's revocation")
		}
	})
	t.Run("old key leaves the list", func(t *testing.T) {
		f := newRotateFixture(t)
		old := f.old.Public()
		f.rotateTo(t, testKey(t))
		// What a reload without the old key runs (server.go reload).
		f.s.revokeKeys(func(k proto.Key) bool { return k != old }, "revoked")
		if _, ok := f.s.ses.rotated[old]; ok {
			t.Fatal("rotation record outlived the old key's membership")
		}
	})
	t.Run("new key revoked", func(t *testing.T) {
		f := newRotateFixture(t)
		old := f.old.Public()
		nk := testKey(t).Public()
		f.s.ses.rotated = map[proto.Key]proto.Key{old: nk}
		f.s.revokeKeys(func(k proto.Key) bool { return k != nk }, "revoked")
		if _, ok := f.s.ses.rotated[old]; ok {
			t.Fatal("rotation record outlived the new key's membership")
		}
		if len(f.s.ses.byMember[old]) == 0 {
			t.Fatal("the old key's session was dropped")
		}
	})
}

// Quotas follow the member, not the key: after a rotation (two keys
// named alice while the old certificate is valid), neither key gets
// mappings or converter tickets beyond alice's quota. (Each key used to
// have a quota of its own: repeated rotations multiplied it.)
func TestQuotaFollowsTheMember(t *testing.T) {
	f := newRotateFixture(t)
	f.s.set.QuotaPerMember = 2
	grant := func(ses *session, port uint16) proto.Reason {
		t.Helper()
		r := serveReq(f.s, ses, proto.NewRequest(0, &proto.GrantRequest{Server: netip.AddrPortFrom(f.server.Addr(), port)})).Reason
		f.s.flush()
		return r
	}
	if r := grant(f.oldSes, 1001); r != proto.OK {
		t.Fatalf("alice's second mapping: %v", r)
	}
	ses := f.rotateTo(t, testKey(t))
	if r := grant(f.oldSes, 1002); r != proto.ReasonQuota {
		t.Errorf("a third mapping on the old key after the rotation: %v, want quota", r)
	}
	if r := grant(ses, 1003); r != proto.ReasonQuota {
		t.Errorf("a third mapping on the new key: %v, want quota", r)
	}
	convert := func(ses *session, n int) (int, proto.Reason) {
		rep := serveReq(f.s, ses, proto.NewRequest(0, &proto.ConvertRequest{Count: uint8(n)}))
		if rep.Reason != proto.OK {
			return 0, rep.Reason
		}
		return len(rep.Body.(*proto.ConvertReply).Tickets), rep.Reason
	}
	got := 0
	for {
		n, r := convert(f.oldSes, proto.MaxTickets)
		if r != proto.OK {
			break
		}
		got += n
	}
	if n, r := convert(ses, 1); r != proto.ReasonQuota {
		t.Errorf("a ticket on the new key after the old one took the rest: %d, %v, want quota", n, r)
	}
	if total := got + 2; total != maxTicketsPerMember {
		t.Errorf("alice holds %d tickets over her two keys, quota %d", total, maxTicketsPerMember)
	}
}
