package trust

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// The keyring finds the key an initiation is addressed to by its mac1, and
// a key kept across a reload keeps its cookie jar.
func TestKeyringMatch(t *testing.T) {
	gen := func() proto.Key {
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	cur, prev, other, member := gen(), gen(), gen(), gen()
	kr := NewKeyring(cur, prev, nil)
	if len(kr.ids) != 2 || kr.ids[0].Priv != cur {
		t.Fatalf("keyring %+v", kr.ids)
	}
	init := func(to proto.Key) []byte {
		in, err := proto.NewInitiation(member, to.Public(), 7, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return in.Packet
	}
	if id := kr.Match(init(cur)); id == nil || id.Priv != cur {
		t.Fatal("initiation to the current key not matched to it")
	}
	if id := kr.Match(init(prev)); id == nil || id.Priv != prev {
		t.Fatal("initiation to the previous key not matched to it")
	}
	if id := kr.Match(init(other)); id != nil {
		t.Fatal("initiation to another key matched")
	}
	// The matched key completes the handshake; the other does not.
	pin, _ := proto.ParseInit(init(prev))
	if _, err := proto.ConsumeInitiation(kr.Match(init(prev)).Priv, pin); err != nil {
		t.Fatalf("handshake with the previous key: %v", err)
	}
	if _, err := proto.ConsumeInitiation(cur, pin); err == nil {
		t.Fatal("the current key accepted an initiation to the previous one")
	}
	// Rotation: prev dropped, cur becomes previous of a new key; cur's jar stays.
	next := gen()
	kr2 := NewKeyring(next, cur, kr)
	if kr2.ids[1] != kr.ids[0] || kr2.ids[0].Priv != next {
		t.Fatal("a kept key got a new identity")
	}
	if kr2.Match(init(prev)) != nil {
		t.Fatal("the dropped key still matches")
	}
	if len(NewKeyring(next, proto.Key{}, kr2).ids) != 1 {
		t.Fatal("no previous key: one identity expected")
	}
}

// A state file that does not parse stops the relay with an error naming it.
func TestBadStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, bad := range []string{"{", `{"version": 7}`, `{"version": 1, "timestamps": {"nokey": "00"}}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		ts := map[proto.Key]proto.Timestamp{}
		err := loadReplayState(path, ts)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("state %q: error %v, want one naming %s", bad, err, path)
		}
	}
}

func testKey(t *testing.T) proto.Key {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A reload of the same authority and crl_file keeps the live trust (and
// the newest revocation list seen, e.g. from gossip); another crl_file
// starts from the newer of the two lists; another authority replaces the
// live trust and forgets the certified keys.
func TestReloadKeepsTheLiveTrust(t *testing.T) {
	a, _ := collective.NewAuthority()
	b, _ := collective.NewAuthority()
	l1 := a.Revoke(nil, time.Now(), 1)
	l2 := a.Revoke(l1, time.Now(), 2)
	live := collective.NewTrust(a.Public())
	if _, err := live.Install(l2); err != nil { // learnt from gossip
		t.Fatal(err)
	}
	s := New(testKey(t), proto.Key{}, live)
	k := testKey(t).Public()
	s.Certified[k] = Member{Name: "alice", Serial: 9, NotAfter: time.Now().Add(time.Hour)}
	file := collective.NewTrust(a.Public())
	if _, err := file.Install(l1); err != nil {
		t.Fatal(err)
	}
	if s.Reload(file, "crl", "crl") || s.Live != live || s.Live.CRL().Seq != l2.Seq {
		t.Fatal("same authority and file: the live trust was not kept")
	}
	if s.Reload(file, "other-crl", "crl") || s.Live != file || s.Live.CRL().Seq != l2.Seq || len(s.Certified) != 1 {
		t.Fatalf("another crl_file: live %p (file %p), list %d, certified %d", s.Live, file, s.Live.CRL().Seq, len(s.Certified))
	}
	if !s.Reload(collective.NewTrust(b.Public()), "", "other-crl") || len(s.Certified) != 0 {
		t.Fatal("another authority: certified keys kept")
	}
}

// Revocation follows the member: revoking one certificate of a member ends
// the member's other keys whose certificates were issued no later than it,
// while a certificate issued after it (a rotation or re-issue) and other
// members stay served.
func TestRevocationFollowsTheMember(t *testing.T) {
	a, _ := collective.NewAuthority()
	live := collective.NewTrust(a.Public())
	s := New(testKey(t), proto.Key{}, live)
	now := time.Now()
	t0 := now.Add(-time.Hour).Truncate(time.Second)
	until := now.Add(time.Hour)
	laptop, phone, later, bob := testKey(t).Public(), testKey(t).Public(), testKey(t).Public(), testKey(t).Public()
	s.Certified[laptop] = Member{Name: "alice", Serial: 1, NotBefore: t0, NotAfter: until}
	s.Certified[phone] = Member{Name: "alice", Serial: 2, NotBefore: t0.Add(-time.Minute), NotAfter: until}
	s.Certified[bob] = Member{Name: "bob", Serial: 3, NotBefore: t0, NotAfter: until}
	for _, k := range []proto.Key{laptop, phone, bob} {
		if !s.CertifiedOK(k, now) {
			t.Fatalf("%s refused before any revocation", k.ID())
		}
	}
	if _, err := live.Install(a.Revoke(nil, now, 1)); err != nil {
		t.Fatal(err)
	}
	if s.CertifiedOK(laptop, now) {
		t.Fatal("the revoked certificate's key is still served")
	}
	if s.CertifiedOK(phone, now) {
		t.Fatal("revoking alice's laptop certificate left her phone key (certificate still valid) served")
	}
	if !s.CertifiedOK(bob, now) {
		t.Fatal("another member refused")
	}
	// The revoked key leaves Certified (the relay's sweep); the name stays
	// revoked, and a certificate issued after the revocation is served.
	delete(s.Certified, laptop)
	s.Certified[later] = Member{Name: "alice", Serial: 4, NotBefore: t0.Add(time.Minute), NotAfter: until}
	if _, err := live.Install(a.Revoke(live.CRL(), now, 99)); err != nil {
		t.Fatal(err)
	}
	if s.CertifiedOK(phone, now) || !s.CertifiedOK(later, now) {
		t.Fatalf("after a newer list: phone %v (want false), re-issued key %v (want true)", s.CertifiedOK(phone, now), s.CertifiedOK(later, now))
	}
	// Another authority forgets the names with the certified keys.
	b, _ := collective.NewAuthority()
	if !s.Reload(collective.NewTrust(b.Public()), "", "") || s.revokedNames != nil {
		t.Fatal("another authority kept the revoked names")
	}
}
