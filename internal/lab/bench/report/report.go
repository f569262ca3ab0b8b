// Package report turns a scenario's trial records into a Markdown report
// (goodput statistics, ratios, targets, per-subflow breakdown, the
// published numbers beside ours) and box plots in PNG and SVG.
package report

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/lab/bench/stats"
)

// Meta describes where and how the numbers were measured.
type Meta struct {
	Generated time.Time
	Host      string // e.g. "kernel 6.18, 2 CPUs"
	// Note is printed near the top (e.g. why a run is partial).
	Note string
}

// Cell is the summary of one (configuration, procedure instance).
type Cell struct {
	scenario.Cell
	Goodput     stats.Summary
	Values      []float64
	Failed      int
	Unavailable string // reason, when no trial ran because a component is missing
	FailReasons []string
	Subflows    []PathStat
	// MaxGaps are the trials' longest receiver stalls (s).
	MaxGaps []float64
	// Resumes: with a fault, when the faulted path carried data again after
	// it ended (s; -1 = not before the transfer ended).
	Resumes []float64
	// Tails: with a fault, goodput over the last third (Mbit/s).
	Tails []float64
	// Setup: every setup-latency probe of the cell's trials (ms, connect()
	// to first byte).
	Setup []float64
	// FCT: with a flow configuration, every flow's completion time (ms)
	// over the cell's trials.
	FCT []float64
	// Churns: trials of many connections across route changes.
	Churns []results.Churn
	// Collectives: trials of procedure collective (discovery, relay death).
	Collectives []results.Collective
	// Attack: with an attack, each counter's value per trial (ok and
	// failed trials); SubflowCounts: subflows at the end of ok trials.
	Attack        map[string][]float64
	SubflowCounts []float64
}

// PathStat summarises the subflows of one path over a cell's trials.
type PathStat struct {
	Path       string
	MeanBytes  float64 // per trial
	Share      float64 // of all subflow bytes in the cell
	MeanRTTms  float64 // smoothed RTT at the end of the transfer
	MinRTTms   float64 // mean of the subflows' minimum RTTs (no queueing)
	MeanRetran float64
}

// Data is everything the report and the plots are made of.
type Data struct {
	Scenario *scenario.Scenario
	Cells    []*Cell // plan order
	byKey    map[results.Key]*Cell
	// loads holds the host load averages of each configuration's trials.
	loads map[string][]float64
}

// Build summarises recs along s's plan. Records for cells that are not in
// the plan (an edited scenario file) are ignored.
func Build(s *scenario.Scenario, recs []results.Record) *Data {
	d := &Data{Scenario: s, byKey: map[results.Key]*Cell{}, loads: map[string][]float64{}}
	for _, c := range s.Cells() {
		cell := &Cell{Cell: c}
		d.Cells = append(d.Cells, cell)
		d.byKey[results.Key{Configuration: c.Configuration, Cell: c.ID}] = cell
	}
	type acc struct {
		bytes, rtt, minRTT, retrans float64
		n                           int
	}
	paths := map[*Cell]map[string]*acc{}
	for _, r := range recs {
		cell := d.byKey[results.Key{Configuration: r.Configuration, Cell: r.Cell}]
		if cell == nil {
			continue
		}
		if r.Attack != nil {
			cell.addAttack(r)
		}
		switch r.Status {
		case results.OK:
			cell.Values = append(cell.Values, r.GoodputMbps)
			cell.MaxGaps = append(cell.MaxGaps, r.MaxGapS)
			cell.Setup = append(cell.Setup, r.SetupAllMs...)
			cell.FCT = append(cell.FCT, r.FCTAllMs...)
			if r.ResumeS != nil {
				cell.Resumes = append(cell.Resumes, *r.ResumeS)
			}
			if r.TailMbps != nil {
				cell.Tails = append(cell.Tails, *r.TailMbps)
			}
			if r.Churn != nil {
				cell.Churns = append(cell.Churns, *r.Churn)
			}
			if r.Collective != nil {
				cell.Collectives = append(cell.Collectives, *r.Collective)
			}
			if r.LoadAvg > 0 {
				d.loads[r.Configuration] = append(d.loads[r.Configuration], r.LoadAvg)
			}
			if paths[cell] == nil {
				paths[cell] = map[string]*acc{}
			}
			for _, sf := range r.Subflows {
				a := paths[cell][sf.Path]
				if a == nil {
					a = &acc{}
					paths[cell][sf.Path] = a
				}
				a.bytes += float64(sf.Bytes)
				a.rtt += sf.RTTms
				a.minRTT += sf.MinRTTms
				a.retrans += float64(sf.Retrans)
				a.n++
			}
		case results.Failed:
			cell.Failed++
			if len(cell.FailReasons) < 3 {
				cell.FailReasons = append(cell.FailReasons, r.Reason)
			}
		case results.Unavailable:
			cell.Unavailable = r.Reason
		}
	}
	for _, cell := range d.Cells {
		cell.Goodput = stats.Summarize(cell.Values)
		if cell.Goodput.N > 0 {
			cell.Unavailable = ""
		}
		var total float64
		for _, a := range paths[cell] {
			total += a.bytes
		}
		for p, a := range paths[cell] {
			ps := PathStat{Path: p, MeanBytes: a.bytes / float64(cell.Goodput.N), MeanRTTms: a.rtt / float64(a.n), MinRTTms: a.minRTT / float64(a.n), MeanRetran: a.retrans / float64(cell.Goodput.N)}
			if total > 0 {
				ps.Share = a.bytes / total
			}
			cell.Subflows = append(cell.Subflows, ps)
		}
		sort.Slice(cell.Subflows, func(i, j int) bool { return pathOrder(cell.Subflows[i].Path) < pathOrder(cell.Subflows[j].Path) })
	}
	return d
}

