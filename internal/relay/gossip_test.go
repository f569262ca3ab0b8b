package relay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/roster"
)

func TestParseGossipConfig(t *testing.T) {
	priv := testKey(t)
	auth, _ := collective.NewAuthority()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	issue := func(k [32]byte, roles collective.Roles, nb, na time.Time) string {
		c, err := auth.Issue(k, "relay-a", roles, nb, na)
		if err != nil {
			t.Fatal(err)
		}
		return c.String()
	}
	cert := write("relay.cert", issue(priv.Public(), collective.RoleRelay, now.Add(-time.Hour), now.Add(time.Hour)))
	clientOnly := write("client.cert", issue(priv.Public(), collective.RoleClient, now.Add(-time.Hour), now.Add(time.Hour)))
	expired := write("expired.cert", issue(priv.Public(), collective.RoleRelay, now.Add(-2*time.Hour), now.Add(-time.Hour)))
	otherKey := write("other.cert", issue(testKey(t).Public(), collective.RoleRelay, now.Add(-time.Hour), now.Add(time.Hour)))
	secret := write("secret", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=\n")
	head := "private_key: " + priv.String() + "\nlisten: 10.0.0.1:45673\ncollective:\n  authority: " + auth.Public().String() + "\n"
	good := head + "  certificate_file: " + cert + "\n  gossip:\n    bind: 10.0.0.1:7946\n    join: [10.0.0.2:7946, relay-b.example:7946]\n    region: eu-west\n    secret_file: " + secret + "\n"
	s, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	g := s.Gossip
	if g == nil || g.Bind.String() != "10.0.0.1:7946" || g.Advertise != g.Bind || len(g.Join) != 2 || g.Region != "eu-west" ||
		len(g.Announce) != 1 || g.Announce[0] != s.Listen || g.Capacity != uint32(s.QuotaGlobal) || len(g.Secret) != 32 {
		t.Fatalf("gossip settings: %+v", g)
	}
	s, err = ParseConfig([]byte(head + "  certificate_file: " + cert + "\n  gossip: {advertise: 192.0.2.1:45675, secret_file: " + secret + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Gossip.Bind.Port() != roster.DefaultPort || s.Gossip.Announce[0].String() != "10.0.0.1:45673" {
		t.Fatalf("gossip defaults: %+v", s.Gossip)
	}
	bad := map[string]string{
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                       "collective.gossip.secret_file: required",
		head + "  gossip: {bind: 10.0.0.1:7946}\n":                                                                                                         "collective.certificate_file: required",
		head + "  certificate_file: " + clientOnly + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                 "role not granted",
		head + "  certificate_file: " + expired + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                    "expired",
		head + "  certificate_file: " + otherKey + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                   "not this relay's",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 0.0.0.0:7946}\n":                                                                        "collective.gossip.advertise: required",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: nowhere}\n":                                                                             "collective.gossip.bind",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, join: [nope]}\n":                                                         "collective.gossip.join[0]",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, region: \"\\x01\"}\n":                                                    "collective.gossip.region",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, capacity: -1}\n":                                                         "collective.gossip.capacity",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, secret_file: " + cert + "}\n":                                            "collective.gossip.secret_file",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, probe_timeout: 2s, secret_file: " + secret + "}\n":                       "probe_timeout",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, announce: [0.0.0.0:1]}\n":                                                "collective.gossip.announce[0]",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, bogus: 1}\n":                                                             "bogus",
		"private_key: " + priv.String() + "\nmembers: [{name: a, public_key: " + priv.Public().String() + "}]\ncollective: {gossip: {bind: 10.0.0.1:1}}\n": "needs collective.authority",
	}
	for cfg, want := range bad {
		_, err := ParseConfig([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q:\nerror %v, want one mentioning %q", cfg, err, want)
		}
	}
	// Errors carry the line of the field.
	_, err = ParseConfig([]byte(head + "  certificate_file: " + cert + "\n  gossip:\n    bind: 10.0.0.1:7946\n    join: [nope]\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "config:8:") {
		t.Errorf("join error not at line 8: %v", err)
	}
}
