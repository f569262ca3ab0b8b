package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestDeployRecipe follows docs/deploy.md on three namespaces standing in for
// the server, the relay and the client (scripts/deploy-recipe.sh runs every
// block of the page in its host's namespace, the units' ExecStartPre and
// ExecStart lines included) and checks that a transfer got a subflow through
// the relay. The example configs in deploy/ pass --check on the way.
func TestDeployRecipe(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft", "python3", "sysctl")
	bin := mpdetourBin(t)
	cmd := exec.Command("bash", "scripts/deploy-recipe.sh", bin)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("deploy recipe: %v", err)
	}
	if !strings.Contains(string(out), "deploy-recipe: ok") {
		t.Fatal("the recipe did not report ok")
	}
}

// TestDeployUnits checks the systemd units with systemd-analyze (when the
// machine has it), pointing them at a real binary.
func TestDeployUnits(t *testing.T) {
	testenv.Tools(t, "systemd-analyze")
	bin := mpdetourBin(t)
	dir := t.TempDir()
	for _, u := range []string{"mpdetour-relay.service", "mpdetour-agent.service"} {
		b, err := os.ReadFile(filepath.Join("../../deploy", u))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, u)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/mpdetour", bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("systemd-analyze", "verify", p).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
}