func pathOrder(p string) string {
	if p == "default" {
		return ""
	}
	return p
}

// Get returns the cell of configuration cfg and procedure instance id.
func (d *Data) Get(cfg, id string) *Cell {
	return d.byKey[results.Key{Configuration: cfg, Cell: id}]
}

// Ratios of one MPTCP detour cell against the single paths it combines.
type Ratios struct {
	Goodput  float64
	TCP      float64   // mean goodput of plain TCP on the default path
	Singles  []float64 // mean goodput of TCP via each detour of the cell
	Sum      float64   // Goodput / (TCP + sum Singles)
	OverTCP  float64   // Goodput / TCP
	Best     float64   // Goodput / max(TCP, Singles...)
	Benefit  float64   // stats.Benefit with the single-path goodputs as capacities
	Complete bool      // every single path was measured
}

// Ratios computes c's ratios from the means; NaN where a needed cell has
// no data. Single-path goodputs stand in for path capacities.
func (d *Data) Ratios(c *Cell) Ratios {
	nan := math.NaN()
	r := Ratios{Goodput: nan, TCP: nan, Sum: nan, OverTCP: nan, Best: nan, Benefit: nan}
	if c.Goodput.N == 0 {
		return r
	}
	r.Goodput = c.Goodput.Mean
	if t := d.Get(c.Configuration, scenario.DefaultPath(c.Procedure)); t != nil && t.Goodput.N > 0 {
		r.TCP = t.Goodput.Mean
		r.OverTCP = r.Goodput / r.TCP
	}
	ids, ok := d.Scenario.SinglePathCells(c.Cell)
	if !ok || math.IsNaN(r.TCP) {
		return r
	}
	caps := []float64{r.TCP}
	for _, id := range ids[1:] {
		s := d.Get(c.Configuration, id)
		if s == nil || s.Goodput.N == 0 {
			return r
		}
		r.Singles = append(r.Singles, s.Goodput.Mean)
		caps = append(caps, s.Goodput.Mean)
	}
	var sum, best float64
	for _, x := range caps {
		sum += x
		best = math.Max(best, x)
	}
	r.Complete = true
	r.Sum = r.Goodput / sum
	r.Best = r.Goodput / best
	r.Benefit = stats.Benefit(r.Goodput, caps)
	return r
}

// TargetResult is one scenario target checked against the data.
type TargetResult struct {
	scenario.Target
	Value  float64 // NaN = not measured
	Met    bool
	Detail string
}

