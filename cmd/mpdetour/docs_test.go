package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/tunnels"
	"github.com/mpdetour/mpdetour/internal/relayd"
)

// yamlBlock returns the first ```yaml block of a doc that contains marker.
func yamlBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../docs", doc))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], marker) {
			return m[1]
		}
	}
	t.Fatalf("docs/%s has no yaml block with %q", doc, marker)
	return ""
}

// The configuration examples in the docs parse (only the key file they
// point at is replaced by a real one).
func TestDocsConfigExamplesParse(t *testing.T) {
	dir := t.TempDir()
	k, _ := proto.GenerateKey()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(k.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	relayYAML := strings.ReplaceAll(yamlBlock(t, "relay.md", "private_key_file"), "/etc/mpdetour/relay.key", keyFile)
	p := filepath.Join(dir, "relay.yaml")
	os.WriteFile(p, []byte(relayYAML), 0o644)
	s, err := relayd.LoadConfig(p)
	if err != nil {
		t.Fatalf("docs/relay.md example: %v", err)
	}
	if s.Tunnel == nil {
		t.Fatal("docs/relay.md example: no tunnel section parsed")
	}
	if _, err := tunnels.ParseConfig(s.Tunnel); err != nil {
		t.Fatalf("docs/relay.md example, tunnel section: %v", err)
	}
	agentYAML := strings.ReplaceAll(yamlBlock(t, "agent.md", "announced_subflows"), "/etc/mpdetour/member.key", keyFile)
	if _, err := agentd.ParseConfig([]byte(agentYAML)); err != nil {
		t.Fatalf("docs/agent.md example: %v", err)
	}
	for _, marker := range []string{"announce_interval", "name: unique, address: 10.0.31.2"} {
		if c, err := agentd.ParseConfig([]byte(yamlBlock(t, "agent.md", marker))); err != nil || c.Server == nil {
			t.Fatalf("docs/agent.md server-role example (%s): %v", marker, err)
		}
	}
}
