package design

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
)

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// paramKeys are the row parameters in column order.
func (d *Design) paramKeys() []string {
	var k []string
	for p := 1; p <= d.Space.Paths; p++ {
		n := strconv.Itoa(p)
		k = append(k, "capacity"+n+"_mbps", "rtt"+n+"_ms", "loss"+n+"_pct", "buffer"+n+"_bdp", "queue"+n+"_pkts", "bdp"+n+"_bytes")
	}
	return k
}

func (rep *Report) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	keys := rep.Design.paramKeys()
	_ = w.Write(append([]string{"point", "trial", "bdp", "procedure", "status", "goodput_mbps", "window_s", "equal_goodput_mbps", "ben", "ben_capacity"}, keys...))
	for _, r := range rep.Rows {
		rec := []string{r.Point, strconv.Itoa(r.Trial), r.BDP, r.Procedure, r.Status, fmt.Sprintf("%.3f", r.GoodputMbps),
			optF(r.WindowS), optF(r.EqualGoodputMbps), optF(r.Ben), optF(r.BenCapacity)}
		for _, k := range keys {
			rec = append(rec, strconv.FormatFloat(r.Params[k], 'f', -1, 64))
		}
		_ = w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// optF prints an optional figure, empty when absent (not recorded).
func optF(v *float64) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("%.3f", *v)
}

var palette = []color.Color{
	color.RGBA{B: 200, A: 255}, color.RGBA{R: 200, A: 255}, color.RGBA{G: 140, A: 255},
	color.RGBA{R: 160, B: 160, A: 255}, color.RGBA{R: 200, G: 120, A: 255},
}