// Targets checks the scenario's targets.
func (d *Data) Targets() []TargetResult {
	var out []TargetResult
	for _, t := range d.Scenario.Targets {
		tr := TargetResult{Target: t, Value: math.NaN()}
		c := d.Get(t.Configuration, t.Procedure)
		if c != nil {
			r := d.Ratios(c)
			switch t.Ratio {
			case scenario.RatioSum:
				tr.Value = r.Sum
				tr.Detail = fmt.Sprintf("%s / (%s)", f2(r.Goodput), joinSum(r.TCP, r.Singles))
			case scenario.RatioTCP:
				tr.Value = r.OverTCP
				tr.Detail = fmt.Sprintf("%s / %s", f2(r.Goodput), f2(r.TCP))
			case scenario.RatioBest:
				tr.Value = r.Best
				tr.Detail = fmt.Sprintf("%s / max(%s)", f2(r.Goodput), strings.ReplaceAll(joinSum(r.TCP, r.Singles), " + ", ", "))
			case scenario.RatioBenefit:
				tr.Value = r.Benefit
			default: // a procedure: g / g(procedure)
				if o := d.Get(t.Configuration, t.Ratio); o != nil && o.Goodput.N > 0 && c.Goodput.N > 0 {
					tr.Value = c.Goodput.Mean / o.Goodput.Mean
					tr.Detail = fmt.Sprintf("%s / %s", f2(c.Goodput.Mean), f2(o.Goodput.Mean))
				}
			}
		}
		tr.Met = !math.IsNaN(tr.Value) && tr.Value >= t.Min
		out = append(out, tr)
	}
	return out
}

func joinSum(tcp float64, singles []float64) string {
	parts := []string{f2(tcp)}
	for _, s := range singles {
		parts = append(parts, f2(s))
	}
	return strings.Join(parts, " + ")
}

func f2(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%.2f", x)
}

func f3(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%.3f", x)
}

// columns returns the procedure instances of the plan in first-seen order.
func (d *Data) columns() []string {
	var ids []string
	seen := map[string]bool{}
	for _, c := range d.Cells {
		if !seen[c.ID] {
			seen[c.ID] = true
			ids = append(ids, c.ID)
		}
	}
	return ids
}

func (d *Data) labelOf(id string) string {
	for _, c := range d.Cells {
		if c.ID == id {
			return c.Label()
		}
	}
	return id
}

// Gains returns one line per configuration and MPTCP detour procedure,
// e.g. "aggregation: MPTCP+NAT detour = 1.97x TCP (18.6 vs 9.5 Mbit/s)".
func (d *Data) Gains() []string {
	var out []string
	multi := len(d.Scenario.Configurations) > 1
	for _, c := range d.Cells {
		if scenario.SinglePath(c.Procedure) == "" {
			continue
		}
		r := d.Ratios(c)
		if math.IsNaN(r.OverTCP) {
			continue
		}
		name := strings.ReplaceAll(c.Label(), " + ", "+")
		where := ""
		if multi {
			where = " [" + d.Scenario.Configuration(c.Configuration).Label + "]"
		}
		out = append(out, fmt.Sprintf("aggregation%s: %s = %.2fx TCP (%.1f vs %.1f Mbit/s)", where, name, r.OverTCP, r.Goodput, r.TCP))
	}
	return out
}

