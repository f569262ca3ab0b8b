// Package bench runs benchmark scenarios in the lab (`mpdetour-lab
// bench`): for every configuration of a scenario it builds the lab, runs
// each procedure's trials, appends one record per trial, and writes JSON,
// CSV, a Markdown report and box plots. See docs/bench.md.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench/report"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/version"
)

// Options control a benchmark run.
type Options struct {
	Scenario *scenario.Scenario
	Out      string // result directory
	// Trials overrides every cell's trial count when > 0.
	Trials int
	// Duration overrides the scenario's transfer duration when > 0.
	Duration time.Duration
	Resume   bool
	// Interleave runs the trials in rounds (trial 1 of every cell, then
	// trial 2, ...) instead of cell by cell, so that a run stopped early
	// has every cell with about the same number of trials and slow changes
	// in the host's load spread over all cells. It rebuilds the lab for
	// each configuration in every round.
	Interleave bool
	// LabName is the lab (and namespace prefix) to build; default "bench".
	LabName string
	// Binary is the mpdetour executable started in lab nodes (relay,
	// agent, run, bench send); required.
	Binary string
	// Progress receives one line per trial; nil = discard.
	Progress io.Writer
	// Note is added to the report (e.g. why the run is partial).
	Note string
	// AgentConfig is YAML appended to every agent configuration the run
	// writes (e.g. "policy: adaptive\n" once the agent has that key).
	AgentConfig string
	// PolicyConfig: YAML appended to the agent configuration of the cells
	// whose procedure names policy POLICY (key; scenario.Policy), e.g. a
	// guard: block for the guard procedures only (the agent refuses it
	// beside another policy).
	PolicyConfig map[string]string
}

