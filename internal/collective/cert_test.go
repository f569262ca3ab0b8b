package collective

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func member(t *testing.T) proto.Key {
	t.Helper()
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

func authority(t *testing.T) *Authority {
	t.Helper()
	a, err := NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestCertificateRoundTripAndVerify(t *testing.T) {
	a := authority(t)
	m := member(t)
	c, err := a.Issue(m, "alice", RoleClient|RoleRelay, t0, t0.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseCertificate(c.String())
	if err != nil {
		t.Fatal(err)
	}
	if p.String() != c.String() || p.Name != "alice" || p.Member != m || p.Roles != RoleClient|RoleRelay {
		t.Fatalf("round trip: %+v vs %+v", p, c)
	}
	if err := p.Verify(a.Public(), t0.Add(time.Hour), nil, RoleRelay); err != nil {
		t.Fatal(err)
	}
	// Keys round trip through text too.
	a2, err := ParseAuthority(a.String())
	if err != nil || a2.Public() != a.Public() {
		t.Fatalf("authority key round trip: %v", err)
	}
	pub, err := ParseAuthorityKey(a.Public().String())
	if err != nil || pub != a.Public() {
		t.Fatalf("authority public key round trip: %v", err)
	}
}

func TestVerifyRefusals(t *testing.T) {
	a, other := authority(t), authority(t)
	m := member(t)
	c, _ := a.Issue(m, "bob", RoleClient, t0, t0.Add(time.Hour))
	crl := a.Revoke(nil, t0, c.Serial)
	tampered := *c
	tampered.Name = "mallory"
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"other authority", c.Verify(other.Public(), t0.Add(time.Minute), nil, 0)},
		{"tampered name", tampered.Verify(a.Public(), t0.Add(time.Minute), nil, 0)},
		{"not yet valid", c.Verify(a.Public(), t0.Add(-time.Minute), nil, 0)},
		{"expired", c.Verify(a.Public(), t0.Add(time.Hour), nil, 0)},
		{"revoked", c.Verify(a.Public(), t0.Add(time.Minute), crl, 0)},
		{"role", c.Verify(a.Public(), t0.Add(time.Minute), nil, RoleRelay)},
	} {
		want := map[string]error{"other authority": ErrForged, "tampered name": ErrForged, "not yet valid": ErrNotYetValid,
			"expired": ErrExpired, "revoked": ErrRevoked, "role": ErrRole}[tc.name]
		if !errors.Is(tc.err, want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, want)
		}
	}
}

func TestTrust(t *testing.T) {
	a := authority(t)
	m := member(t)
	c, _ := a.Issue(m, "carol", RoleClient, t0, t0.Add(time.Hour))
	tr := NewTrust(a.Public())
	now := t0.Add(time.Minute)
	if _, err := tr.Check(c.String(), m, RoleClient, now); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Check(c.String(), member(t), RoleClient, now); !errors.Is(err, ErrWrongMember) {
		t.Fatalf("certificate presented by another key: %v", err)
	}
	l1 := a.Revoke(nil, now, 42)
	l2 := a.Revoke(l1, now, c.Serial)
	if err := tr.UpdateCRL(l2.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Check(c.String(), m, RoleClient, now); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	// An older list (replayed) cannot un-revoke.
	if err := tr.UpdateCRL(l1.String()); err == nil || !strings.Contains(err.Error(), "not newer") {
		t.Fatalf("older list accepted: %v", err)
	}
	if err := tr.UpdateCRL(l2.String()); err != nil {
		t.Fatalf("same list again: %v", err)
	}
	// A list from another authority is refused.
	if err := tr.UpdateCRL(authority(t).Revoke(l2, now).String()); err == nil {
		t.Fatal("list of another authority accepted")
	}
	if !l2.Revoked(42) || !l2.Revoked(c.Serial) || l2.Revoked(43) || l2.Seq != 2 {
		t.Fatalf("list %+v", l2)
	}
}

func TestParseRefusals(t *testing.T) {
	a := authority(t)
	c, _ := a.Issue(member(t), "dave", RoleClient, t0, t0.Add(time.Hour))
	good := c.String()
	for _, s := range []string{"", "garbage", certPrefix + "!!!", certPrefix + "AAAA", good + "AA", strings.Replace(good, certPrefix, "mpdetour-cert-v2:", 1)} {
		if _, err := ParseCertificate(s); err == nil {
			t.Errorf("ParseCertificate(%q) accepted", s)
		}
	}
	if _, err := a.Issue(member(t), strings.Repeat("x", 65), RoleClient, t0, t0.Add(time.Hour)); err == nil {
		t.Error("65-byte name accepted")
	}
	if _, err := a.Issue(member(t), "ok", RoleClient, t0, t0); err == nil {
		t.Error("empty validity accepted")
	}
	if _, err := ParseRoles("client,admin"); err == nil {
		t.Error("unknown role accepted")
	}
}

func FuzzParseCertificate(f *testing.F) {
	a, _ := NewAuthority()
	k, _ := proto.GenerateKey()
	c, _ := a.Issue(k.Public(), "fuzz", RoleClient, t0, t0.Add(time.Hour))
	f.Add(c.String())
	f.Add(certPrefix)
	f.Add("mpdetour-cert-v1:AQEAAAAAAAAAAQ==")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCertificate(s)
		if err != nil {
			return
		}
		// Whatever parses re-encodes to the same text.
		if p, err := ParseCertificate(c.String()); err != nil || p.String() != c.String() {
			t.Fatalf("re-encode of %q: %v", s, err)
		}
		_ = c.Verify(a.Public(), t0, nil, RoleClient)
	})
}

func FuzzParseRevocationList(f *testing.F) {
	a, _ := NewAuthority()
	l := a.Revoke(nil, t0, 1, 2, 3)
	f.Add(l.String())
	f.Add(crlPrefix)
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := ParseRevocationList(s, a.Public()); err != nil {
			return
		}
	})
}

// FuzzParseCertificateBytes: the binary form a relay reads from the wire
// (OpCertify).
func FuzzParseCertificateBytes(f *testing.F) {
	a, _ := NewAuthority()
	k, _ := proto.GenerateKey()
	c, _ := a.Issue(k.Public(), "fuzz", RoleClient, t0, t0.Add(time.Hour))
	f.Add(c.Bytes())
	f.Add([]byte{1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCertificateBytes(b)
		if err != nil {
			return
		}
		if got := c.Bytes(); string(got) != string(b) {
			t.Fatalf("re-encodes to % x, want % x", got, b)
		}
		_ = c.Verify(a.Public(), t0, nil, RoleClient)
	})
}
