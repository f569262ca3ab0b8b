package design

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// PairedRun is the run directory (under runs/) of a paired design: every
// procedure except converted, all of a point's trials on one lab build.
const PairedRun = "paired"

// pairedScenarioName is the scenario name the paired trial records carry.
const pairedScenarioName = "design-paired"

// order is the design's points in the seeded random order they run in (a
// run stopped early has a random subset of the design).
func (d *Design) order() []Point {
	var pts []Point
	for _, i := range rand.New(rand.NewPCG(d.Seed, 1)).Perm(len(d.Points)) {
		pts = append(pts, d.Points[i])
	}
	return pts
}

// mssBytes is the TCP payload per segment the path model assumes.
const mssBytes = 1448

// ModelMbps is what one cubic TCP flow is expected to get on p: the
// capacity, or the loss-limited rate of the Mathis et al. model
// (MSS/RTT × 1.22/√p) when that is lower. It only chooses the path of
// mptcp-1sf; the design measures the real goodput.
func (p Path) ModelMbps() float64 {
	r := p.CapacityMbps
	if p.LossPct > 0 && p.RTTms > 0 {
		r = min(r, mssBytes*8/(p.RTTms/1000)*1.22/math.Sqrt(p.LossPct/100)/1e6)
	}
	return r
}

// BestPath is the 1-based path with the highest ModelMbps (the first on
// a tie): the path mptcp-1sf runs over.
func (pt Point) BestPath() int {
	best := 1
	for i, p := range pt.Paths {
		if p.ModelMbps() > pt.Paths[best-1].ModelMbps() {
			best = i + 1
		}
	}
	return best
}

// cell is the bench cell running p at point pt.
func (d *Design) cell(p Proc, pt Point) scenario.Cell {
	c := scenario.Cell{Configuration: pt.ID, ID: p.Name, Trials: max(1, d.Trials)}
	switch {
	case p.OneSubflow:
		k := p.OnePath
		if k == 0 {
			k = pt.BestPath()
		}
		c.Procedure = scenario.MPTCP1
		if k > 1 {
			c.Procedure, c.Detours = scenario.MPTCP1NAT, []string{detourNode(k)}
		}
	case p.Path == 1:
		c.Procedure = scenario.TCP
	case p.Path > 1:
		c.Procedure, c.Detours = scenario.TCPNAT, []string{detourNode(p.Path)}
	default:
		c.Procedure = scenario.MPTCPNAT
		for k := 2; k <= d.Space.Paths; k++ {
			c.Detours = append(c.Detours, detourNode(k))
		}
	}
	return c
}

// pairedProcs are the procedures of the paired run: all but converted.
func (d *Design) pairedProcs() ([]Proc, error) {
	ps, err := d.procs()
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, p := range ps {
		if !p.Converted {
			out = append(out, p)
		}
	}
	return out, nil
}

// pairedScenario is the scenario of the paired run (topology, roles,
// durations, one configuration per point in run order): what the lab of a
// point is built from and what scenario.yaml records.
func (d *Design) pairedScenario() (*scenario.Scenario, error) {
	ps, err := d.pairedProcs()
	if err != nil {
		return nil, err
	}
	// The scenario's procedure list only records what the cells are (the
	// paired runner builds them per point): each bench procedure once.
	var uniq []Proc
	seen := map[string]bool{}
	for _, p := range ps {
		if id := p.cellID(); !seen[id] {
			seen[id] = true
			uniq = append(uniq, p)
		}
	}
	s, err := d.scenario(run{Name: PairedRun, Procs: uniq})
	if err != nil {
		return nil, err
	}
	s.Name = pairedScenarioName
	return s, nil
}

