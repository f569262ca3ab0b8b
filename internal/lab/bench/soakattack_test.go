package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A case passes the soak only when it ran and passed every run: none run,
// a failed run or a run that could not attack fails it.
func TestAttackChecks(t *testing.T) {
	checks := attackChecks([]SoakAttack{
		{Case: "a", Metric: "m", Target: "0", Runs: 3, Passed: 3, Values: []float64{0, 0.5, 0}},
		{Case: "b", Runs: 0},
		{Case: "c", Runs: 2, Passed: 1, Values: []float64{0, 3}},
		{Case: "d", Runs: 2, Passed: 1, Errors: 1, Values: []float64{0}},
	})
	want := map[string]bool{"attack a": true, "attack b": false, "attack c": false, "attack d": false}
	for _, c := range checks {
		if c.OK != want[c.Name] {
			t.Errorf("%s: ok %v, want %v (%s)", c.Name, c.OK, want[c.Name], c.Detail)
		}
	}
	if !strings.Contains(checks[0].Detail, "3 runs, 3 passed, 0 could not attack; m: 0, 0.5, 0 (target 0)") || !strings.Contains(checks[1].Detail, ": none (") {
		t.Errorf("details: %q, %q", checks[0].Detail, checks[1].Detail)
	}
}

// The agent's learned join limits are counted from its log lines.
func TestLearnedLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.log")
	log := `time=2026-11-27T03:49:44.000Z level=INFO msg="server subflow limit learned" server=10.0.3.2:5201 extra_subflows=1 recheck_after=30s
time=2026-11-27T03:49:45.000Z level=INFO msg="relay answers again" relay=detour1
time=2026-11-27T03:49:46.000Z level=INFO msg="server subflow limit learned" server=10.0.3.2:5201 extra_subflows=0 recheck_after=30s
`
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	n, first, err := learnedLimits(path)
	if err != nil || n != 2 || !strings.Contains(first, "extra_subflows=1") {
		t.Fatalf("learned %d (%q), %v", n, first, err)
	}
	if _, _, err := learnedLimits(filepath.Join(t.TempDir(), "none.log")); err == nil {
		t.Fatal("a missing log is not an error")
	}
}