// Run executes the scenario's remaining trials and writes the outputs. On
// cancellation it stops after tearing down the lab, still writes the
// outputs from the trials done, and returns ctx's error.
func Run(ctx context.Context, o Options) (*report.Data, error) {
	s := o.Scenario
	if o.LabName == "" {
		o.LabName = "bench"
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Duration > 0 {
		if o.Duration <= time.Duration(s.Warmup) {
			return nil, fmt.Errorf("--duration %s must be longer than the warm-up %s", o.Duration, time.Duration(s.Warmup))
		}
		s.Duration = scenario.Duration(o.Duration)
	}
	if o.Trials > 0 {
		for i := range s.Configurations {
			s.Configurations[i].Trials = o.Trials
		}
	}
	if o.Binary == "" {
		return nil, errors.New("no mpdetour binary to start the daemons with (Options.Binary)")
	}
	store, old, err := results.Open(o.Out, o.Resume)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	for _, r := range old {
		if r.Scenario != s.Name {
			return nil, fmt.Errorf("%s holds results of scenario %q, not %q: choose another --out", o.Out, r.Scenario, s.Name)
		}
	}
	if err := saveScenario(o.Out, s); err != nil {
		return nil, err
	}

	r := &runner{o: o, s: s, store: store, recs: old, versions: versions(o.Binary)}
	runErr := r.run(ctx)
	d, werr := Write(o.Out, s, r.recs, o.Note)
	if runErr != nil {
		return d, runErr
	}
	return d, werr
}

// Write regenerates results.json, results.csv, report.md and the plots of
// dir from recs.
func Write(dir string, s *scenario.Scenario, recs []results.Record, note string) (*report.Data, error) {
	if err := results.WriteJSON(filepath.Join(dir, results.JSONFile), recs); err != nil {
		return nil, err
	}
	if err := results.WriteCSV(filepath.Join(dir, results.CSVFile), recs); err != nil {
		return nil, err
	}
	d := report.Build(s, recs)
	return d, d.WriteAll(dir, report.Meta{Generated: time.Now(), Host: hostDescription(), Note: note})
}

type runner struct {
	o        Options
	s        *scenario.Scenario
	store    *results.Store
	recs     []results.Record
	versions map[string]string

	// doneBy counts the trials recorded per cell (ok or failed);
	// unavailable cells are skipped for the rest of the run.
	doneBy      map[results.Key]int
	unavailable map[results.Key]bool

	// progress accounting
	total, done int
	started     time.Time
	ranNow      int
}

func (r *runner) run(ctx context.Context) error {
	r.doneBy = results.Done(r.recs)
	r.unavailable = map[results.Key]bool{}
	rounds := 1
	for _, c := range r.s.Cells() {
		k := results.Key{Configuration: c.Configuration, Cell: c.ID}
		r.total += c.Trials
		r.done += min(c.Trials, r.doneBy[k])
		if r.o.Interleave {
			rounds = max(rounds, c.Trials)
		}
	}
	r.started = time.Now()
	if r.done > 0 {
		fmt.Fprintf(r.o.Progress, "resuming %s: %d of %d trials already done\n", r.s.Name, r.done, r.total)
	}
	for round := 1; round <= rounds; round++ {
		for i := range r.s.Configurations {
			cfg := &r.s.Configurations[i]
			plan := map[results.Key]int{}
			var cells []scenario.Cell
			for _, c := range r.s.Cells() {
				k := results.Key{Configuration: c.Configuration, Cell: c.ID}
				limit := c.Trials
				if r.o.Interleave {
					limit = min(round, c.Trials)
				}
				if c.Configuration == cfg.Name && !r.unavailable[k] && r.doneBy[k] < limit {
					plan[k] = limit - r.doneBy[k]
					cells = append(cells, c)
				}
			}
			if len(cells) == 0 {
				continue
			}
			if err := r.configuration(ctx, cfg, cells, plan); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(r.o.Progress, "%s: done, %d trials recorded\n", r.s.Name, r.done)
	return nil
}

// configuration builds the lab for cfg, runs its cells and tears it down,
// also when ctx is cancelled half-way.
func (r *runner) configuration(ctx context.Context, cfg *scenario.Configuration, cells []scenario.Cell, remaining map[results.Key]int) (err error) {
	fmt.Fprintf(r.o.Progress, "[%s] lab up %s %s\n", cfg.Name, r.s.Topology, strings.Join(append(r.s.Set.Strings(), cfg.Set.Strings()...), " "))
	cl, err := OpenConfiguration(ctx, r.s, cfg, ConfigOptions{LabName: r.o.LabName, Binary: r.o.Binary, AgentConfig: r.o.AgentConfig, PolicyConfig: r.o.PolicyConfig, Flows: hasFlows(cells)})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := cl.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	for _, c := range cells {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := results.Key{Configuration: c.Configuration, Cell: c.ID}
		env, err := cl.CellEnv(c)
		if err != nil {
			return err
		}
		if err := r.cell(ctx, cfg, env, remaining[k]); err != nil {
			return err
		}
	}
	return nil
}

// ConfigOptions control OpenConfiguration.
type ConfigOptions struct {
	LabName     string // lab (namespace prefix); default "bench"
	Binary      string // mpdetour executable for daemons in lab nodes
	AgentConfig string // Env.AgentConfig of every cell
	// PolicyConfig is appended to Env.AgentConfig of the cells whose
	// procedure names that policy (Options.PolicyConfig).
	PolicyConfig map[string]string
	// Flows starts the flow sink (configurations with flow:).
	Flows bool
}

// ConfigLab is one configuration's lab, built, with the goodput receiver
// and the setup-latency responder running in the server node: cells run on
// it one session at a time (the bench runner runs its cells in turn; a
// paired design interleaves the trials of its procedures on it).
type ConfigLab struct {
	// Base is the environment every cell starts from (Cell and Dir unset).
	Base         Env
	policyConfig map[string]string
	tmp          string
	cleanup      []func() error
}

// OpenConfiguration builds the lab of configuration cfg of s (a lab of the
// same name left by a killed earlier run is taken down first) and starts
// the receivers. Close tears it all down; on error nothing is left.
func OpenConfiguration(ctx context.Context, s *scenario.Scenario, cfg *scenario.Configuration, o ConfigOptions) (_ *ConfigLab, err error) {
	if o.LabName == "" {
		o.LabName = "bench"
	}
	r := &runner{o: Options{LabName: o.LabName}, s: s}
	topo, err := r.topology(cfg)
	if err != nil {
		return nil, err
	}
	// A lab left by a killed earlier run would make Up fail; it is ours.
	_ = lab.Down(o.LabName)
	l, err := lab.Up(ctx, topo, o.LabName)
	if err != nil {
		return nil, fmt.Errorf("configuration %s: lab up: %w", cfg.Name, err)
	}
	cl := &ConfigLab{policyConfig: o.PolicyConfig}
	cl.cleanup = append(cl.cleanup, func() error {
		if derr := l.Down(); derr != nil {
			slog.Error("lab down", "lab", o.LabName, "err", derr)
			return derr
		}
		return nil
	})
	defer func() {
		if err != nil {
			cl.Close()
		}
	}()
	tmp, err := os.MkdirTemp("", "mpdetour-bench-")
	if err != nil {
		return nil, err
	}
	cl.tmp = tmp
	if os.Getenv("MPDETOUR_BENCH_KEEP") == "" { // debugging: keep daemon logs and configs
		cl.cleanup = append(cl.cleanup, func() error { return os.RemoveAll(tmp) })
	} else {
		fmt.Fprintf(os.Stderr, "daemon logs and configs kept in %s\n", tmp)
	}
	roles := s.RolesFor(cfg)
	for _, n := range append([]string{roles.Client, roles.Server}, roles.Detours...) {
		if l.NetnsName(n) == "" {
			return nil, fmt.Errorf("configuration %s: topology %s has no node %q (nodes: %s)", cfg.Name, s.Topology, n, strings.Join(l.Nodes(), ", "))
		}
	}
	cl.Base = Env{
		Lab: l, Roles: roles, CC: s.CC,
		Duration: time.Duration(s.Duration), Warmup: time.Duration(s.Warmup),
		Binary: o.Binary, Port: receiverPort, AgentConfig: o.AgentConfig, ReceiverLogDir: tmp,
		Download: s.Direction == "download", ServerMPTCP: s.ServerSpeaksMPTCP(),
	}
	base := &cl.Base
	if roles.Converter != "" && l.NetnsName(roles.Converter) == "" {
		return nil, fmt.Errorf("configuration %s: topology %s has no node %q (roles.converter)", cfg.Name, s.Topology, roles.Converter)
	}
	if !base.ServerMPTCP {
		// A server that does not speak MPTCP: its kernel refuses MPTCP
		// sockets, as on most of today's Internet.
		if err := l.Do(roles.Server, func() error {
			return os.WriteFile("/proc/sys/net/mptcp/enabled", []byte("0"), 0o644)
		}); err != nil {
			return nil, fmt.Errorf("configuration %s: MPTCP off in %s: %w", cfg.Name, roles.Server, err)
		}
	}
	if err := serverJoinLimits(l, roles.Server); err != nil {
		return nil, fmt.Errorf("configuration %s: %w", cfg.Name, err)
	}
	stop, err := startReceiver(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("configuration %s: goodput receiver: %w", cfg.Name, err)
	}
	cl.cleanup = append(cl.cleanup, func() error { stop(); return nil })
	lat, err := benchtool.ListenLatency(":"+strconv.Itoa(latencyPort), l.NetnsPath(roles.Server), base.ServerMPTCP)
	if err != nil {
		return nil, fmt.Errorf("configuration %s: latency responder: %w", cfg.Name, err)
	}
	cl.cleanup = append(cl.cleanup, func() error { lat.Close(); return nil })
	base.LatencyPort = latencyPort
	if o.Flows {
		sink, err := benchtool.ListenSink(":"+strconv.Itoa(flowPort), l.NetnsPath(roles.Server), base.ServerMPTCP, s.CC)
		if err != nil {
			return nil, fmt.Errorf("configuration %s: %w", cfg.Name, err)
		}
		cl.cleanup = append(cl.cleanup, func() error { sink.Close(); return nil })
		base.FlowPort = flowPort
	}
	return cl, nil
}

// CellEnv is the environment of cell c on this lab, with a fresh scratch
// directory (c.ID, plus a sequence number when the directory exists: a
// paired design sets up the same cell once per trial).
func (cl *ConfigLab) CellEnv(c scenario.Cell) (*Env, error) {
	env := cl.Base
	env.Cell = c
	if pol := scenario.Policy(c.Procedure); pol != "" {
		env.AgentConfig += cl.policyConfig[pol]
	}
	base := filepath.Join(cl.tmp, strings.ReplaceAll(c.ID, "/", "_")) // "/kK" cells
	env.Dir = base
	for i := 2; ; i++ {
		err := os.Mkdir(env.Dir, 0o700)
		if err == nil {
			return &env, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		env.Dir = base + "." + strconv.Itoa(i)
	}
}

// Close stops the receivers and takes the lab down (in reverse order of
// setup); it returns the first error.
func (cl *ConfigLab) Close() error {
	var first error
	for i := len(cl.cleanup) - 1; i >= 0; i-- {
		if err := cl.cleanup[i](); err != nil && first == nil {
			first = err
		}
	}
	cl.cleanup = nil
	return first
}

// receiverPort is where the goodput receiver listens in the server node,
// latencyPort its setup-latency responder (benchtool.ListenLatency).
const (
	receiverPort = 5201
	latencyPort  = 5202
	flowPort     = 5203 // the flow sink (configurations with flow:)
)

func hasFlows(cells []scenario.Cell) bool {
	for _, c := range cells {
		if c.Flow != nil {
			return true
		}
	}
	return false
}

// median of a non-empty slice.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// serverJoinLimits lets the server accept a join per detour: a new
// namespace accepts only 2 extra subflows, the K-detour study needs up to
// 8 (the kernel's maximum).
func serverJoinLimits(l *lab.Lab, server string) error {
	c, err := mptcppm.Dial(mptcppm.Options{NetNS: l.NetnsPath(server)})
	if err != nil {
		return fmt.Errorf("MPTCP limits in %s: %w", server, err)
	}
	defer c.Close()
	if err := c.SetLimits(mptcppm.Limits{Subflows: 8, AddAddrAccepted: 8}); err != nil {
		return fmt.Errorf("MPTCP limits in %s: %w", server, err)
	}
	return nil
}

func (r *runner) topology(cfg *scenario.Configuration) (*topology.Topology, error) {
	var t *topology.Topology
	var err error
	if _, serr := os.Stat(r.s.Topology); serr == nil || strings.ContainsAny(r.s.Topology, "/.") {
		p := r.s.Topology
		if !filepath.IsAbs(p) && !strings.HasPrefix(r.s.Source, "builtin:") {
			p = filepath.Join(filepath.Dir(r.s.Source), p)
		}
		t, err = topology.LoadFile(p)
	} else {
		t, err = topology.Builtin(r.s.Topology)
	}
	if err != nil {
		return nil, fmt.Errorf("scenario %s: topology: %w", r.s.Source, err)
	}
	for _, p := range append(append(scenario.Params(nil), r.s.Set...), cfg.Set...) {
		if err := t.Set(p.Key, p.Value); err != nil {
			return nil, fmt.Errorf("scenario %s: configuration %s: %w", r.s.Source, cfg.Name, err)
		}
	}
	return t, nil
}

// cell runs n trials of one cell.
func (r *runner) cell(ctx context.Context, cfg *scenario.Configuration, env *Env, n int) error {
	c := env.Cell
	key := results.Key{Configuration: c.Configuration, Cell: c.ID}
	first := r.doneBy[key] + 1
	base := results.Record{
		Scenario: r.s.Name, Configuration: c.Configuration, Cell: c.ID, Procedure: c.Procedure,
		Detours: c.Detours, CC: r.s.CC, Duration: env.Duration.Seconds(), Warmup: env.Warmup.Seconds(),
		Params: append(r.s.Set.Strings(), cfg.Set.Strings()...), Versions: r.versions,
	}
	if env.AgentConfig != "" {
		// What the cell's agents were given besides the procedure's own.
		base.Params = append(base.Params, "agent_config="+strings.ReplaceAll(strings.TrimSpace(env.AgentConfig), "\n", "; "))
	}
	proc, ok := Procedures()[c.Procedure]
	var sess Session
	var err error
	if !ok {
		err = Unavailable("procedure %s is not implemented", c.Procedure)
	} else {
		sess, err = proc(ctx, env)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rec := base
		rec.Start = time.Now().UTC()
		var ue *UnavailableError
		if errors.As(err, &ue) {
			rec.Status, rec.Reason = results.Unavailable, ue.Reason
			r.unavailable[key] = true
			r.total -= c.Trials - r.doneBy[key] // not run: not in the ETA
			fmt.Fprintf(r.o.Progress, "[%s] %s: unavailable: %s\n", c.Configuration, c.Label(), ue.Reason)
			return r.append(rec)
		}
		// A cell that cannot even start fails all its trials: resume
		// does not retry it in a loop, and the report shows why.
		fmt.Fprintf(r.o.Progress, "[%s] %s: setup failed: %v\n", c.Configuration, c.Label(), err)
		for i := 0; i < n; i++ {
			rec.Trial, rec.Status, rec.Reason = first+i, results.Failed, "setup: "+err.Error()
			if err := r.append(rec); err != nil {
				return err
			}
			r.done++
			r.doneBy[key]++
		}
		return nil
	}
	defer sess.Close()
	for i := 0; i < n; i++ {
		rec := base
		rec.Trial = first + i
		rec.Start = time.Now().UTC()
		m, err := sess.Trial(ctx, rec.Trial)
		if ctx.Err() != nil {
			return ctx.Err() // an interrupted trial is not recorded
		}
		rec.LoadAvg = loadAvg()
		rec.Attack = m.Attack
		if few, ok := err.(*FewSubflowsError); ok && scenario.ClosesSubflows(c.Procedure) {
			// The policy took a subflow out on purpose: a measurement
			// of it (the Measurement is complete), noted in the reason.
			rec.Reason, err = KeptFewSubflows+": "+few.Error(), nil
		}
		if err != nil {
			rec.Status, rec.Reason = results.Failed, err.Error()
		} else {
			rec.Status = results.OK
			rec.GoodputMbps, rec.WindowBytes, rec.Subflows = m.GoodputMbps, m.WindowBytes, m.Subflows
			rec.WindowS, rec.EqualBytes, rec.EqualGoodputMbps = m.WindowS, m.EqualBytes, m.EqualGoodputMbps
			rec.MaxGapS, rec.MaxGapEndS, rec.ResumeS, rec.TailMbps = m.MaxGapS, m.MaxGapEndS, m.ResumeS, m.TailMbps
			rec.Process = m.Process
			if len(m.SetupMs) > 0 {
				med := median(m.SetupMs)
				rec.SetupMs, rec.SetupAllMs = &med, m.SetupMs
			}
			rec.Churn = m.Churn
			rec.Collective = m.Collective
			if len(m.FCTMs) > 0 {
				med := median(m.FCTMs)
				rec.FCTMs, rec.FCTAllMs, rec.FlowBytes = &med, m.FCTMs, int64(c.Flow.Size)
			}
		}
		if err := r.append(rec); err != nil {
			return err
		}
		r.done++
		r.doneBy[key]++
		r.ranNow++
		r.progress(rec, c)
	}
	return nil
}

func (r *runner) append(rec results.Record) error {
	if err := r.store.Append(rec); err != nil {
		return fmt.Errorf("saving trial: %w", err)
	}
	r.recs = append(r.recs, rec)
	return nil
}

func (r *runner) progress(rec results.Record, c scenario.Cell) {
	elapsed := time.Since(r.started)
	eta := "?"
	if r.ranNow > 0 {
		left := time.Duration(float64(elapsed) / float64(r.ranNow) * float64(r.total-r.done))
		eta = left.Round(time.Second).String()
	}
	res := fmt.Sprintf("%.2f Mbit/s", rec.GoodputMbps)
	if rec.FCTMs != nil {
		res = fmt.Sprintf("%d flows of %s, median FCT %.2f ms (%.2f Mbit/s)", len(rec.FCTAllMs), scenario.ByteSize(rec.FlowBytes), *rec.FCTMs, rec.GoodputMbps)
	}
	if ch := rec.Churn; ch != nil {
		res += fmt.Sprintf(", %d of %d connections broken across %d route changes", ch.Broken, ch.Connections, ch.RouteChanges)
	}
	if rec.Status != results.OK {
		res = "FAILED: " + rec.Reason
	} else if len(rec.Subflows) > 1 {
		var parts []string
		for _, sf := range rec.Subflows {
			parts = append(parts, fmt.Sprintf("%s %.1f MB %.0f ms", sf.Path, float64(sf.Bytes)/1e6, sf.RTTms))
		}
		res += " (" + strings.Join(parts, ", ") + ")"
	}
	cells, full := 0, 0
	for _, x := range r.s.Cells() {
		k := results.Key{Configuration: x.Configuration, Cell: x.ID}
		if r.unavailable[k] {
			continue
		}
		cells++
		if r.doneBy[k] >= x.Trials {
			full++
		}
	}
	fmt.Fprintf(r.o.Progress, "[%d/%d cells, %d/%d trials, ETA %s] %s / %s #%d: %s\n",
		full, cells, r.done, r.total, eta, c.Configuration, c.Label(), rec.Trial, res)
}

func saveScenario(dir string, s *scenario.Scenario) error {
	b, err := marshalScenario(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "scenario.yaml"), b, 0o644)
}

// versions are the versions a trial depends on: the mpdetour binary the
// lab starts in its nodes (bin, asked with `version`), the lab's own, the
// Go release and the kernel.
func versions(bin string) map[string]string {
	v := map[string]string{"mpdetour": productVersion(bin), "mpdetour-lab": version.String(), "go": runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		v["kernel"] = unix.ByteSliceToString(u.Release[:])
	}
	return v
}

// loadAvg returns the 1-minute load average (0 if unknown).
func loadAvg() float64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return float64(si.Loads[0]) / 65536
}

func hostDescription() string {
	var u unix.Utsname
	k := "unknown kernel"
	if unix.Uname(&u) == nil {
		k = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("%s, %d CPUs", k, runtime.NumCPU())
}

// productVersion is what `bin version` prints after "mpdetour ".
func productVersion(bin string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return fmt.Sprintf("unknown (%s version: %v)", bin, err)
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "mpdetour ")
}

// Versions are the versions a trial record carries (the mpdetour binary
// bin, the lab, Go, kernel).
func Versions(bin string) map[string]string { return versions(bin) }

// LoadAvg is the host's 1-minute load average (0 if unknown).
func LoadAvg() float64 { return loadAvg() }