// runPaired runs the paired part of the design: per point one lab build,
// then round by round every procedure in the design's order
// (roundOrder: a seeded Williams design, or the old rotation), one session per
// trial (relays and agent started for it and stopped after it, so that
// each MPTCP procedure gets its own agent configuration and no procedure
// inherits another's state). Finished trials are skipped (resume);
// o.Limit and o.Budget stop it between points.
func (d *Design) runPaired(ctx context.Context, o Options) error {
	ps, err := d.pairedProcs()
	if err != nil || len(ps) == 0 {
		return err
	}
	s, err := d.pairedScenario()
	if err != nil {
		return err
	}
	if o.Binary == "" {
		return errors.New("no mpdetour binary to start the daemons with (Options.Binary)")
	}
	dir := filepath.Join(o.Out, "runs", PairedRun)
	if o.Shards > 1 {
		dir += fmt.Sprintf(".shard%d", o.Shard)
	}
	resume := o.Resume
	if _, err := os.Stat(filepath.Join(dir, results.TrialsFile)); errors.Is(err, os.ErrNotExist) {
		resume = false
	}
	store, old, err := results.Open(dir, resume)
	if err != nil {
		return err
	}
	defer store.Close()
	if b, err := yamlScenario(s); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "scenario.yaml"), b, 0o644)
	}
	done := results.Done(old)
	unavailable := map[string]bool{}
	for _, r := range old {
		if r.Status == results.Unavailable {
			unavailable[r.Cell] = true
		}
	}
	byName := map[string]Proc{}
	var names []string
	for _, p := range ps {
		byName[p.Name] = p
		names = append(names, p.Name)
	}
	trials := max(1, d.Trials)
	cfgs := map[string]*scenario.Configuration{}
	for i := range s.Configurations {
		cfgs[s.Configurations[i].Name] = &s.Configurations[i]
	}
	agentCfg := map[string]string{}
	for _, p := range ps {
		if p.Multipath() {
			if agentCfg[p.Name], err = p.agentConfig(); err != nil {
				return err
			}
		}
	}
	started, ran := time.Now(), 0
	versions := bench.Versions(o.Binary)
	for pos, pt := range d.order() {
		if o.Shards > 1 && pos%o.Shards != o.Shard-1 || len(o.Only) > 0 && !o.Only[pt.ID] {
			continue
		}
		missing := 0
		for _, n := range names {
			if !unavailable[n] {
				missing += max(0, trials-done[results.Key{Configuration: pt.ID, Cell: n}])
			}
		}
		if missing == 0 {
			continue
		}
		if o.Limit > 0 && ran >= o.Limit {
			fmt.Fprintf(o.Progress, "design: stopping after %d point(s) (--limit); continue with --resume\n", ran)
			return nil
		}
		if o.Budget > 0 && time.Since(started) >= o.Budget {
			fmt.Fprintf(o.Progress, "design: stopping after %s (--budget, %d point(s)); continue with --resume\n", time.Since(started).Round(time.Second), ran)
			return nil
		}
		if err := d.pairedPoint(ctx, o, s, cfgs[pt.ID], pt, pos, byName, names, agentCfg, done, unavailable, store, versions); err != nil {
			return err
		}
		ran++
	}
	fmt.Fprintf(o.Progress, "design: paired run complete (%d point(s) this time)\n", ran)
	return nil
}

