package design

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// Design is a generated design and how it runs; design.json in the output
// directory, so that --resume and --report use exactly the same points.
type Design struct {
	Seed       uint64   `json:"seed"`
	Space      Space    `json:"space"`
	LowBDP     float64  `json:"low_bdp_bytes"`
	Procedures []string `json:"procedures"`
	Duration   string   `json:"duration"`
	Warmup     string   `json:"warmup"`
	CC         string   `json:"cc"`
	// Trials per point and procedure (0 = 1).
	Trials int `json:"trials,omitempty"`
	// Paired: every procedure but converted runs in one run (runs/paired),
	// a point's trials interleaved on one lab build. Designs
	// written before it (false) keep one bench run per agent policy.
	Paired bool `json:"paired,omitempty"`
	// Order of the procedures within a point's rounds (paired runs):
	// OrderBalanced or OrderRotate. Paired designs written before the
	// field ran in OrderRotate; Load fills that in.
	Order string `json:"order,omitempty"`
	// MinDistance is the smallest distance between two points in the unit
	// cube (the WSP dmin).
	MinDistance float64 `json:"min_distance"`
	Points      []Point `json:"points"`
}

// Spec is what the user chooses.
type Spec struct {
	Space      Space
	Points     int
	Seed       uint64
	LowBDP     float64 // bytes; 0 = DefaultLowBDP
	Procedures string  // comma-separated; "" = every single path and mptcp
	Duration   time.Duration
	Warmup     time.Duration
	CC         string
	Trials     int // per point and procedure; 0 = 1
	// Sequential: the pre-issue-26 layout, one bench run per policy, each
	// point's lab rebuilt per run (kept to extend old designs).
	Sequential bool
	// Order of the paired runner (OrderBalanced, OrderRotate); "" = the
	// order recorded in the run being resumed, else OrderBalanced.
	Order string
}

// New generates the design of spec.
func New(spec Spec) (*Design, error) {
	if err := spec.Space.Validate(); err != nil {
		return nil, err
	}
	procs, err := ParseProcedures(spec.Procedures, spec.Space.Paths)
	if err != nil {
		return nil, err
	}
	if spec.Duration == 0 {
		spec.Duration = 10 * time.Second
	}
	if spec.Warmup == 0 {
		spec.Warmup = time.Second
	}
	if spec.Warmup >= spec.Duration {
		return nil, fmt.Errorf("duration %s must be longer than the warm-up %s", spec.Duration, spec.Warmup)
	}
	if err := validOrder(spec.Order); err != nil {
		return nil, err
	}
	if spec.Trials < 0 || spec.Trials > 100 {
		return nil, fmt.Errorf("trials %d: want 1..100", spec.Trials)
	}
	if spec.Trials == 1 {
		spec.Trials = 0 // the default, as design.json writes it
	}
	if spec.CC == "" {
		spec.CC = "cubic"
	}
	if spec.LowBDP == 0 {
		spec.LowBDP = DefaultLowBDP
	}
	unit, dmin, err := WSP(4*spec.Space.Paths, spec.Points, spec.Seed)
	if err != nil {
		return nil, err
	}
	d := &Design{
		Seed: spec.Seed, Space: spec.Space, LowBDP: spec.LowBDP,
		Duration: spec.Duration.String(), Warmup: spec.Warmup.String(), CC: spec.CC, Trials: spec.Trials,
		MinDistance: dmin, Points: spec.Space.Points(unit), Paired: !spec.Sequential,
	}
	if d.Paired {
		d.Order = spec.Order
	}
	for _, p := range procs {
		d.Procedures = append(d.Procedures, p.Name)
	}
	return d, nil
}

// DesignFile is the design's file in the output directory.
const DesignFile = "design.json"

// Save writes the design to dir/design.json.
func (d *Design) Save(dir string) error {
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, DesignFile), append(b, '\n'), 0o644)
}

