package evaluation

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/evaluation/results"
	"github.com/mpdetour/mpdetour/internal/evaluation/scenario"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// labName is unique per test process: "te" + pid + counter.
var labCounter int

func labName() string {
	labCounter++
	return fmt.Sprintf("te%d-%d", os.Getpid()%100000, labCounter)
}

// checkClean fails t if namespaces of lab name remain.
func checkClean(t *testing.T, name string) {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, name+"-") {
			t.Errorf("namespace left behind: %s", l)
		}
	}
}

func TestRunSinglePathProcedures(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip")
	s, err := scenario.Parse("t.yaml", []byte(`
name: t
topology: brennan2017
trials: 2
duration: 3s
configurations: [{name: cl, set: {profile: core-limited}}]
procedures: [tcp, mptcp-1sf]
`))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	name := labName()
	t.Cleanup(func() { checkClean(t, name) })
	var progress strings.Builder
	d, err := Run(context.Background(), Options{Scenario: s, Out: out, LabName: name, Progress: &progress})
	t.Log(progress.String())
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.Load(filepath.Join(out, results.TrialsFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records, want 2 cells x 2 trials", len(recs))
	}
	for _, r := range recs {
		if r.Status != results.OK || r.GoodputMbps <= 0 || len(r.Subflows) != 1 || r.Subflows[0].Path != "default" {
			t.Errorf("record %+v", r)
		}
	}
	if c := d.Get("cl", "tcp"); c.Goodput.N != 2 {
		t.Errorf("report cell tcp: %+v", c.Goodput)
	}
	for _, f := range []string{"report.md", "results.json", "results.csv", "plot-cl.png", "plot-cl.svg", "scenario.yaml"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}