// writePlots draws ben-cdf.png (Ben CDF per MPTCP procedure and BDP
// class) and ben-vs-DIM.png per dimension; it returns the PNG names.
func (rep *Report) writePlots(dir string) ([]string, error) {
	var names []string
	save := func(p *plot.Plot, base string) error {
		for _, ext := range []string{".png", ".svg"} {
			if err := p.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(dir, base+ext)); err != nil {
				return fmt.Errorf("plot %s: %w", base, err)
			}
		}
		names = append(names, base+".png")
		return nil
	}
	procs := rep.Design.mptcpProcs()
	cdf := plot.New()
	cdf.Title.Text = "Aggregation benefit: CDF over design points"
	cdf.X.Label.Text = "Ben"
	cdf.Y.Label.Text = "fraction of points"
	cdf.Y.Min, cdf.Y.Max = 0, 1
	any := false
	i := 0
	for _, proc := range procs {
		for _, class := range []string{LowBDP, HighBDP} {
			v := rep.bens(proc, class)
			if len(v) == 0 {
				continue
			}
			xy := make(plotter.XYs, 0, 2*len(v))
			for k, x := range v {
				xy = append(xy, plotter.XY{X: x, Y: float64(k) / float64(len(v))}, plotter.XY{X: x, Y: float64(k+1) / float64(len(v))})
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			l.Color = palette[i%len(palette)]
			if class == HighBDP {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			l.Width = vg.Points(1.5)
			cdf.Add(l)
			cdf.Legend.Add(fmt.Sprintf("%s, %s BDP (n=%d)", proc, class, len(v)), l)
			any = true
		}
		i++
	}
	if !any {
		return names, nil
	}
	cdf.Legend.Top, cdf.Legend.Left = true, true
	cdf.Add(plotter.NewGrid())
	if err := addTargets(cdf, true); err != nil {
		return nil, err
	}
	if err := save(cdf, "ben-cdf"); err != nil {
		return nil, err
	}
	for _, dim := range rep.Design.Space.Dimensions() {
		key := dimKey(dim)
		p := plot.New()
		p.Title.Text = "Ben vs " + dim
		p.X.Label.Text = key
		p.Y.Label.Text = "Ben"
		for i, proc := range procs {
			for _, class := range []string{LowBDP, HighBDP} {
				var xy plotter.XYs
				for _, r := range rep.Rows {
					if r.Procedure == proc && r.BDP == class && r.Ben != nil {
						xy = append(xy, plotter.XY{X: r.Params[key], Y: *r.Ben})
					}
				}
				if len(xy) == 0 {
					continue
				}
				s, err := plotter.NewScatter(xy)
				if err != nil {
					return nil, err
				}
				s.Color = palette[i%len(palette)]
				s.Shape = draw.CircleGlyph{}
				if class == HighBDP {
					s.Shape = draw.CrossGlyph{}
				}
				p.Add(s)
				p.Legend.Add(proc+", "+class+" BDP", s)
			}
		}
		p.Add(plotter.NewGrid())
		if err := addTargets(p, false); err != nil {
			return nil, err
		}
		if err := save(p, "ben-vs-"+dim); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// addTargets marks Ben = 0 and Ben = TargetLowBen with grey lines,
// vertical in a CDF, horizontal otherwise.
func addTargets(p *plot.Plot, vertical bool) error {
	for _, v := range []float64{0, TargetLowBen} {
		xy := plotter.XYs{{X: p.X.Min, Y: v}, {X: p.X.Max, Y: v}}
		if vertical {
			xy = plotter.XYs{{X: v, Y: 0}, {X: v, Y: 1}}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 120}
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
	}
	return nil
}

// dimKey is a dimension's row parameter: capacity1 -> capacity1_mbps.
func dimKey(dim string) string {
	for _, k := range []struct{ kind, unit string }{{"capacity", "_mbps"}, {"rtt", "_ms"}, {"loss", "_pct"}, {"buffer", "_bdp"}} {
		if strings.HasPrefix(dim, k.kind) {
			return dim + k.unit
		}
	}
	return dim
}

// Markdown renders report.md.
func (rep *Report) Markdown(plots []string, note string) string {
	d := rep.Design
	var b strings.Builder
	fmt.Fprintf(&b, "# Design evaluation: MPTCP with detours over a WSP design\n\n")
	if note != "" {
		fmt.Fprintf(&b, "> %s\n\n", note)
	}
	fmt.Fprintf(&b, "Generated %s. %d points (WSP, seed %d, min. distance %.3f in the unit cube) over %d paths: "+
		"capacity %s Mbit/s, RTT %s ms, loss %s %%, buffer %s BDP per path. Procedures: %s; %s per transfer "+
		"(goodput from %s), %s. Low BDP: every path's BDP <= %.0f bytes.\n\n",
		time.Now().UTC().Format(time.RFC3339), len(d.Points), d.Seed, d.MinDistance, d.Space.Paths,
		d.Space.Capacity, d.Space.RTT, d.Space.Loss, d.Space.Buffer, strings.Join(d.Procedures, ", "),
		d.Duration, d.Warmup, d.CC, d.LowBDP)
	low, high := 0, 0
	for _, pt := range d.Points {
		if pt.Class(d.LowBDP) == LowBDP {
			low++
		} else {
			high++
		}
	}
	fmt.Fprintf(&b, "Points run: %d of %d (design: %d low-BDP, %d high-BDP). ", rep.PointsDone, len(d.Points), low, high)
	if rep.SecondsPerPoint > 0 {
		fmt.Fprintf(&b, "Wall clock %.1f s per point in one runner for %d procedures x %s: runner overhead %.1f s per point "+
			"(lab up/down, relays, agent, receiver, transfer ends). With every shard that ran at once: %.1f s per point "+
			"(speed-up %.2f).", rep.SecondsPerPoint, rep.ProceduresPerPoint, d.Duration, rep.OverheadPerPoint,
			rep.EffectiveSecondsPerPoint, rep.SecondsPerPoint/rep.EffectiveSecondsPerPoint)
	}
	b.WriteString("\n\n")
	b.WriteString("Ben = (g - Cmax) / (ΣC - Cmax) for g >= Cmax, (g - Cmax) / Cmax below; C = the single-path TCP goodputs " +
		"(tcp-path1..N) measured at the same point, g = the MPTCP goodput. 1 = perfect pooling, 0 = as good as the best path, " +
		"< 0 = worse than the best path. `ben_capacity` in the rows uses the nominal capacities instead.\n\n")

	b.WriteString("## Ben per procedure\n\n")
	b.WriteString("| procedure | class | n | min | p10 | median | mean | Ben >= 0.85 | Ben >= 0 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, proc := range d.mptcpProcs() {
		for _, class := range []string{LowBDP, HighBDP, ""} {
			v := rep.bens(proc, class)
			name := class
			if name == "" {
				name = "all"
			}
			if len(v) == 0 {
				fmt.Fprintf(&b, "| %s | %s | 0 | | | | | | |\n", proc, name)
				continue
			}
			var sum float64
			for _, x := range v {
				sum += x
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.0f %% | %.0f %% |\n", proc, name, len(v),
				v[0], quantile(v, 0.1), quantile(v, 0.5), sum/float64(len(v)), 100*fracAtLeast(v, TargetLowBen), 100*fracAtLeast(v, 0))
		}
	}
	b.WriteString("\n## Targets\n\n| procedure | target | measured | n | verdict |\n|---|---|---:|---:|---|\n")
	for _, proc := range d.mptcpProcs() {
		lowV, allV := rep.bens(proc, LowBDP), rep.bens(proc, "")
		fmt.Fprintf(&b, "| %s | Ben >= %.2f in >= %.0f %% of low-BDP points | %s | %d | %s |\n", proc, TargetLowBen, 100*TargetLowFraction,
			pct(fracAtLeast(lowV, TargetLowBen)), len(lowV), verdict(fracAtLeast(lowV, TargetLowBen), TargetLowFraction, len(lowV)))
		fmt.Fprintf(&b, "| %s | Ben >= 0 in >= %.0f %% of all points | %s | %d | %s |\n", proc, 100*TargetAllFraction,
			pct(fracAtLeast(allV, 0)), len(allV), verdict(fracAtLeast(allV, 0), TargetAllFraction, len(allV)))
	}
	if rep.SecondsPerPoint > 0 {
		est := 200 * rep.EffectiveSecondsPerPoint / float64(rep.ProceduresPerPoint) * 3
		v := "met"
		if est >= 7200 {
			v = "missed"
		}
		fmt.Fprintf(&b, "| runner | 200 points x 3 procedures x 10 s in < 2 h | %.0f min (extrapolated from %.1f s per point for %d procedures of %s) | %d | %s (estimate) |\n",
			est/60, rep.EffectiveSecondsPerPoint, rep.ProceduresPerPoint, d.Duration, rep.PointsDone, v)
	}
	b.WriteString("\n")
	for _, p := range plots {
		fmt.Fprintf(&b, "![%s](%s)\n", strings.TrimSuffix(p, ".png"), p)
	}
	b.WriteString("\n")
	rep.paired(&b)
	rep.converted(&b)
	rep.worst(&b, 10)
	rep.failures(&b)
	return b.String()
}

// nativeFor is the native MPTCP procedure converted is compared with: mptcp
// (the same agent default policy), else the design's first MPTCP one.
func (d *Design) nativeFor() string {
	ps, _ := d.procs()
	first := ""
	for _, p := range ps {
		if !p.MPTCP() || p.Converted {
			continue
		}
		if p.Name == MPTCPProcedure {
			return p.Name
		}
		if first == "" {
			first = p.Name
		}
	}
	return first
}

// pointMean is the mean goodput and Ben of one procedure's ok trials at a
// point, and the subflows of its first ok trial.
type pointMean struct {
	n        int
	goodput  float64
	ben      float64
	nBen     int
	subflows []results.Subflow
}

func (rep *Report) pointMeans(proc string) map[string]*pointMean {
	out := map[string]*pointMean{}
	for _, r := range rep.Rows {
		if r.Procedure != proc || r.Status != results.OK {
			continue
		}
		m := out[r.Point]
		if m == nil {
			m = &pointMean{subflows: r.Subflows}
			out[r.Point] = m
		}
		m.n++
		m.goodput += r.GoodputMbps
		if r.Ben != nil {
			m.ben += *r.Ben
			m.nBen++
		}
	}
	for _, m := range out {
		m.goodput /= float64(m.n)
		if m.nBen > 0 {
			m.ben /= float64(m.nBen)
		}
	}
	return out
}

func subflowText(sf []results.Subflow) string {
	var out []string
	for _, s := range sf {
		out = append(out, fmt.Sprintf("%s %.1f MB %.0f ms %d rtx", s.Path, float64(s.Bytes)/1e6, s.RTTms, s.Retrans))
	}
	return strings.Join(out, "; ")
}

// converted compares procedure converted with the native MPTCP procedure
// point by point: goodput ratio, Ben of both, the subflows of both.
func (rep *Report) converted(b *strings.Builder) {
	d := rep.Design
	ps, _ := d.procs()
	has := false
	for _, p := range ps {
		has = has || p.Converted
	}
	native := d.nativeFor()
	if !has || native == "" {
		return
	}
	conv, nat := rep.pointMeans(ConvertedProcedure), rep.pointMeans(native)
	single := singleMeans(rep.Rows)
	var ids []string
	for id := range conv {
		if nat[id] != nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	fmt.Fprintf(b, "## Converted vs native: %s (server without MPTCP, via the converter) beside %s\n\n", ConvertedProcedure, native)
	b.WriteString("Per point, the mean of the ok trials: goodput (Mbit/s) of both, gain = converted / native, Ben of both " +
		"(against the same single-path TCP goodputs), and the subflows of the first trial (path, MB acked, smoothed RTT, " +
		"retransmitted segments; `default` is the subflow to the converter on the default path).\n\n")
	var ratios, dBen []float64
	for _, id := range ids {
		if nat[id].goodput > 0 {
			ratios = append(ratios, conv[id].goodput/nat[id].goodput)
		}
		if conv[id].nBen > 0 && nat[id].nBen > 0 {
			dBen = append(dBen, conv[id].ben-nat[id].ben)
		}
	}
	sort.Float64s(ratios)
	sort.Float64s(dBen)
	if len(ratios) > 0 {
		fmt.Fprintf(b, "Points with both: %d. Gain converted / native: min %.2f, p10 %.2f, median %.2f, max %.2f; "+
			">= 0.9 at %s of the points. Ben converted - native: median %+.2f.\n\n",
			len(ids), ratios[0], quantile(ratios, 0.1), quantile(ratios, 0.5), ratios[len(ratios)-1],
			pct(fracAtLeast(ratios, 0.9)), quantile(dBen, 0.5))
	}
	b.WriteString("| point | BDP |")
	for p := 1; p <= d.Space.Paths; p++ {
		fmt.Fprintf(b, " path %d | TCP %d |", p, p)
	}
	fmt.Fprintf(b, " %s | converted | gain | Ben %s | Ben converted | subflows %s | subflows converted |\n|---|---|", native, native, native)
	for p := 1; p <= d.Space.Paths; p++ {
		b.WriteString("---|---:|")
	}
	b.WriteString("---:|---:|---:|---:|---:|---|---|\n")
	points := map[string]Point{}
	for _, pt := range d.Points {
		points[pt.ID] = pt
	}
	for _, id := range ids {
		pt := points[id]
		par := pt.Params()
		fmt.Fprintf(b, "| %s | %s |", id, pt.Class(d.LowBDP))
		for p := 1; p <= d.Space.Paths; p++ {
			k := strconv.Itoa(p)
			fmt.Fprintf(b, " %.1f / %.0f / %.2f / %.2f (%.0f) | %.2f |", par["capacity"+k+"_mbps"], par["rtt"+k+"_ms"],
				par["loss"+k+"_pct"], par["buffer"+k+"_bdp"], par["queue"+k+"_pkts"], single[id][tcpPathPrefix+k])
		}
		c, n := conv[id], nat[id]
		gain := math.NaN()
		if n.goodput > 0 {
			gain = c.goodput / n.goodput
		}
		benS := func(m *pointMean) string {
			if m.nBen == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", m.ben)
		}
		fmt.Fprintf(b, " %.2f | %.2f | %.2f | %s | %s | %s | %s |\n", n.goodput, c.goodput, gain, benS(n), benS(c),
			subflowText(n.subflows), subflowText(c.subflows))
	}
	b.WriteString("\n")
}

func quantile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	h := p * float64(len(sorted)-1)
	i := int(h)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (h-float64(i))*(sorted[i+1]-sorted[i])
}

func pct(f float64) string {
	if math.IsNaN(f) {
		return "-"
	}
	return fmt.Sprintf("%.0f %%", 100*f)
}

func verdict(f, want float64, n int) string {
	switch {
	case n == 0 || math.IsNaN(f):
		return "not measured"
	case f >= want:
		return "met"
	}
	return "missed"
}

// worst lists the n lowest-Ben rows per MPTCP procedure with the point's
// parameters, the single-path goodputs and the subflows.
func (rep *Report) worst(b *strings.Builder, n int) {
	single := singleMeans(rep.Rows)
	d := rep.Design
	for _, proc := range d.mptcpProcs() {
		var rows []Row
		for _, r := range rep.Rows {
			if r.Procedure == proc && r.Ben != nil {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		sort.SliceStable(rows, func(i, j int) bool { return *rows[i].Ben < *rows[j].Ben })
		fmt.Fprintf(b, "## Worst points: %s\n\n", proc)
		b.WriteString("Per path: capacity Mbit/s / RTT ms / loss % / buffer BDP (queue packets); TCP = single-path goodput there (mean of its trials). " +
			"Subflows: path, MB acked, smoothed RTT, retransmitted segments.\n\n")
		b.WriteString("| point | BDP | Ben | MPTCP Mbit/s |")
		for p := 1; p <= d.Space.Paths; p++ {
			fmt.Fprintf(b, " path %d | TCP %d |", p, p)
		}
		b.WriteString(" subflows |\n|---|---|---:|---:|")
		for p := 1; p <= d.Space.Paths; p++ {
			b.WriteString("---|---:|")
		}
		b.WriteString("---|\n")
		for _, r := range rows[:min(n, len(rows))] {
			fmt.Fprintf(b, "| %s#%d | %s | %.2f | %.2f |", r.Point, r.Trial, r.BDP, *r.Ben, r.GoodputMbps)
			for p := 1; p <= d.Space.Paths; p++ {
				k := strconv.Itoa(p)
				fmt.Fprintf(b, " %.1f / %.0f / %.2f / %.2f (%.0f) | %.2f |", r.Params["capacity"+k+"_mbps"], r.Params["rtt"+k+"_ms"],
					r.Params["loss"+k+"_pct"], r.Params["buffer"+k+"_bdp"], r.Params["queue"+k+"_pkts"], single[r.Point][tcpPathPrefix+k])
			}
			fmt.Fprintf(b, " %s |\n", subflowText(r.Subflows))
		}
		b.WriteString("\n")
	}
}

func (rep *Report) failures(b *strings.Builder) {
	var lines []string
	for _, r := range rep.Rows {
		if r.Status != results.OK {
			lines = append(lines, fmt.Sprintf("- %s %s: %s: %s", r.Point, r.Procedure, r.Status, r.Reason))
		}
	}
	if len(lines) == 0 {
		return
	}
	b.WriteString("## Failed or unavailable\n\n" + strings.Join(lines, "\n") + "\n")
}
