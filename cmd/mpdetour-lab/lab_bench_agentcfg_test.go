package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchAgentConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	procs := []string{"tcp", "mptcp-1sf", "mptcp-nat-static", "mptcp-nat-guard"}
	if got, err := benchAgentConfig("", procs); got != nil || err != nil {
		t.Fatalf("none: %q, %v", got, err)
	}
	g15r := write("g15r.yaml", "guard:\n  share: 0.15\n  starve: 1\n  rtt: 0")
	got, err := benchAgentConfig("guard="+g15r, procs)
	if err != nil || len(got) != 1 || got["guard"] != "guard:\n  share: 0.15\n  starve: 1\n  rtt: 0\n" {
		t.Fatalf("guard block: %q, %v; want it for guard only, with a final newline", got, err)
	}
	for _, c := range []struct{ spec, want string }{
		{"guard=" + write("policy.yaml", "policy: guard\n"), `key "policy" is given twice (first at line 1)`},
		{"guard=" + write("typo.yaml", "guard:\n  shar: 0.15\n"), `config:2:3: guard.shar: unknown key "shar"`},
		{"guard=" + write("range.yaml", "guard:\n  rtt: 11\n"), "config:2:"},
		{"guard=" + write("empty.yaml", "\n \n"), "is empty"},
		{"guard=" + filepath.Join(dir, "missing.yaml"), "no such file"},
		{"static=" + g15r, "guard: set, but the policy is static"},
		{"adaptive=" + g15r, "no procedure of this run has policy adaptive"},
		{"bogus=" + g15r, "bogus"},
		{g15r, "want POLICY=FILE"},
	} {
		_, err := benchAgentConfig(c.spec, procs)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.spec, err, c.want)
		}
	}
}