// Load reads dir/design.json.
func Load(dir string) (*Design, error) {
	b, err := os.ReadFile(filepath.Join(dir, DesignFile))
	if err != nil {
		return nil, err
	}
	var d Design
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, DesignFile), err)
	}
	if d.Paired && d.Order == "" {
		d.Order = OrderRotate // written before the order was recorded
	}
	if err := validOrder(d.Order); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, DesignFile), err)
	}
	return &d, nil
}

// procs parses the design's procedure list.
func (d *Design) procs() ([]Proc, error) {
	return ParseProcedures(strings.Join(d.Procedures, ","), d.Space.Paths)
}

// run is one `lab bench` run of a design: the procedures that share an
// agent configuration. The first run holds the single-path procedures.
type run struct {
	Name   string // directory under runs/: the policy (+mechanisms), "default" or "converted"
	Policy string
	// Mechanisms of the run's MPTCP procedure (procedure name after "+").
	Mechanisms []Mechanism
	Procs      []Proc
	// Converted: the server node has MPTCP disabled and r2 runs the
	// converter (procedure converted only).
	Converted bool
}

func (d *Design) runs() ([]run, error) {
	ps, err := d.procs()
	if err != nil {
		return nil, err
	}
	var rs []run
	idx := map[string]int{}
	var single []Proc
	for _, p := range ps {
		if !p.MPTCP() {
			single = append(single, p)
			continue
		}
		name := p.Policy
		if name == "" {
			name = "default"
		}
		for _, m := range p.Mechanisms {
			name += "+" + m.Name
		}
		if p.Converted {
			name = ConvertedProcedure
		}
		if _, ok := idx[name]; !ok {
			idx[name] = len(rs)
			rs = append(rs, run{Name: name, Policy: p.Policy, Mechanisms: p.Mechanisms, Converted: p.Converted})
		}
		rs[idx[name]].Procs = append(rs[idx[name]].Procs, p)
	}
	// The converted run last: the runs with an MPTCP server first.
	slices.SortStableFunc(rs, func(a, b run) int {
		switch {
		case a.Converted == b.Converted:
			return 0
		case a.Converted:
			return 1
		}
		return -1
	})
	if len(single) > 0 {
		// The single-path cells go into the first run, whose server
		// speaks MPTCP (plain TCP does not care, but the converted run
		// stays the converted procedure alone).
		if len(rs) == 0 || rs[0].Converted {
			rs = append([]run{{Name: "default"}}, rs...)
		}
		rs[0].Procs = append(single, rs[0].Procs...)
	}
	return rs, nil
}

// scenario is the bench scenario of one run: one configuration per point.
func (d *Design) scenario(r run) (*scenario.Scenario, error) {
	s := &scenario.Scenario{
		Name:        "design-" + r.Name,
		Description: fmt.Sprintf("WSP design, %d points over %d paths, seed %d", len(d.Points), d.Space.Paths, d.Seed),
		Topology:    Topology,
		Roles:       scenario.Roles{Client: "client", Server: "server"},
		Trials:      max(1, d.Trials),
		CC:          d.CC,
		Set:         BaseSet(d.Space.Paths),
	}
	for k := 2; k <= d.Space.Paths; k++ {
		s.Roles.Detours = append(s.Roles.Detours, detourNode(k))
	}
	if r.Converted {
		off := false
		s.ServerMPTCP = &off
		s.Roles.Converter = ConverterNode
	}
	dur, err := time.ParseDuration(d.Duration)
	if err != nil {
		return nil, fmt.Errorf("design duration: %w", err)
	}
	warm, err := time.ParseDuration(d.Warmup)
	if err != nil {
		return nil, fmt.Errorf("design warm-up: %w", err)
	}
	s.Duration, s.Warmup = scenario.Duration(dur), scenario.Duration(warm)
	for _, p := range r.Procs {
		s.Procedures = append(s.Procedures, p.spec())
	}
	// In a seeded random order: WSP walks from each point to its nearest
	// neighbour, so in design order a run stopped early would have covered
	// one region; in random order it has a random subset of the design.
	for _, i := range rand.New(rand.NewPCG(d.Seed, 1)).Perm(len(d.Points)) {
		pt := d.Points[i]
		s.Configurations = append(s.Configurations, scenario.Configuration{Name: pt.ID, Set: pt.Set()})
	}
	// Through the parser, so the scenario is validated like a file.
	b, err := yaml.Marshal(s)
	if err != nil {
		return nil, err
	}
	ps, err := scenario.Parse("design:"+r.Name, b)
	if err != nil {
		return nil, err
	}
	// yaml.v3 writes a nil override list as [] and reads it back empty:
	// no override, the scenario's procedures.
	for i := range ps.Configurations {
		ps.Configurations[i].Procedures = nil
	}
	return ps, nil
}

