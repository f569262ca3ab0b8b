package design

import (
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/stats"
)

// Row is one (point, procedure) measurement in results.json.
type Row struct {
	Point     string `json:"point"`
	Trial     int    `json:"trial"`
	BDP       string `json:"bdp"` // "low" or "high"
	Procedure string `json:"procedure"`
	// Policy is the agent policy of an MPTCP row ("" = the agent's default).
	Policy      string  `json:"policy,omitempty"`
	Status      string  `json:"status"`
	Reason      string  `json:"reason,omitempty"`
	GoodputMbps float64 `json:"goodput_mbps"`
	// WindowS is GoodputMbps's window (warm-up to the last byte),
	// EqualGoodputMbps the goodput over warm-up to the end of the writing
	// duration (results.Record); absent in trials recorded before them.
	WindowS          *float64 `json:"window_s,omitempty"`
	EqualGoodputMbps *float64 `json:"equal_goodput_mbps,omitempty"`
	// Ben is the aggregation benefit of an MPTCP row against the measured
	// single-path goodputs (the mean of the tcp-path1..N rows of the same
	// point); absent when one of them is missing.
	Ben *float64 `json:"ben,omitempty"`
	// BenCapacity is Ben against the nominal capacities instead.
	BenCapacity *float64           `json:"ben_capacity,omitempty"`
	Params      map[string]float64 `json:"params"`
	Subflows    []results.Subflow  `json:"subflows,omitempty"`
	PolicyLog   []string           `json:"policy_log,omitempty"` // results.Record.PolicyLog
	Start       time.Time          `json:"start"`
	LoadAvg     float64            `json:"loadavg_1m"`
}

// Report is what WriteReport computed.
type Report struct {
	Design *Design
	Rows   []Row
	// Timing of the runs, from the trials' start times.
	PointsDone      int
	SecondsPerPoint float64 // mean wall clock per point (all its procedures) in one runner
	// EffectiveSecondsPerPoint is the wall clock per point with all
	// shards that ran at once: SecondsPerPoint / the parallel speed-up.
	EffectiveSecondsPerPoint float64
	OverheadPerPoint         float64 // SecondsPerPoint minus the transfers' durations
	TransferSeconds          float64 // per procedure and point
	ProceduresPerPoint       int
}

// Ben is the aggregation benefit of goodput g over paths of capacities
// caps: (g - Cmax) / (ΣC - Cmax) for g >= Cmax, (g - Cmax) / Cmax below
// (stats.Benefit); NaN when undefined.
func Ben(g float64, caps []float64) float64 { return stats.Benefit(g, caps) }

// Rows turns the trials of a design's runs into rows with Ben.
func (d *Design) Rows(recs map[string][]results.Record, runs []run) []Row {
	points := map[string]Point{}
	for _, pt := range d.Points {
		points[pt.ID] = pt
	}
	var rows []Row
	for _, r := range runs {
		byCell := map[string]Proc{}
		for _, p := range r.Procs {
			if r.Name == PairedRun {
				byCell[p.Name] = p // paired records name the design procedure
			} else {
				byCell[p.cellID()] = p
			}
		}
		for _, rec := range recs[r.Name] {
			p, ok := byCell[rec.Cell]
			pt, okp := points[rec.Configuration]
			if !ok || !okp {
				continue
			}
			rows = append(rows, Row{
				Point: pt.ID, Trial: rec.Trial, BDP: pt.Class(d.LowBDP), Procedure: p.Name, Policy: p.Policy,
				Status: rec.Status, Reason: rec.Reason, GoodputMbps: rec.GoodputMbps,
				WindowS: rec.WindowS, EqualGoodputMbps: rec.EqualGoodputMbps,
				Params: pt.Params(), Subflows: rec.Subflows, PolicyLog: rec.PolicyLog, Start: rec.Start, LoadAvg: rec.LoadAvg,
			})
		}
	}
	// Single-path goodputs per point: the mean of each path's ok trials.
	single := singleMeans(rows)
	for i := range rows {
		row := &rows[i]
		if strings.HasPrefix(row.Procedure, tcpPathPrefix) || row.Status != results.OK {
			continue
		}
		pt := points[row.Point]
		var caps, c []float64
		for k, p := range pt.Paths {
			caps = append(caps, p.CapacityMbps)
			if g, ok := single[row.Point][tcpPathPrefix+strconv.Itoa(k+1)]; ok {
				c = append(c, g)
			}
		}
		row.BenCapacity = finite(Ben(row.GoodputMbps, caps))
		if len(c) == len(pt.Paths) {
			row.Ben = finite(Ben(row.GoodputMbps, c))
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Point < rows[j].Point })
	return rows
}