// WriteMarkdown writes the report; plots names the plot files (relative
// to the report) per configuration, "" for none.
func (d *Data) WriteMarkdown(w io.Writer, m Meta, plots map[string]string) error {
	s := d.Scenario
	p := &printer{w: w}
	p.f("# Benchmark report: %s\n\n", s.Name)
	if s.Description != "" {
		p.f("%s.\n\n", strings.TrimSuffix(s.Description, "."))
	}
	p.f("- Scenario: `%s`; topology `%s`; %d configuration(s), %d cell(s).\n", s.Source, s.Topology, len(s.Configurations), len(d.Cells))
	flows := false
	for _, c := range s.Configurations {
		flows = flows || c.Flow != nil
	}
	if d.timesOnly() {
		p.f("- Times, not goodput (procedure collective: see docs/bench.md).\n")
	} else if flows {
		p.f("- Flows (%s): each trial sends the configuration's flows one after the other, each on a new connection; goodput = flow size x 8 / the trial's median flow completion time; congestion control `%s` set per socket.\n",
			s.Direction, s.CC)
	} else {
		p.f("- Transfer: %s bulk transfer client -> server, goodput = bytes received between t=%s and the end, divided by that time (reference method); congestion control `%s` set per socket.\n",
			time.Duration(s.Duration), time.Duration(s.Warmup), s.CC)
	}
	p.f("- Generated %s", m.Generated.UTC().Format("2006-01-02 15:04 UTC"))
	if m.Host != "" {
		p.f(" on %s", m.Host)
	}
	p.f(".\n")
	p.f("- Goodput and especially delay emulation (a user-space delay line) are sensitive to CPU contention: each configuration below gives the host's load average during its trials.\n\n")
	if m.Note != "" {
		p.f("> %s\n\n", strings.ReplaceAll(strings.TrimSpace(m.Note), "\n", "\n> "))
	}
	planned, ran := 0, 0
	for _, c := range d.Cells {
		planned += c.Trials
		ran += min(c.Goodput.N+c.Failed, c.Trials)
	}
	if ran < planned {
		p.f("**Partial run**: %d of %d planned trials done; cells below show their own n.\n\n", ran, planned)
	}

	cols := d.columns()
	if !d.timesOnly() {
		p.f("## Goodput (Mbit/s): mean (sd), n trials\n\n")
		p.tableHeader("configuration", cols, d.labelOf)
		for _, cfg := range s.Configurations {
			row := []string{cfg.Label}
			for _, id := range cols {
				row = append(row, d.cellText(d.Get(cfg.Name, id)))
			}
			p.row(row)
		}
		p.f("\n")
	}
	d.writeStalls(p, cols)
	d.writeChurn(p)
	d.writeCollective(p)
	d.writeAttacks(p)
	if ref := s.Reference; ref != nil && len(ref.Results) > 0 {
		p.f("### Original results (Mbit/s, mean (sd))\n\n%s.\n\n", strings.TrimSuffix(ref.Source, "."))
		p.tableHeader("configuration", cols, d.labelOf)
		for _, cfg := range s.Configurations {
			row := []string{cfg.Label}
			for _, id := range cols {
				if v, ok := ref.Results[cfg.Name][id]; ok {
					row = append(row, fmt.Sprintf("%.2f (%.2f)", v[0], v[1]))
				} else {
					row = append(row, "")
				}
			}
			p.row(row)
		}
		p.f("\n### Ours / original (ratio of means)\n\n")
		p.tableHeader("configuration", cols, d.labelOf)
		for _, cfg := range s.Configurations {
			row := []string{cfg.Label}
			for _, id := range cols {
				c := d.Get(cfg.Name, id)
				v, ok := ref.Results[cfg.Name][id]
				if c == nil || c.Goodput.N == 0 || !ok || v[0] == 0 {
					row = append(row, "")
					continue
				}
				row = append(row, fmt.Sprintf("%.3f", c.Goodput.Mean/v[0]))
			}
			p.row(row)
		}
		p.f("\n")
	}

	d.writeFCT(p)

	var multipath []*Cell
	for _, c := range d.Cells {
		if scenario.SinglePath(c.Procedure) != "" && c.Goodput.N > 0 {
			multipath = append(multipath, c)
		}
	}
	if len(multipath) > 0 {
		d.writeRatios(p, multipath)
	}
	if f := plots[""]; f != "" {
		p.f("![aggregation efficiency](%s)\n\n", f)
	}

	if trs := d.Targets(); len(trs) > 0 {
		p.f("## Targets\n\n")
		p.row([]string{"configuration", "procedure", "ratio", "target", "measured", "", "from", "note"})
		p.row([]string{"---", "---", "---", "---:", "---:", "---", "---", "---"})
		for _, t := range trs {
			res := "**missed**"
			if math.IsNaN(t.Value) {
				res = "not measured"
			} else if t.Met {
				res = "met"
			}
			p.row([]string{s.Configuration(t.Configuration).Label, scenario.Label(t.Procedure), t.Ratio, fmt.Sprintf(">= %.3f", t.Min), f3(t.Value), res, t.Detail, t.Note})
		}
		p.f("\n")
	}

	if d.timesOnly() {
		for _, cfg := range s.Configurations {
			if l := stats.Summarize(d.loads[cfg.Name]); l.N > 0 {
				p.f("%s: lab parameters `%s`; host load average (1 min) at the end of the trials: median %.1f, max %.1f (2 CPUs).\n\n",
					cfg.Label, strings.Join(cfg.Set.Strings(), " "), l.Median, l.Max)
			}
			for _, c := range d.cellsOf(cfg.Name) {
				if c.Failed > 0 {
					p.f("%s: %d failed trial(s): %s.\n\n", cfg.Label, c.Failed, esc(strings.Join(dedupe(c.FailReasons), "; ")))
				}
			}
		}
		return nil
	}
	p.f("## Per configuration\n")
	for _, cfg := range s.Configurations {
		p.f("\n### %s\n\n", cfg.Label)
		p.f("Lab parameters: `%s`.", strings.Join(cfg.Set.Strings(), " "))
		if l := stats.Summarize(d.loads[cfg.Name]); l.N > 0 {
			p.f(" Host load average (1 min) at the end of the trials: median %.1f, max %.1f (2 CPUs).", l.Median, l.Max)
		}
		p.f("\n\n")
		p.row([]string{"procedure", "n", "mean", "sd", "median", "min", "max", "original", "failed / unavailable"})
		p.row([]string{"---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---"})
		for _, c := range d.Cells {
			if c.Configuration != cfg.Name {
				continue
			}
			g := c.Goodput
			orig := ""
			if s.Reference != nil {
				if v, ok := s.Reference.Results[cfg.Name][c.ID]; ok {
					orig = fmt.Sprintf("%.2f", v[0])
				}
			}
			var notes []string
			if c.Failed > 0 {
				notes = append(notes, fmt.Sprintf("%d failed: %s", c.Failed, strings.Join(dedupe(c.FailReasons), "; ")))
			}
			if c.Unavailable != "" {
				notes = append(notes, "unavailable: "+c.Unavailable)
			}
			if g.N == 0 {
				p.row([]string{c.Label(), "0", "", "", "", "", "", orig, esc(strings.Join(notes, "; "))})
				continue
			}
			p.row([]string{c.Label(), fmt.Sprint(g.N), f2(g.Mean), f2(g.SD), f2(g.Median), f2(g.Min), f2(g.Max), orig, esc(strings.Join(notes, "; "))})
		}
		var sf []string
		for _, c := range d.Cells {
			if c.Configuration != cfg.Name || len(c.Subflows) == 0 {
				continue
			}
			for _, ps := range c.Subflows {
				sf = append(sf, fmt.Sprintf("| %s | %s | %.1f | %.1f%% | %.1f | %.1f | %.1f |", c.Label(), ps.Path, ps.MeanBytes/1e6, 100*ps.Share, ps.MeanRTTms, ps.MinRTTms, ps.MeanRetran))
			}
		}
		if len(sf) > 0 {
			p.f("\nPer-subflow (sender's kernel, end of transfer, mean per trial):\n\n")
			p.f("| procedure | path | MB acked | share | RTT ms | min RTT ms | retransmits |\n|---|---|---:|---:|---:|---:|---:|\n")
			p.f("%s\n", strings.Join(sf, "\n"))
		}
		d.writeSetup(p, cfg.Name)
		if f := plots[cfg.Name]; f != "" {
			p.f("\n![%s](%s)\n", cfg.Label, f)
		}
	}
	return p.err
}

