package bench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

var labCounter int

// labName is unique per test process: "te" + pid + counter.
func labName() string {
	labCounter++
	return fmt.Sprintf("te%d-%d", os.Getpid()%100000, labCounter)
}

// checkClean fails t if namespaces of lab name or its daemons remain.
func checkClean(t *testing.T, name string) {
	t.Helper()
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, name+"-") {
			t.Errorf("namespace left behind: %s", l)
		}
	}
	for _, b := range []string{bin, labBin} {
		if b == "" {
			continue
		}
		if out, err := exec.Command("pgrep", "-f", b).Output(); err == nil {
			t.Errorf("processes of %s left behind: %s", b, out)
		}
	}
}

var (
	buildOnce, buildLabOnce sync.Once
	bin, labBin             string
	buildErr, buildLabErr   error
	binDirs                 []string // made here; removed by TestMain (a shared bin/ is not ours)
)

// binary builds cmd/mpdetour once: relay and agent run as processes in
// lab nodes, and the test binary is not mpdetour.
func binary(t *testing.T) string {
	t.Helper()
	testenv.Tools(t, "go")
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "te-bench-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDirs = append(binDirs, dir)
		bin, buildErr = testenv.BuildMpdetour(dir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// labBinary builds cmd/mpdetour-lab once, for the helpers the lab runs as
// its own commands in lab nodes (the converter's load generator).
func labBinary(t *testing.T) string {
	t.Helper()
	testenv.Tools(t, "go")
	buildLabOnce.Do(func() {
		dir, err := os.MkdirTemp("", "te-bench-labbin-")
		if err != nil {
			buildLabErr = err
			return
		}
		binDirs = append(binDirs, dir)
		labBin, buildLabErr = testenv.BuildCommand(dir, "mpdetour-lab")
	})
	if buildLabErr != nil {
		t.Fatal(buildLabErr)
	}
	return labBin
}

func TestMain(m *testing.M) {
	lab.Reexec()
	labtest.DownOnInterrupt() // the labs this process built go with it on Ctrl-C or SIGTERM
	code := m.Run()
	for _, d := range binDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// cancelAfter is a progress writer that cancels a run after n trial lines.
type cancelAfter struct {
	mu     sync.Mutex
	n      int
	cancel context.CancelFunc
	b      strings.Builder
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b.Write(p)
	if strings.Contains(string(p), " trials, ETA ") {
		if c.n--; c.n == 0 {
			c.cancel()
		}
	}
	return len(p), nil
}

// An interrupted run leaves nothing behind and keeps the finished trials;
// --resume runs only the missing ones.
func TestInterruptAndResume(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "pgrep")
	b := binary(t)
	s, err := scenario.Parse("t.yaml", []byte(`
name: t
topology: brennan2017
trials: 2
duration: 2s
configurations: [{name: cl, set: {profile: core-limited}}]
procedures: [tcp, mptcp-1sf]
`))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	name := labName()
	t.Cleanup(func() { checkClean(t, name) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pw := &cancelAfter{n: 1, cancel: cancel}
	_, err = Run(ctx, Options{Scenario: s, Out: out, LabName: name, Binary: b, Progress: pw})
	t.Log(pw.b.String())
	if err != context.Canceled {
		t.Fatalf("interrupted run returned %v, want context.Canceled", err)
	}
	checkClean(t, name)
	recs, err := results.Load(filepath.Join(out, results.TrialsFile))
	if err != nil || len(recs) != 1 || recs[0].Cell != "tcp" || recs[0].Trial != 1 {
		t.Fatalf("after interrupt: %+v, %v", recs, err)
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); err != nil {
		t.Fatalf("interrupted run wrote no report: %v", err)
	}

	if _, err := Run(context.Background(), Options{Scenario: s, Out: out, LabName: name, Binary: b}); err == nil {
		t.Fatal("a second run into the same --out without resume was accepted")
	}
	var progress strings.Builder
	// Resumed in rounds: the missing trial 1 of mptcp-1sf first, then
	// trial 2 of each.
	d, err := Run(context.Background(), Options{Scenario: s, Out: out, LabName: name, Binary: b, Resume: true, Interleave: true, Progress: &progress})
	t.Log(progress.String())
	if err != nil {
		t.Fatal(err)
	}
	recs, err = results.Load(filepath.Join(out, results.TrialsFile))
	if err != nil || len(recs) != 4 {
		t.Fatalf("after resume: %d records, %v", len(recs), err)
	}
	var order []string
	seen := map[string]bool{}
	for _, r := range recs {
		key := fmt.Sprintf("%s#%d", r.Cell, r.Trial)
		order = append(order, key)
		if seen[key] {
			t.Errorf("trial %s run twice", key)
		}
		seen[key] = true
		if r.Status != results.OK || r.GoodputMbps <= 0 || len(r.Subflows) != 1 || r.Subflows[0].Path != "default" || r.CC != "cubic" {
			t.Errorf("record %+v", r)
		}
	}
	if got := strings.Join(order, " "); got != "tcp#1 mptcp-1sf#1 tcp#2 mptcp-1sf#2" {
		t.Errorf("trial order %s, want rounds", got)
	}
	if c := d.Get("cl", "mptcp-1sf"); c.Goodput.N != 2 {
		t.Errorf("report cell mptcp-1sf: %+v", c.Goodput)
	}
}

// TestSmoke runs the built-in smoke scenario (every procedure once, 3 s)
// end to end and checks that every output exists and parses. No
// performance assertions: CI machines are shared.
func TestSmoke(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "pgrep")
	b := binary(t)
	s, err := scenario.Builtin("smoke")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	name := labName()
	t.Cleanup(func() { checkClean(t, name) })
	var progress strings.Builder
	d, err := Run(context.Background(), Options{Scenario: s, Out: out, LabName: name, Binary: b, Progress: &progress})
	t.Log(progress.String())
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.Load(filepath.Join(out, results.TrialsFile))
	if err != nil {
		t.Fatal(err)
	}
	byCell := map[string]results.Record{}
	for _, r := range recs {
		byCell[r.Cell] = r
	}
	for _, c := range s.Cells() {
		r, ok := byCell[c.ID]
		switch {
		case !ok:
			t.Errorf("%s: no record", c.ID)
		case r.Status == results.Failed:
			t.Errorf("%s failed: %s", c.ID, r.Reason)
		case r.Status == results.Unavailable:
			// A component not in this build is reported, not faked.
			t.Logf("%s unavailable: %s", c.ID, r.Reason)
		case r.GoodputMbps <= 0 || len(r.Subflows) == 0:
			t.Errorf("%s: ok without goodput or subflows: %+v", c.ID, r)
		}
	}
	// The single-path and NAT procedures need only lab, goodput, relay and
	// agent, which are all in this tree.
	for _, id := range []string{"tcp", "mptcp-1sf", "tcp-nat", "mptcp-nat"} {
		if byCell[id].Status != results.OK {
			t.Errorf("%s: status %q", id, byCell[id].Status)
		}
	}
	if r := byCell["mptcp-nat"]; len(r.Subflows) != 2 || r.Subflows[1].Path != "nat:detour" && r.Subflows[0].Path != "nat:detour" {
		t.Errorf("mptcp-nat subflows %+v", r.Subflows)
	}

	var all []results.Record
	if b, err := os.ReadFile(filepath.Join(out, results.JSONFile)); err != nil || json.Unmarshal(b, &all) != nil || len(all) != len(recs) {
		t.Errorf("results.json: %d records, %v", len(all), err)
	}
	f, err := os.Open(filepath.Join(out, results.CSVFile))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil || len(rows) != len(recs)+1 {
		t.Errorf("results.csv: %d rows, %v", len(rows), err)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil || !strings.Contains(string(md), "# Benchmark report: smoke") || !strings.Contains(string(md), "plot-core-limited.png") {
		t.Errorf("report.md: %v\n%s", err, md)
	}
	pf, err := os.Open(filepath.Join(out, "plot-core-limited.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if _, err := png.Decode(pf); err != nil {
		t.Errorf("plot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "plot-core-limited.svg")); err != nil {
		t.Error(err)
	}
	if len(d.Gains()) == 0 {
		t.Error("no gain line for the MPTCP detour procedures")
	}
}

func TestResumeAfter(t *testing.T) {
	f := &scenario.Fault{Link: "C1", At: scenario.Duration(4 * time.Second), For: scenario.Duration(4 * time.Second)}
	pathOf := func(k string) string {
		switch k {
		case "a":
			return "default"
		case "b", "b2":
			return "nat:detour1"
		}
		return ""
	}
	pt := func(t float64, b map[string]uint64) benchtool.SeriesPoint {
		return benchtool.SeriesPoint{T: t, Bytes: b}
	}
	series := []benchtool.SeriesPoint{
		pt(7.9, map[string]uint64{"a": 100, "b": 50}),
		pt(8.1, map[string]uint64{"a": 150, "b": 50}),  // the default path only
		pt(8.6, map[string]uint64{"a": 200, "b2": 0}),  // the detour subflow replaced
		pt(9.3, map[string]uint64{"a": 250, "b2": 10}), // the replacement delivers
		pt(9.9, map[string]uint64{"a": 300, "b2": 20, "b": 60}),
	}
	if got := resumeAfter(series, f, pathOf); got == nil || *got < 1.29 || *got > 1.31 {
		t.Fatalf("resume %v, want 1.3 s (the replacement's first bytes)", got)
	}
	if got := resumeAfter(series[:3], f, pathOf); got == nil || *got != -1 {
		t.Fatalf("resume %v, want -1 (never before the end)", got)
	}
	f.Link = "C5"
	if got := resumeAfter(series, f, pathOf); got != nil {
		t.Fatalf("resume %v for a link no subflow uses, want unknown", *got)
	}
	if got := resumeAfter(nil, f, pathOf); got != nil {
		t.Fatal("resume without samples")
	}
}

func TestTailRate(t *testing.T) {
	pt := func(t float64, b map[string]uint64) benchtool.SeriesPoint {
		return benchtool.SeriesPoint{T: t, Bytes: b}
	}
	series := []benchtool.SeriesPoint{
		pt(9.0, map[string]uint64{"a": 1_000_000, "b": 500_000}),
		pt(10.0, map[string]uint64{"a": 2_000_000, "b": 1_000_000}),
		pt(11.0, map[string]uint64{"a": 3_000_000, "b": 1_250_000}), // b closes after this sample
		pt(12.0, map[string]uint64{"a": 4_000_000, "c": 250_000}),   // c is new
	}
	// From 10 s: a +2 MB, b +0.25 MB, c +0.25 MB = 2.5 MB in 2 s = 10 Mbit/s.
	if got := tailRate(series, 10); got == nil || *got < 9.99 || *got > 10.01 {
		t.Fatalf("tail %v, want 10 Mbit/s", got)
	}
	if got := tailRate(series, 12); got != nil {
		t.Fatalf("tail %v with no sample after 12 s, want unknown", *got)
	}
	if got := tailRate(series, 8); got != nil {
		t.Fatalf("tail %v with no sample before 8 s, want unknown", *got)
	}
}

// Options.PolicyConfig reaches only the cells whose procedure names that
// policy, after the run's AgentConfig.
func TestCellEnvPolicyConfig(t *testing.T) {
	cl := &ConfigLab{Base: Env{AgentConfig: "all: 1\n"}, policyConfig: map[string]string{"guard": "guard:\n  share: 0.15\n"}, tmp: t.TempDir()}
	for _, c := range []struct{ proc, want string }{
		{scenario.MPTCPNATGuard, "all: 1\nguard:\n  share: 0.15\n"},
		{scenario.MPTCPNATStatic, "all: 1\n"},
		{scenario.MPTCP1, "all: 1\n"},
	} {
		env, err := cl.CellEnv(scenario.Cell{ID: c.proc, Procedure: c.proc})
		if err != nil {
			t.Fatal(err)
		}
		if env.AgentConfig != c.want {
			t.Errorf("%s: agent config %q, want %q", c.proc, env.AgentConfig, c.want)
		}
	}
	if cl.Base.AgentConfig != "all: 1\n" {
		t.Errorf("the base changed: %q", cl.Base.AgentConfig)
	}
}