// singleMeans is, per point, the mean goodput of each single-path
// procedure over its ok trials.
func singleMeans(rows []Row) map[string]map[string]float64 {
	sum := map[string]map[string]float64{}
	n := map[string]map[string]float64{}
	for _, r := range rows {
		if !strings.HasPrefix(r.Procedure, tcpPathPrefix) || r.Status != results.OK {
			continue
		}
		if sum[r.Point] == nil {
			sum[r.Point], n[r.Point] = map[string]float64{}, map[string]float64{}
		}
		sum[r.Point][r.Procedure] += r.GoodputMbps
		n[r.Point][r.Procedure]++
	}
	for pt, m := range sum {
		for proc := range m {
			m[proc] /= n[pt][proc]
		}
	}
	return sum
}

func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// mptcpProcs lists the design's MPTCP procedures in order.
func (d *Design) mptcpProcs() []string {
	var out []string
	ps, _ := d.procs()
	for _, p := range ps {
		if p.Multipath() {
			out = append(out, p.Name)
		}
	}
	return out
}

// bens returns the Ben values of proc's rows of the class ("" = all).
func (rep *Report) bens(proc, class string) []float64 {
	var v []float64
	for _, r := range rep.Rows {
		if r.Procedure == proc && r.Ben != nil && (class == "" || r.BDP == class) {
			v = append(v, *r.Ben)
		}
	}
	sort.Float64s(v)
	return v
}

func fracAtLeast(sorted []float64, x float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	n := 0
	for _, v := range sorted {
		if v >= x {
			n++
		}
	}
	return float64(n) / float64(len(sorted))
}

// Targets of the design study (docs/design.md).
const (
	TargetLowBen      = 0.85 // Ben >= this ...
	TargetLowFraction = 0.75 // ... in this share of low-BDP points
	TargetAllFraction = 0.95 // Ben >= 0 in this share of all points
)

// WriteReport loads the trials in dir and writes results.json, results.csv,
// report.md and the plots.
func WriteReport(dir string, d *Design, note string) (*Report, error) {
	recs, runs, starts, err := d.loadRecords(dir)
	if err != nil {
		return nil, err
	}
	rep := &Report{Design: d, Rows: d.Rows(recs, runs)}
	rep.timing(recs, runs, starts)
	if err := writeJSON(filepath.Join(dir, "results.json"), rep.Rows); err != nil {
		return nil, err
	}
	if err := rep.writeCSV(filepath.Join(dir, "results.csv")); err != nil {
		return nil, err
	}
	plots, err := rep.writePlots(dir)
	if err != nil {
		return nil, err
	}
	return rep, os.WriteFile(filepath.Join(dir, "report.md"), []byte(rep.Markdown(plots, note)), 0o644)
}

// timing estimates the wall clock per point from the trials' start times
// (gaps over 15 min, i.e. interrupted runs, are left out): per runner, the
// mean time from one point's first trial to the next point's in the same
// run directory; overall, the same over all directories' starts merged in
// time order, which is shorter when shards run at once.
func (rep *Report) timing(recs map[string][]results.Record, runs []run, starts [][]time.Time) {
	dur, _ := time.ParseDuration(rep.Design.Duration)
	rep.TransferSeconds = dur.Seconds()
	if len(runs) == 0 {
		return
	}
	done := map[string]bool{}
	for _, rec := range recs[runs[0].Name] {
		done[rec.Configuration] = true
	}
	rep.PointsDone = len(done)
	for _, r := range runs {
		rep.ProceduresPerPoint += len(r.Procs)
	}
	meanGap := func(ts []time.Time) (float64, int) {
		var total float64
		var n int
		for i := 1; i < len(ts); i++ {
			if gap := ts[i].Sub(ts[i-1]).Seconds(); gap >= 0 && gap < 900 {
				total += gap
				n++
			}
		}
		return total, n
	}
	var all []time.Time
	var total float64
	var n int
	for _, st := range starts {
		all = append(all, st...)
		t, k := meanGap(st)
		total, n = total+t, n+k
	}
	if n == 0 {
		return
	}
	// Runs of several policies run one after the other: a point costs
	// the sum of its runs.
	rep.SecondsPerPoint = total / float64(n) * float64(len(runs))
	rep.OverheadPerPoint = rep.SecondsPerPoint - float64(rep.ProceduresPerPoint)*rep.TransferSeconds
	sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
	if t, k := meanGap(all); k > 0 {
		rep.EffectiveSecondsPerPoint = t / float64(k) * float64(len(runs))
	}
}