// writeFCT prints the flow completion times of flow configurations: the
// median with the interquartile range of every flow, and each cell's
// median over plain TCP's in the same configuration (below 1: faster).
func (d *Data) writeFCT(p *printer) {
	var cfgs []scenario.Configuration
	for _, cfg := range d.Scenario.Configurations {
		if cfg.Flow != nil {
			cfgs = append(cfgs, cfg)
		}
	}
	if len(cfgs) == 0 {
		return
	}
	var cols []string
	seen := map[string]bool{}
	for _, c := range d.Cells {
		if c.Flow != nil && !seen[c.ID] {
			seen[c.ID] = true
			cols = append(cols, c.ID)
		}
	}
	p.f("## Flow completion time (ms): median [25th–75th percentile] of every flow, n flows\n\n")
	p.f("Connect() to the sink's answer after the last byte, flows one after the other.\n\n")
	p.tableHeader("configuration", cols, d.labelOf)
	for _, cfg := range cfgs {
		row := []string{cfg.Label}
		for _, id := range cols {
			c := d.Get(cfg.Name, id)
			if c == nil || len(c.FCT) == 0 {
				row = append(row, d.cellText(c))
				continue
			}
			g := stats.Summarize(c.FCT)
			t := fmt.Sprintf("%s [%s–%s] n=%d", fms(g.Median), fms(g.Q1), fms(g.Q3), g.N)
			if c.Failed > 0 {
				t += fmt.Sprintf(", %d failed", c.Failed)
			}
			row = append(row, t)
		}
		p.row(row)
	}
	p.f("\n### Median FCT / plain TCP's median (below 1: faster than TCP)\n\n")
	p.tableHeader("configuration", cols, d.labelOf)
	for _, cfg := range cfgs {
		row := []string{cfg.Label}
		base := d.Get(cfg.Name, scenario.TCP)
		for _, id := range cols {
			c := d.Get(cfg.Name, id)
			if c == nil || len(c.FCT) == 0 || base == nil || len(base.FCT) == 0 {
				row = append(row, "–")
				continue
			}
			row = append(row, f3(stats.Summarize(c.FCT).Median/stats.Summarize(base.FCT).Median))
		}
		p.row(row)
	}
	p.f("\n")
}