// Options control Run.
type Options struct {
	Out      string
	Resume   bool
	LabName  string // default "design"
	Binary   string // mpdetour binary for relay and agent (required)
	Progress io.Writer
	Note     string
	// Interleave is passed to the bench runner (no effect with 1 trial).
	Interleave bool
	// Shard K of Shards (1-based) runs only the points whose index is
	// K-1 modulo Shards, into runs/NAME.shardK; shards can run at once
	// with different LabNames. Shards <= 1: every point, runs/NAME.
	Shard, Shards int
	// Only, when set, runs only the points with these IDs (a re-run of
	// chosen points of a design; the others stay unmeasured).
	Only map[string]bool
	// Limit (points) and Budget (wall clock) stop a paired run before
	// its next point once reached (0 = no limit): chunks of a long design
	// that --resume continues.
	Limit  int
	Budget time.Duration
}

// Run runs the design's remaining points into o.Out (design.json, runs/NAME
// with each bench run's trials, then results.json, report.md and the
// plots). A design already in o.Out must be the same design (--resume).
func Run(ctx context.Context, d *Design, o Options) (*Report, error) {
	if o.LabName == "" {
		o.LabName = "design"
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Shards > 1 && (o.Shard < 1 || o.Shard > o.Shards) {
		return nil, fmt.Errorf("shard %d of %d", o.Shard, o.Shards)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	if old, err := Load(o.Out); err == nil {
		if !sameDesign(old, d) {
			return nil, fmt.Errorf("%s holds another design (seed %d, %d points, %d paths): choose another --out", o.Out, old.Seed, len(old.Points), old.Space.Paths)
		}
		// A resumed run keeps the order its trials ran in.
		switch {
		case d.Order == "":
			d.Order = old.Order
		case d.Order != old.Order:
			return nil, fmt.Errorf("%s ran its trials in order %q, not %q: resume without --order, or choose another --out", o.Out, old.Order, d.Order)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if d.Paired && d.Order == "" {
		d.Order = OrderBalanced
	}
	if err := d.Save(o.Out); err != nil {
		return nil, err
	}
	if procs, err := d.procs(); err == nil {
		for _, m := range EqualArms(procs) {
			fmt.Fprintf(o.Progress, "design: note: %s\n", m)
		}
	}
	// An existing design without --resume is fine only for a shard's
	// first run: bench.Run refuses a run directory that holds trials.
	runs, err := d.runs()
	if err != nil {
		return nil, err
	}
	var runErr error
	if d.Paired {
		runErr = d.runPaired(ctx, o)
		// Only converted (its own server without MPTCP) stays a bench
		// run of its own, after the paired points.
		var conv []run
		for _, r := range runs {
			if r.Converted {
				conv = append(conv, r)
			}
		}
		runs = conv
		if runErr != nil || o.Limit > 0 || o.Budget > 0 {
			runs = nil // chunked: converted when the paired part is complete
		}
	}
	for _, r := range runs {
		cfg, err := Proc{Policy: r.Policy, Mechanisms: r.Mechanisms}.agentConfig()
		if err != nil {
			return nil, err
		}
		s, err := d.scenario(r)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(o.Out, "runs", r.Name)
		if o.Shards > 1 {
			dir += fmt.Sprintf(".shard%d", o.Shard)
			var cfgs []scenario.Configuration
			for i, c := range s.Configurations {
				if i%o.Shards == o.Shard-1 {
					cfgs = append(cfgs, c)
				}
			}
			s.Configurations = cfgs
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		resume := o.Resume
		if _, err := os.Stat(filepath.Join(dir, results.TrialsFile)); errors.Is(err, os.ErrNotExist) {
			resume = false
		}
		fmt.Fprintf(o.Progress, "design: run %s (%s) into %s\n", r.Name, strings.Join(procNames(r.Procs), ", "), dir)
		_, runErr = bench.Run(ctx, bench.Options{
			Scenario: s, Out: dir, Resume: resume, LabName: o.LabName, Binary: o.Binary,
			Progress: o.Progress, Note: o.Note, AgentConfig: cfg, Interleave: o.Interleave,
		})
		if runErr != nil {
			break
		}
	}
	rep, err := WriteReport(o.Out, d, o.Note)
	if runErr != nil {
		return rep, runErr
	}
	return rep, err
}

func procNames(ps []Proc) []string {
	var n []string
	for _, p := range ps {
		n = append(n, p.Name)
	}
	return n
}

// sameDesign compares the parts that decide what runs.
func sameDesign(a, b *Design) bool {
	return a.Seed == b.Seed && a.Space == b.Space && a.Duration == b.Duration && a.Warmup == b.Warmup && a.Trials == b.Trials && a.Paired == b.Paired &&
		a.CC == b.CC && reflect.DeepEqual(a.Points, b.Points) && reflect.DeepEqual(a.Procedures, b.Procedures)
}

func yamlScenario(s *scenario.Scenario) ([]byte, error) { return yaml.Marshal(s) }

// policyConfig is the agent configuration line for a policy, refused when
// this build's agent does not know the `policy:` key.
func policyConfig(policy string) (string, error) {
	if policy == "" {
		return "", nil
	}
	line := "policy: " + policy + "\n"
	if err := AgentHasPolicy(policy); err != nil {
		return "", err
	}
	return line, nil
}

// AgentHasPolicy checks that this build's agent configuration accepts
// `policy: POLICY` (the key is being added to the agent; until it is,
// designs run `mptcp` with the agent's default policy).
func AgentHasPolicy(policy string) error {
	if _, err := agentd.ParseFragment(""); err != nil {
		return fmt.Errorf("checking the agent's policy key: %w", err)
	}
	if _, err := agentd.ParseFragment("policy: " + policy + "\n"); err != nil {
		return fmt.Errorf("procedure mptcp-%s: this agent does not accept `policy: %s` (%v); run mptcp (the agent's default policy) instead", policy, policy, err)
	}
	return nil
}

// loadRecords reads the trials of every run of d in dir (all shards of
// it), by run name, and each shard directory's point start times.
func (d *Design) loadRecords(dir string) (map[string][]results.Record, []run, [][]time.Time, error) {
	runs, err := d.runs()
	if err != nil {
		return nil, nil, nil, err
	}
	out := map[string][]results.Record{}
	var starts [][]time.Time
	if d.Paired {
		ps, err := d.pairedProcs()
		if err != nil {
			return nil, nil, nil, err
		}
		var conv []run
		for _, r := range runs {
			if r.Converted {
				conv = append(conv, r)
			}
		}
		runs = append([]run{{Name: PairedRun, Procs: ps}}, conv...)
	}
	for _, r := range runs {
		dirs, err := filepath.Glob(filepath.Join(dir, "runs", r.Name+".shard*"))
		if err != nil {
			return nil, nil, nil, err
		}
		for _, sd := range append([]string{filepath.Join(dir, "runs", r.Name)}, dirs...) {
			p := filepath.Join(sd, results.TrialsFile)
			b, err := os.ReadFile(p)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, nil, nil, err
			}
			if len(bytes.TrimSpace(b)) == 0 {
				continue
			}
			recs, err := results.Load(p)
			if err != nil {
				return nil, nil, nil, err
			}
			out[r.Name] = append(out[r.Name], recs...)
			var st []time.Time
			seen := map[string]bool{}
			for _, rec := range recs {
				if !seen[rec.Configuration] {
					seen[rec.Configuration] = true
					st = append(st, rec.Start)
				}
			}
			starts = append(starts, st)
		}
	}
	return out, runs, starts, nil
}
