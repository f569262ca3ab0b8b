package relay

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// A collective relay serves a key it does not list once it presents a
// certificate of the authority; refuses one without, or with a forged,
// wrong-key or role-less certificate; and drops a revoked member (sessions,
// mappings) within seconds of the new revocation list appearing.
func TestCollectiveCertificates(t *testing.T) {
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := collective.NewAuthority()
	dir := t.TempDir()
	crlPath := filepath.Join(dir, "crl.txt")
	crl := auth.Revoke(nil, time.Now())
	if err := os.WriteFile(crlPath, []byte(crl.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	l := startLoopRelay(t, func(c *Reloadable) {
		c.Trust, c.CRLFile = collective.NewTrust(auth.Public()), crlPath
		if err := c.Trust.UpdateCRL(crl.String()); err != nil {
			t.Fatal(err)
		}
	})
	k := l.k
	now := time.Now()
	bob, err := auth.Issue(k.stranger.Public(), "bob", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(cert []byte) *relayconn.Conn { return l.dial(t, k.stranger, cert) }
	server := netip.MustParseAddrPort(fxServer + ":5201")
	grant := func(c *relayconn.Conn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, _, err := c.Grant(ctx, server, 0)
		return err
	}
	forged, _ := other.Issue(k.stranger.Public(), "bob", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	wrongKey, _ := auth.Issue(k.member.Public(), "alice2", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	relayOnly, _ := auth.Issue(k.stranger.Public(), "bob", collective.RoleRelay, now.Add(-time.Minute), now.Add(time.Hour))
	for name, cert := range map[string][]byte{"none": nil, "forged": forged.Bytes(), "another key's": wrongKey.Bytes(), "relay-only": relayOnly.Bytes()} {
		if err := grant(dial(cert)); err == nil {
			t.Fatalf("grant with %s certificate succeeded", name)
		}
	}
	c := dial(bob.Bytes())
	if err := grant(c); err != nil {
		t.Fatalf("grant with a valid certificate: %v", err)
	}
	waitFor(t, "attribution to the certified name", func() bool {
		for _, ev := range readAttribution(t, l.attrLog) {
			if ev.Event == "grant" && ev.Member == "bob" && ev.KeyID == k.stranger.Public().ID() {
				return true
			}
		}
		return false
	})
	if n := l.dp.Len(); n != 1 {
		t.Fatalf("%d mappings in the data plane, want 1", n)
	}
	st := l.status(t)
	certified := false
	for _, m := range st.Members {
		if m.Name == "bob" && m.Key == k.stranger.Public().String() && !m.CertifiedUntil.IsZero() && len(m.Mappings) == 1 {
			certified = true
		}
	}
	if !certified {
		t.Fatalf("relay status does not list bob as a certified member with his mapping: %+v", st.Members)
	}
	// Revocation: a new list, written atomically as an operator would.
	crl = auth.Revoke(crl, time.Now(), bob.Serial)
	tmp := crlPath + ".new"
	if err := os.WriteFile(tmp, []byte(crl.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	if err := os.Rename(tmp, crlPath); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the revoked member's mapping removed", func() bool { return l.dp.Len() == 0 })
	took := time.Since(revokedAt)
	if err := grant(c); proto.ReasonOf(err) != proto.ReasonUnauthorized && err == nil {
		t.Fatalf("grant after revocation: %v", err)
	}
	t.Logf("revoked member refused %v after the new list was written (target 10 s)", took.Round(100*time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("revocation took %v, more than 10 s", took)
	}
}

// A member whose agent carries a certificate keeps working on relays that
// list its key: one without a collective (answers unsupported to the
// certificate) and a collective one where the certificate has expired.
func TestCertificateOnListingRelays(t *testing.T) {
	auth, _ := collective.NewAuthority()
	for _, withCollective := range []bool{false, true} {
		t.Run(fmt.Sprintf("collective=%v", withCollective), func(t *testing.T) {
			l := startLoopRelay(t, func(c *Reloadable) {
				if withCollective {
					c.Trust = collective.NewTrust(auth.Public())
				}
			})
			k := l.k
			now := time.Now()
			expired, err := auth.Issue(k.member.Public(), "alice", collective.RoleClient, now.Add(-2*time.Hour), now.Add(-time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			c := l.dial(t, k.member, expired.Bytes())
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0); err != nil {
				t.Fatalf("listed member with a certificate: %v", err)
			}
		})
	}
}