// fms formats a time in ms with 3 significant digits at least.
func fms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeSetup prints the setup latency probes of a configuration's cells,
// with each cell's median over the first cell's (the baseline, e.g. tcp).
func (d *Data) writeSetup(p *printer, cfg string) {
	var base float64
	first := true
	for _, c := range d.Cells {
		if c.Configuration != cfg || len(c.Setup) == 0 {
			continue
		}
		g := stats.Summarize(c.Setup)
		if first {
			p.f("\nSetup latency (connect() to the first byte of a one-byte request/response, ms, every probe of every trial):\n\n")
			p.f("| procedure | probes | median | mean | min | max | median / first row |\n|---|---:|---:|---:|---:|---:|---:|\n")
			base, first = g.Median, false
		}
		p.f("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.3f |\n", c.Label(), g.N, g.Median, g.Mean, g.Min, g.Max, g.Median/base)
	}
}

func (d *Data) cellText(c *Cell) string {
	switch {
	case c == nil:
		return ""
	case c.Goodput.N > 0:
		t := fmt.Sprintf("%.2f (%.2f) n=%d", c.Goodput.Mean, c.Goodput.SD, c.Goodput.N)
		if c.Failed > 0 {
			t += fmt.Sprintf(", %d failed", c.Failed)
		}
		return t
	case c.Unavailable != "":
		return "unavailable"
	case c.Failed > 0:
		return fmt.Sprintf("failed (%d)", c.Failed)
	}
	return "not run"
}

func dedupe(xs []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func esc(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, a ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, a...)
	}
}

func (p *printer) row(cells []string) {
	for i := range cells {
		cells[i] = esc(cells[i])
	}
	p.f("| %s |\n", strings.Join(cells, " | "))
}

func (p *printer) tableHeader(first string, ids []string, label func(string) string) {
	h := []string{first}
	sep := []string{"---"}
	for _, id := range ids {
		h = append(h, label(id))
		sep = append(sep, "---:")
	}
	p.row(h)
	p.row(sep)
}

// WriteAll writes report.md and the plots into dir.
func (d *Data) WriteAll(dir string, m Meta) error {
	plots, err := d.WritePlots(dir)
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md.tmp"))
	if err != nil {
		return err
	}
	if err := d.WriteMarkdown(f, m, plots); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(filepath.Join(dir, "report.md.tmp"), filepath.Join(dir, "report.md"))
}

