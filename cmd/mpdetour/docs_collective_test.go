package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayd"
)

// The discovery examples of docs/collective.md parse, with the files and
// keys they point at replaced by real ones.
func TestDocsCollectiveDiscoveryExamples(t *testing.T) {
	dir := t.TempDir()
	auth, _ := collective.NewAuthority()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	issue := func(k proto.Key, roles collective.Roles) string {
		c, err := auth.Issue(k.Public(), "x", roles, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return c.String()
	}
	rk, _ := proto.GenerateKey()
	mk, _ := proto.GenerateKey()
	r := strings.NewReplacer(
		"/etc/mpdetour/relay.key", write("relay.key", rk.String()),
		"/etc/mpdetour/relay.cert", write("relay.cert", issue(rk, collective.RoleRelay)),
		"/etc/mpdetour/crl.txt", write("crl.txt", auth.Revoke(nil, time.Now()).String()),
		"/etc/mpdetour/gossip.key", write("gossip.key", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI="),
		"/etc/mpdetour/member.key", write("member.key", mk.String()),
		"/etc/mpdetour/member.cert", write("member.cert", issue(mk, collective.RoleClient)),
		"mpdetour-authority-v1:...", auth.Public().String(),
		"<relay-a's public key>", rk.Public().String(),
	)
	relayYAML := r.Replace(yamlBlock(t, "collective.md", "gossip:"))
	p := write("relay.yaml", relayYAML)
	s, err := relayd.LoadConfig(p)
	if err != nil {
		t.Fatalf("docs/collective.md relay example: %v", err)
	}
	if s.Gossip == nil || s.Gossip.Region != "eu-west" || len(s.Gossip.Join) != 1 {
		t.Fatalf("gossip section: %+v", s.Gossip)
	}
	agentYAML := r.Replace(yamlBlock(t, "collective.md", "discovery:"))
	c, err := agentd.ParseConfig([]byte(agentYAML))
	if err != nil {
		t.Fatalf("docs/collective.md agent example: %v", err)
	}
	if c.Relays == nil || c.Relays.Discovery == nil || c.Relays.Discovery.Max != 4 {
		t.Fatalf("discovery: %+v", c.Relays)
	}
}