// pairedPoint builds pt's lab and runs its missing trials in rounds.
func (d *Design) pairedPoint(ctx context.Context, o Options, s *scenario.Scenario, cfg *scenario.Configuration, pt Point, pos int,
	byName map[string]Proc, names []string, agentCfg map[string]string, done map[results.Key]int, unavailable map[string]bool,
	store *results.Store, versions map[string]string) (err error) {
	fmt.Fprintf(o.Progress, "[%s] lab up (%s, %s BDP; mptcp-1sf over path %d)\n", pt.ID, strings.Join(cfg.Set.Strings(), " "), pt.Class(d.LowBDP), pt.BestPath())
	cl, err := bench.OpenConfiguration(ctx, s, cfg, bench.ConfigOptions{LabName: o.LabName, Binary: o.Binary})
	if err != nil {
		return fmt.Errorf("point %s: %w", pt.ID, err)
	}
	defer func() {
		if cerr := cl.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	first := true
	sched := d.pointSchedule(names, pt, pos, func(name string) int { return done[results.Key{Configuration: pt.ID, Cell: name}] })
	for _, name := range sched {
		key := results.Key{Configuration: pt.ID, Cell: name}
		if unavailable[name] {
			continue
		}
		if !first {
			// Queues drain and TIME_WAIT settles between transfers.
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		first = false
		p := byName[name]
		c := d.cell(p, pt)
		rec := results.Record{
			Scenario: pairedScenarioName, Configuration: pt.ID, Cell: name, Procedure: c.Procedure, Detours: c.Detours,
			CC: s.CC, Duration: time.Duration(s.Duration).Seconds(), Warmup: time.Duration(s.Warmup).Seconds(),
			Params: append(s.Set.Strings(), cfg.Set.Strings()...), Versions: versions, Trial: done[key] + 1,
		}
		rec.Start = time.Now().UTC()
		m, terr := d.pairedTrial(ctx, cl, c, agentCfg[name])
		if ctx.Err() != nil {
			return ctx.Err() // an interrupted trial is not recorded
		}
		rec.LoadAvg = bench.LoadAvg()
		var ue *bench.UnavailableError
		switch {
		case errors.As(terr, &ue):
			rec.Status, rec.Reason = results.Unavailable, ue.Reason
			unavailable[name] = true
		case terr != nil && !keepFewSubflows(p, terr):
			rec.Status, rec.Reason = results.Failed, terr.Error()
		default:
			rec.Status = results.OK
			if terr != nil {
				rec.Reason = bench.KeptFewSubflows + ": " + terr.Error()
			}
			rec.GoodputMbps, rec.WindowBytes, rec.Subflows = m.GoodputMbps, m.WindowBytes, m.Subflows
			rec.WindowS, rec.EqualBytes, rec.EqualGoodputMbps = m.WindowS, m.EqualBytes, m.EqualGoodputMbps
			rec.MaxGapS, rec.MaxGapEndS = m.MaxGapS, m.MaxGapEndS
		}
		rec.PolicyLog = m.PolicyLog // also of a failed trial
		if err := store.Append(rec); err != nil {
			return fmt.Errorf("saving trial: %w", err)
		}
		if rec.Status != results.Unavailable {
			done[key]++
		}
		res := fmt.Sprintf("%.2f Mbit/s", rec.GoodputMbps)
		if rec.Status != results.OK {
			res = strings.ToUpper(rec.Status) + ": " + rec.Reason
		} else if len(rec.Subflows) > 0 {
			var sf []string
			for _, x := range rec.Subflows {
				sf = append(sf, fmt.Sprintf("%s %.1f MB %.0f ms %d rtx", x.Path, float64(x.Bytes)/1e6, x.RTTms, x.Retrans))
			}
			res += " (" + strings.Join(sf, ", ") + ")"
		}
		if n := len(rec.PolicyLog); n > 0 {
			res += fmt.Sprintf(" [agent: %d subflow decisions logged]", n)
		}
		fmt.Fprintf(o.Progress, "[%s] trial %d %s: %s (load %.2f)\n", pt.ID, rec.Trial, name, res, rec.LoadAvg)
	}
	return nil
}

// pairedTrial sets up cell c on the point's lab, runs one trial and
// closes the session.
func (d *Design) pairedTrial(ctx context.Context, cl *bench.ConfigLab, c scenario.Cell, agentConfig string) (bench.Measurement, error) {
	env, err := cl.CellEnv(c)
	if err != nil {
		return bench.Measurement{}, err
	}
	env.AgentConfig = agentConfig
	setup, ok := bench.Procedures()[c.Procedure]
	if !ok {
		return bench.Measurement{}, bench.Unavailable("procedure %s is not implemented", c.Procedure)
	}
	sess, err := setup(ctx, env)
	if err != nil {
		var ue *bench.UnavailableError
		if errors.As(err, &ue) {
			return bench.Measurement{}, err
		}
		return bench.Measurement{}, fmt.Errorf("setup: %w", err)
	}
	// Trial 1: the session's own pause between trials is for sessions
	// that run several; this one runs one (the runner pauses).
	m, err := sess.Trial(ctx, 1)
	if cerr := sess.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("closing the session: %w", cerr)
	}
	// The agent has stopped: its log is complete.
	pl, lerr := bench.AgentPolicyLog(env)
	if lerr != nil && err == nil {
		err = fmt.Errorf("reading the agent's log: %w", lerr)
	}
	m.PolicyLog = pl
	return m, err
}

// keepFewSubflows: a trial of a policy that closes subflows on purpose
// (adaptive, backup-first, guard: SUBFLOW_DESTROY of a subflow that harms) and
// ended with fewer subflows than the cell opens is a measurement of that
// policy, not a lab failure; unless a daemon also died (the error is then
// wrapped) or the policy is static, which closes only failed subflows.
func keepFewSubflows(p Proc, err error) bool {
	if _, ok := err.(*bench.FewSubflowsError); !ok {
		return false
	}
	m, perr := policy.ParseMode(p.Policy)
	return perr == nil && m.Measures()
}