// Table renders the cells as a small text table for the terminal.
func (d *Data) Table() string {
	var b strings.Builder
	if d.timesOnly() {
		for _, c := range d.Cells {
			label := d.Scenario.Configuration(c.Configuration).Label
			var usable, disc, out, dropped []float64
			for _, t := range c.Collectives {
				for _, cl := range t.Clients {
					usable = append(usable, cl.UsableS)
					disc = append(disc, cl.DiscoveredDetoursS)
				}
				out = append(out, t.OutOfRostersS)
				dropped = append(dropped, t.DroppedByAgentsS)
			}
			fmt.Fprintf(&b, "%s: %d trials, %d failed; median / max s: (a) %s, (b') %s, (c) %s, (c') %s (report.md)\n", label, len(c.Collectives), c.Failed,
				timesOf(usable).short(), timesOf(disc).short(), timesOf(out).short(), timesOf(dropped).short())
		}
		return b.String()
	}
	fmt.Fprintf(&b, "%-24s %-28s %4s %8s %6s %8s\n", "configuration", "procedure", "n", "Mbit/s", "sd", "median")
	for _, c := range d.Cells {
		label := d.Scenario.Configuration(c.Configuration).Label
		switch {
		case c.Goodput.N > 0:
			fmt.Fprintf(&b, "%-24s %-28s %4d %8.2f %6.2f %8.2f\n", label, c.Label(), c.Goodput.N, c.Goodput.Mean, c.Goodput.SD, c.Goodput.Median)
		case c.Unavailable != "":
			fmt.Fprintf(&b, "%-24s %-28s unavailable: %s\n", label, c.Label(), c.Unavailable)
		case c.Failed > 0:
			fmt.Fprintf(&b, "%-24s %-28s %4d %8s (%d failed: %s)\n", label, c.Label(), 0, "-", c.Failed, strings.Join(dedupe(c.FailReasons), "; "))
		default:
			fmt.Fprintf(&b, "%-24s %-28s %4d %8s (not run)\n", label, c.Label(), 0, "-")
		}
	}
	return b.String()
}

// writeRatios prints the table of multipath cells against their single
// paths; scenarios without MPTCP procedures (e.g. tunnels) have none.
func (d *Data) writeRatios(p *printer, cells []*Cell) {
	s := d.Scenario
	p.f("## Ratios of MPTCP with detours to single paths\n\n")
	p.f("From the means. *sum* = MPTCP / (TCP + TCP via each detour); *tcp* = MPTCP / TCP; *best* = MPTCP / the best single path; *Ben* = aggregation benefit (g - Cmax)/(ΣC - Cmax) if g >= Cmax else (g - Cmax)/Cmax, with the measured single-path goodputs as capacities (0 = as good as the best path, 1 = perfect aggregation).\n\n")
	p.row([]string{"configuration", "procedure", "goodput", "single paths", "sum", "tcp", "best", "Ben"})
	p.row([]string{"---", "---", "---:", "---", "---:", "---:", "---:", "---:"})
	for _, c := range cells {
		r := d.Ratios(c)
		p.row([]string{s.Configuration(c.Configuration).Label, c.Label(), f2(r.Goodput), joinSum(r.TCP, r.Singles), f3(r.Sum), f3(r.OverTCP), f3(r.Best), f3(r.Benefit)})
	}
	p.f("\n")
}

// writeStalls is the failover table: for configurations with a fault, the
// longest time the receiver got nothing, per trial; then, when measured,
// when the restored path carried data again.
func (d *Data) writeStalls(p *printer, cols []string) {
	var faulty []scenario.Configuration
	for _, cfg := range d.Scenario.Configurations {
		if cfg.Fault != nil {
			faulty = append(faulty, cfg)
		}
	}
	if len(faulty) == 0 {
		return
	}
	d.faultTable(p, cols, faulty, "## Longest stall (s): the longest time the receiver got no data, median / max over trials\n\n"+
		"Fault: the link is black-holed (every packet dropped, nothing sent back) from `at` after the transfer starts, for `for`.\n\n",
		func(c *Cell) string {
			if len(c.MaxGaps) == 0 {
				return ""
			}
			g := stats.Summarize(c.MaxGaps)
			return fmt.Sprintf("%.2f / %.2f (n=%d)", g.Median, g.Max, g.N)
		})
	d.faultTable(p, cols, faulty, "## Restored path used again (s after the fault ended), median / max over trials\n\n"+
		"The faulted link's subflows (a replacement counts) sampled every 100 ms: the first sample after the fault ended in which one of them had delivered more. *never*: not before the transfer ended.\n\n",
		func(c *Cell) string {
			if len(c.Resumes) == 0 {
				return ""
			}
			var ok []float64
			for _, v := range c.Resumes {
				if v >= 0 {
					ok = append(ok, v)
				}
			}
			cell := ""
			if len(ok) > 0 {
				g := stats.Summarize(ok)
				cell = fmt.Sprintf("%.2f / %.2f", g.Median, g.Max)
			}
			if never := len(c.Resumes) - len(ok); never > 0 {
				cell = strings.TrimSpace(cell + fmt.Sprintf(" never in %d", never))
			}
			return fmt.Sprintf("%s (n=%d)", cell, len(c.Resumes))
		})
	d.faultTable(p, cols, faulty, "## Rate over the last third of the transfer (Mbit/s), mean (sd)\n\n"+
		"From the client's per-subflow samples every 100 ms (acknowledged bytes in an upload, received in a download; data reinjected on another subflow counts twice): what each procedure delivered once a policy had had two thirds of the transfer to choose its paths.\n\n",
		func(c *Cell) string {
			if len(c.Tails) == 0 {
				return ""
			}
			g := stats.Summarize(c.Tails)
			return fmt.Sprintf("%.2f (%.2f) n=%d", g.Mean, g.SD, g.N)
		})
}

// faultTable prints one row per faulted configuration with value(cell)
// per procedure column; nothing when every value is empty.
func (d *Data) faultTable(p *printer, cols []string, faulty []scenario.Configuration, head string, value func(*Cell) string) {
	var rows [][]string
	any := false
	for _, cfg := range faulty {
		row := []string{fmt.Sprintf("%s (%s at %s for %s)", cfg.Label, cfg.Fault.Link, cfg.Fault.At, cfg.Fault.For)}
		for _, id := range cols {
			v := ""
			if c := d.Get(cfg.Name, id); c != nil {
				v = value(c)
			}
			any = any || v != ""
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	if !any {
		return
	}
	p.f("%s", head)
	p.tableHeader("configuration (fault)", cols, d.labelOf)
	for _, r := range rows {
		p.row(r)
	}
	p.f("\n")
}

// writeChurn is the table of cells that ran many connections across route
// changes (loadbalancer): broken connections summed over the trials.
func (d *Data) writeChurn(p *printer) {
	var rows [][]string
	for _, c := range d.Cells {
		if len(c.Churns) == 0 {
			continue
		}
		var conns, broken, changes int
		var reasons []string
		per := make([]string, 0, len(c.Churns))
		for _, ch := range c.Churns {
			conns += ch.Connections
			broken += ch.Broken
			changes += ch.RouteChanges
			reasons = append(reasons, ch.Reasons...)
			per = append(per, fmt.Sprint(ch.Broken))
		}
		rows = append(rows, []string{d.Scenario.Configuration(c.Configuration).Label, c.Label(), fmt.Sprint(len(c.Churns)),
			fmt.Sprint(conns), fmt.Sprint(changes), fmt.Sprintf("**%d**", broken), strings.Join(per, ", "), esc(strings.Join(dedupe(reasons), "; "))})
	}
	if len(rows) == 0 {
		return
	}
	p.f("## Connections across route changes\n\n")
	p.f("Every trial runs its connections at once for the whole transfer while the network changes under them; a connection is *broken* when its transfer ends with an error or without the receiver's summary (reset, stalled, timed out).\n\n")
	p.row([]string{"configuration", "procedure", "trials", "connections", "route changes", "broken", "broken per trial", "errors"})
	p.row([]string{"---", "---", "---:", "---:", "---:", "---:", "---", "---"})
	for _, r := range rows {
		p.row(r)
	}
	p.f("\n")
	for _, c := range d.Cells {
		sum := map[string]uint64{}
		for _, ch := range c.Churns {
			for k, v := range ch.Counters {
				sum[k] += v
			}
		}
		if len(sum) == 0 {
			continue
		}
		var keys []string
		for k := range sum {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d", k, sum[k]))
		}
		p.f("Kernel MPTCP counters, %s / %s, summed over %d trial(s): %s.\n\n", d.Scenario.Configuration(c.Configuration).Label, c.Label(), len(c.Churns), strings.Join(parts, ", "))
	}
}
