package design

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
)

// The paired analysis (docs/design.md). Every point's procedures ran in the
// same lab build, trial by trial in rounds (trial t of every procedure,
// then t+1): a round is the unit that is resampled, so that whatever
// moved all procedures of a round together (the host's load) stays paired.

// BootstrapResamples is how many resamples a confidence interval takes.
const BootstrapResamples = 2000

// HarmFactor: a point is harmed when the whole 95 % interval of MPTCP /
// the best single path lies below this.
const HarmFactor = 0.95

// CI is an estimate with its bootstrap 95 % percentile interval. OK is
// false when the estimate could not be computed (a procedure without an
// ok trial); Lo and Hi are then NaN.
type CI struct {
	Est, Lo, Hi float64
	OK          bool
}

// pointTrials are one point's ok goodputs: procedure -> trial (round) ->
// Mbit/s.
type pointTrials map[string]map[int]float64

// rounds lists the trial numbers that hold any goodput, in order.
func (pt pointTrials) rounds() []int {
	seen := map[int]bool{}
	var out []int
	for _, m := range pt {
		for r := range m {
			if !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	sort.Ints(out)
	return out
}

// means is, per procedure, the mean goodput over the given rounds (a round
// listed twice counts twice); a procedure with no ok trial among them is
// absent.
func (pt pointTrials) means(rounds []int) map[string]float64 {
	out := map[string]float64{}
	for proc, m := range pt {
		var sum float64
		n := 0
		for _, r := range rounds {
			if g, ok := m[r]; ok {
				sum += g
				n++
			}
		}
		if n > 0 {
			out[proc] = sum / float64(n)
		}
	}
	return out
}

// stat computes a statistic from the per-procedure means; false when it is
// undefined for them.
type stat func(means map[string]float64) (float64, bool)

// bootstrap estimates stat on all rounds and its 95 % percentile interval
// over resamples of the rounds drawn with replacement (B resamples, rng).
// Resamples where stat is undefined are dropped; with fewer than half of
// them defined the interval is not OK.
func (pt pointTrials) bootstrap(f stat, b int, rng *rand.Rand) CI {
	rs := pt.rounds()
	nan := CI{Est: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	est, ok := f(pt.means(rs))
	if !ok || len(rs) == 0 {
		return nan
	}
	var vs []float64
	pick := make([]int, len(rs))
	for range b {
		for i := range pick {
			pick[i] = rs[rng.IntN(len(rs))]
		}
		if v, ok := f(pt.means(pick)); ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			vs = append(vs, v)
		}
	}
	if len(vs) < b/2 {
		return CI{Est: est, Lo: math.NaN(), Hi: math.NaN()}
	}
	sort.Float64s(vs)
	return CI{Est: est, Lo: quantile(vs, 0.025), Hi: quantile(vs, 0.975), OK: true}
}

// bestSingle is the highest single-path mean among singles and which one;
// false unless every single path has a mean.
func bestSingle(means map[string]float64, singles []string) (float64, string, bool) {
	best, name := math.Inf(-1), ""
	for _, s := range singles {
		g, ok := means[s]
		if !ok {
			return 0, "", false
		}
		if g > best {
			best, name = g, s
		}
	}
	return best, name, name != ""
}

// benStat is Ben of proc against the single paths' means.
func benStat(proc string, singles []string) stat {
	return func(m map[string]float64) (float64, bool) {
		g, ok := m[proc]
		if !ok {
			return 0, false
		}
		var c []float64
		for _, s := range singles {
			v, ok := m[s]
			if !ok {
				return 0, false
			}
			c = append(c, v)
		}
		v := Ben(g, c)
		return v, !math.IsNaN(v) && !math.IsInf(v, 0)
	}
}

// ratioStat is proc's mean over the best single path's mean.
func ratioStat(proc string, singles []string) stat {
	return func(m map[string]float64) (float64, bool) {
		g, ok := m[proc]
		best, _, okb := bestSingle(m, singles)
		if !ok || !okb || best <= 0 {
			return 0, false
		}
		return g / best, true
	}
}

// pairStat is a's mean over b's.
func pairStat(a, b string) stat {
	return func(m map[string]float64) (float64, bool) {
		x, ok1 := m[a]
		y, ok2 := m[b]
		if !ok1 || !ok2 || y <= 0 {
			return 0, false
		}
		return x / y, true
	}
}

// Harmed is the rule: MPTCP's interval (of its goodput over the
// best single path's) lies wholly below HarmFactor.
func Harmed(ratio CI) bool { return ratio.OK && ratio.Hi < HarmFactor }

// PointStat is the paired analysis of one point.
type PointStat struct {
	Point string
	BDP   string
	// Means are the procedures' mean goodputs, N their ok trials.
	Means map[string]float64
	N     map[string]int
	// Best is the single-path procedure with the highest mean.
	Best string
	// OnePath is the path mptcp-1sf ran over (0: not run).
	OnePath int
	// Ben, Ratio (goodput / best single path's) and Harmed per multipath
	// procedure; OneRatio is mptcp-1sf's goodput over TCP on the same
	// path (the kernel's own MPTCP cost there).
	Ben, Ratio map[string]CI
	Harmed     map[string]bool
	OneRatio   CI
	// Pairs: "a/b" -> a's mean over b's, for every two multipath
	// procedures in list order.
	Pairs map[string]CI
	// VsRef: every other multipath procedure's mean over RefProcedure's
	// (when both ran), whatever the list order: the issue's "not
	// significantly below static at any point".
	VsRef map[string]CI
	// RefRounds: per procedure of VsRef, the rounds in which both it and
	// RefProcedure have an ok trial.
	RefRounds map[string]int
	Load      []float64
}

// RefProcedure is the policy every other one is compared with per point.
const RefProcedure = "mptcp-static"

// BelowRef is true when proc's interval over RefProcedure lies wholly
// below 1: proc is significantly below static at that point.
func BelowRef(c CI) bool { return c.OK && c.Hi < 1 }

// AboveRef is true when the interval lies wholly above 1.
func AboveRef(c CI) bool { return c.OK && c.Lo > 1 }

// refOthers are the multipath procedures compared with RefProcedure; nil
// when it is not among them.
func refOthers(multi []string) []string {
	if !slices.Contains(multi, RefProcedure) {
		return nil
	}
	var out []string
	for _, m := range multi {
		if m != RefProcedure {
			out = append(out, m)
		}
	}
	return out
}

// pairedKinds sorts the paired procedures: single paths, multipath ones,
// and the first mptcp-1sf with its fixed path (0 = each point's BestPath).
func (d *Design) pairedKinds() (singles, multi []string, one string, onePath int) {
	ps, _ := d.pairedProcs()
	for _, p := range ps {
		switch {
		case p.Path > 0:
			singles = append(singles, p.Name)
		case p.OneSubflow:
			if one == "" {
				one, onePath = p.Name, p.OnePath
			}
		case p.Multipath():
			multi = append(multi, p.Name)
		}
	}
	return singles, multi, one, onePath
}

// seedOf is a point's resampling seed: reports are reproducible.
func seedOf(point string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(point))
	return h.Sum64()
}

// PointStats computes the paired analysis of every point with rows of the
// paired run.
func (rep *Report) PointStats() []PointStat {
	d := rep.Design
	singles, multi, one, onePath := d.pairedKinds()
	points := map[string]Point{}
	for _, pt := range d.Points {
		points[pt.ID] = pt
	}
	trials := map[string]pointTrials{}
	load := map[string][]float64{}
	n := map[string]map[string]int{}
	for _, r := range rep.Rows {
		if r.Status != results.OK {
			continue
		}
		if trials[r.Point] == nil {
			trials[r.Point], n[r.Point] = pointTrials{}, map[string]int{}
		}
		if trials[r.Point][r.Procedure] == nil {
			trials[r.Point][r.Procedure] = map[int]float64{}
		}
		trials[r.Point][r.Procedure][r.Trial] = r.GoodputMbps
		n[r.Point][r.Procedure]++
		load[r.Point] = append(load[r.Point], r.LoadAvg)
	}
	var ids []string
	for id := range trials {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []PointStat
	for _, id := range ids {
		pt := points[id]
		tr := trials[id]
		rng := rand.New(rand.NewPCG(seedOf(id), 26))
		st := PointStat{Point: id, BDP: pt.Class(d.LowBDP), Means: tr.means(tr.rounds()), N: n[id],
			Ben: map[string]CI{}, Ratio: map[string]CI{}, Harmed: map[string]bool{}, Pairs: map[string]CI{}, VsRef: map[string]CI{}, RefRounds: map[string]int{}, Load: load[id]}
		_, st.Best, _ = bestSingle(st.Means, singles)
		for _, m := range multi {
			st.Ben[m] = tr.bootstrap(benStat(m, singles), BootstrapResamples, rng)
			st.Ratio[m] = tr.bootstrap(ratioStat(m, singles), BootstrapResamples, rng)
			st.Harmed[m] = Harmed(st.Ratio[m])
		}
		for i, a := range multi {
			for _, b := range multi[i+1:] {
				st.Pairs[a+"/"+b] = tr.bootstrap(pairStat(a, b), BootstrapResamples, rng)
			}
		}
		if one != "" && len(pt.Paths) > 0 {
			k := onePath
			if k == 0 {
				k = pt.BestPath()
			}
			st.OnePath = k
			st.OneRatio = tr.bootstrap(pairStat(one, tcpPathPrefix+strconv.Itoa(k)), BootstrapResamples, rng)
		}
		// Last, so that the intervals above stay those of earlier reports.
		for _, m := range refOthers(multi) {
			st.VsRef[m] = tr.bootstrap(pairStat(m, RefProcedure), BootstrapResamples, rng)
			for r := range tr[m] {
				if _, ok := tr[RefProcedure][r]; ok {
					st.RefRounds[m]++
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// Targets of the paired design (docs/design.md).
const (
	TargetPoints    = 60   // points measured (x 3 trials)
	TargetHarmedMax = 0.05 // harmed points at most this share
	TargetNearBest  = 0.90 // mean MPTCP >= 0.95 x best single at this share of points
	TargetLowBenMed = 0.7  // median Ben of low-BDP points
)

func geoMean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range v {
		if x <= 0 {
			return math.NaN()
		}
		s += math.Log(x)
	}
	return math.Exp(s / float64(len(v)))
}

// num prints v with prec decimals, "-" for NaN.
func num(v float64, prec int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func ciText(c CI) string { return ciTextPrec(c, 2) }

// ciTextPrec prints an estimate and, when it has one, its interval, with
// prec decimals ("-" when there is no estimate).
func ciTextPrec(c CI, prec int) string {
	if math.IsNaN(c.Est) {
		return "-"
	}
	if !c.OK {
		return num(c.Est, prec)
	}
	return fmt.Sprintf("%s [%s, %s]", num(c.Est, prec), num(c.Lo, prec), num(c.Hi, prec))
}

// paired writes the paired analysis: per multipath procedure the harmed
// points, the share near the best single path, Ben medians; the kernel's
// own cost (mptcp-1sf); the procedures compared pairwise; every point.
func (rep *Report) paired(b *strings.Builder) {
	d := rep.Design
	if !d.Paired {
		return
	}
	stats := rep.PointStats()
	if len(stats) == 0 {
		return
	}
	singles, multi, one, _ := d.pairedKinds()
	var loads []float64
	for _, s := range stats {
		loads = append(loads, s.Load...)
	}
	sort.Float64s(loads)
	fmt.Fprintf(b, "## Paired analysis\n\n")
	orderText := "whose order rotates (round t starts at the procedure t-1+k of the list for the k-th point run; each procedure " +
		"always follows the same one)"
	if d.Order != OrderRotate {
		orderText = "in a balanced order (a Williams square per point, shuffled from the seed and the point: no procedure " +
			"always follows the same one)"
	}
	fmt.Fprintf(b, "Every procedure of a point ran on the same lab build, one session per trial, in rounds "+orderText+". Per point: the mean of the ok trials; 95 %% "+
		"intervals are bootstrap percentile intervals over %d resamples of the rounds (a round's procedures are resampled "+
		"together, so what moved a whole round stays paired; with 3 rounds an interval is close to the range of the trials). "+
		"**Harmed**: the interval of MPTCP / best single path lies wholly below %.2f. Best single path = the single-path "+
		"procedure with the highest mean at that point. Load (1-min load average at the trials' ends): min %.2f, median %.2f, max %.2f.\n\n",
		BootstrapResamples, HarmFactor, quantile(loads, 0), quantile(loads, 0.5), quantile(loads, 1))
	b.WriteString("| procedure | points | harmed | mean >= 0.95 x best | MPTCP / best: geometric mean | median Ben | median Ben, low BDP (n) | median Ben, high BDP (n) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	type agg struct {
		n, harmed, near int
		harmedIDs       []string
		ratios          []float64
		ben, low, high  []float64
	}
	aggs := map[string]*agg{}
	for _, m := range multi {
		a := &agg{}
		aggs[m] = a
		for _, s := range stats {
			r, ok := s.Ratio[m]
			if !ok || math.IsNaN(r.Est) {
				continue
			}
			a.n++
			if s.Harmed[m] {
				a.harmed++
				a.harmedIDs = append(a.harmedIDs, s.Point)
			}
			if r.Est >= HarmFactor {
				a.near++
			}
			a.ratios = append(a.ratios, r.Est)
			if bn := s.Ben[m]; !math.IsNaN(bn.Est) {
				a.ben = append(a.ben, bn.Est)
				if s.BDP == LowBDP {
					a.low = append(a.low, bn.Est)
				} else {
					a.high = append(a.high, bn.Est)
				}
			}
		}
		sort.Float64s(a.ben)
		sort.Float64s(a.low)
		sort.Float64s(a.high)
		frac := func(k int) string {
			if a.n == 0 {
				return "-"
			}
			return fmt.Sprintf("%d (%.0f %%)", k, 100*float64(k)/float64(a.n))
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s (%d) | %s (%d) |\n", m, a.n, frac(a.harmed), frac(a.near),
			num(geoMean(a.ratios), 3), num(quantile(a.ben, 0.5), 2), num(quantile(a.low, 0.5), 2), len(a.low), num(quantile(a.high, 0.5), 2), len(a.high))
	}
	b.WriteString("\n")
	for _, m := range multi {
		fmt.Fprintf(b, "Harmed points, %s: %s.\n", m, idList(aggs[m].harmedIDs))
	}
	b.WriteString("\n")
	few, okTrials := map[string][]string{}, map[string]int{}
	for _, r := range rep.Rows {
		if r.Status == results.OK {
			okTrials[r.Procedure]++
			if strings.HasPrefix(r.Reason, bench.KeptFewSubflows) {
				few[r.Procedure] = append(few[r.Procedure], fmt.Sprintf("%s/%d", r.Point, r.Trial))
			}
		}
	}
	for _, m := range multi {
		if len(few[m]) > 0 {
			fmt.Fprintf(b, "%s: %d of its %d ok trials ended with fewer subflows than it opened (it closes detours that harm; "+
				"kept as its measurements, not failures): %s.\n", m, len(few[m]), okTrials[m], strings.Join(few[m], ", "))
		}
	}
	b.WriteString("\n")
	if one != "" {
		var r []float64
		below := 0
		for _, s := range stats {
			if !math.IsNaN(s.OneRatio.Est) {
				r = append(r, s.OneRatio.Est)
				if s.OneRatio.OK && s.OneRatio.Hi < HarmFactor {
					below++
				}
			}
		}
		fmt.Fprintf(b, "**The kernel's own cost** (%s = MPTCP over the modelled best path alone, no agent, against TCP on that path): "+
			"geometric mean %s over %d points; interval wholly below %.2f at %d of them.\n\n", one, num(geoMean(r), 3), len(r), HarmFactor, below)
	}
	if len(multi) > 1 {
		b.WriteString("**Procedures compared pairwise** (per point a / b of the means with its interval; below = interval wholly below 1):\n\n" +
			"| a / b | points | geometric mean | a below b | a above b |\n|---|---:|---:|---:|---:|\n")
		for i, x := range multi {
			for _, y := range multi[i+1:] {
				var r []float64
				below, above := 0, 0
				for _, s := range stats {
					c, ok := s.Pairs[x+"/"+y]
					if !ok || math.IsNaN(c.Est) {
						continue
					}
					r = append(r, c.Est)
					if c.OK && c.Hi < 1 {
						below++
					}
					if c.OK && c.Lo > 1 {
						above++
					}
				}
				fmt.Fprintf(b, "| %s / %s | %d | %s | %d | %d |\n", x, y, len(r), num(geoMean(r), 3), below, above)
			}
		}
		b.WriteString("\n")
	}
	others := refOthers(multi)
	below := map[string][]string{}
	if len(others) > 0 {
		fmt.Fprintf(b, "**Against %s, per point** (X / %s of the means with its 95 %% interval; below or above = the interval lies wholly below or above 1):\n\n"+
			"| X | points | geometric mean [95 %% interval over points] | X below %s | X above %s | expected by chance, each way | sign test (below vs above) |\n|---|---:|---:|---|---|---:|---:|\n",
			RefProcedure, RefProcedure, RefProcedure, RefProcedure)
		for _, m := range others {
			var r []float64
			var above []string
			chance := 0.0
			for _, s := range stats {
				c, ok := s.VsRef[m]
				if !ok || math.IsNaN(c.Est) {
					continue
				}
				r = append(r, c.Est)
				chance += ChanceOneWay(s.RefRounds[m])
				if BelowRef(c) {
					below[m] = append(below[m], s.Point+" "+ciText(c))
				}
				if AboveRef(c) {
					above = append(above, s.Point+" "+ciText(c))
				}
			}
			gm := geoMeanCI(r)
			fmt.Fprintf(b, "| %s | %d | %s | %d: %s | %d: %s | %s | p = %s |\n", m, len(r), ciText3(gm), len(below[m]), idList(below[m]),
				len(above), idList(above), num(chance, 1), num(SignTest(len(below[m]), len(above)), 3))
		}
		fmt.Fprintf(b, "\nWith k <= 3 rounds a point's interval lies wholly below 1 only when X is below %s in every round "+
			"(a resample of one round repeated has probability k^-k >= 1/27 > 2.5 %%), so for two procedures that do not differ "+
			"it happens at a point with probability 2^-k (1 in 8 for 3 rounds): the column \"expected by chance\" sums that over the "+
			"points (an upper bound for more rounds). A single \"below\" point is therefore weak evidence; the counts below and above, "+
			"compared with each other (two-sided sign test) and with chance, and the geometric mean's interval (Student t over the points' log ratios) "+
			"say more.\n\n", RefProcedure)
	}
	b.WriteString("### Targets\n\n| procedure | target | measured | points | verdict |\n|---|---|---:|---:|---|\n")
	for _, m := range multi {
		a := aggs[m]
		fmt.Fprintf(b, "| %s | >= %d points x %d trials | %d | %d | %s |\n", m, TargetPoints, max(1, d.Trials), a.n, a.n, verdict(float64(a.n), TargetPoints, a.n))
		hf, nf := math.NaN(), math.NaN()
		if a.n > 0 {
			hf, nf = float64(a.harmed)/float64(a.n), float64(a.near)/float64(a.n)
		}
		v := verdict(1-hf, 1-TargetHarmedMax, a.n)
		fmt.Fprintf(b, "| %s | harmed points <= %.0f %% | %s | %d | %s |\n", m, 100*TargetHarmedMax, pct(hf), a.n, v)
		fmt.Fprintf(b, "| %s | mean >= 0.95 x best single path at >= %.0f %% of points | %s | %d | %s |\n", m, 100*TargetNearBest, pct(nf), a.n, verdict(nf, TargetNearBest, a.n))
		med := quantile(a.low, 0.5)
		fmt.Fprintf(b, "| %s | median Ben of low-BDP points >= %.1f | %s | %d | %s |\n", m, TargetLowBenMed, num(med, 2), len(a.low), verdict(med, TargetLowBenMed, len(a.low)))
		if slices.Contains(others, m) {
			k := len(below[m])
			v := "not measured"
			switch {
			case a.n > 0 && k == 0:
				v = "met"
			case k > 0:
				v = "missed"
			}
			fmt.Fprintf(b, "| %s | not significantly below %s at any point | %d | %d | %s |\n", m, RefProcedure, k, a.n, v)
		}
	}
	b.WriteString("\n")
	b.WriteString("### Per point\n\nPer path: capacity Mbit/s / RTT ms / loss % / buffer BDP; then each procedure's mean goodput " +
		"(Mbit/s, ok trials in brackets when fewer than all). Per multipath procedure: Ben and MPTCP / best single path with their " +
		"intervals, **H** = harmed.\n\n| point | BDP | paths |")
	for _, s := range singles {
		fmt.Fprintf(b, " %s |", s)
	}
	if one != "" {
		fmt.Fprintf(b, " %s (path) | %s / TCP same path |", one, one)
	}
	for _, m := range multi {
		fmt.Fprintf(b, " %s | Ben %s | %s / best |", m, m, m)
	}
	for _, m := range others {
		fmt.Fprintf(b, " %s / %s |", m, RefProcedure)
	}
	b.WriteString("\n|---|---|---|")
	for range singles {
		b.WriteString("---:|")
	}
	if one != "" {
		b.WriteString("---:|---:|")
	}
	for range multi {
		b.WriteString("---:|---:|---:|")
	}
	for range others {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	points := map[string]Point{}
	for _, pt := range d.Points {
		points[pt.ID] = pt
	}
	trials := max(1, d.Trials)
	g := func(s PointStat, proc string) string {
		v, ok := s.Means[proc]
		if !ok {
			return "-"
		}
		t := fmt.Sprintf("%.2f", v)
		if s.N[proc] < trials {
			t += fmt.Sprintf(" (%d)", s.N[proc])
		}
		return t
	}
	for _, s := range stats {
		var paths []string
		for _, p := range points[s.Point].Paths {
			paths = append(paths, fmt.Sprintf("%.1f / %.0f / %.3f / %.2f", p.CapacityMbps, p.RTTms, p.LossPct, p.BufferBDP))
		}
		fmt.Fprintf(b, "| %s | %s | %s |", s.Point, s.BDP, strings.Join(paths, "; "))
		for _, x := range singles {
			t := g(s, x)
			if x == s.Best {
				t = "**" + t + "**"
			}
			fmt.Fprintf(b, " %s |", t)
		}
		if one != "" {
			fmt.Fprintf(b, " %s (path %d) | %s |", g(s, one), s.OnePath, ciText(s.OneRatio))
		}
		for _, m := range multi {
			h := ""
			if s.Harmed[m] {
				h = " **H**"
			}
			fmt.Fprintf(b, " %s | %s | %s%s |", g(s, m), ciText(s.Ben[m]), ciText(s.Ratio[m]), h)
		}
		for _, m := range others {
			c, ok := s.VsRef[m]
			t := "-"
			if ok {
				t = ciText(c)
				if BelowRef(c) {
					t += " **below**"
				}
			}
			fmt.Fprintf(b, " %s |", t)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// idList joins items with commas, "none" when there are none.
func idList(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

// ChanceOneWay is the probability that a point's interval of X / ref lies
// wholly below 1 (or wholly above) when X and ref do not differ and the k
// rounds are exchangeable: with k <= 3 the percentile interval excludes 1
// only when X is below in every round (2^-k); with more rounds it is at
// most that. 0 for no rounds.
func ChanceOneWay(k int) float64 {
	if k <= 0 {
		return 0
	}
	return math.Pow(2, -float64(k))
}

// SignTest is the two-sided binomial (p = 1/2) probability of a split at
// least as uneven as below:above; NaN when both are 0.
func SignTest(below, above int) float64 {
	n := below + above
	if n == 0 {
		return math.NaN()
	}
	k := min(below, above)
	var p float64
	for i := 0; i <= k; i++ {
		p += math.Exp(lchoose(n, i) - float64(n)*math.Ln2)
	}
	return math.Min(1, 2*p)
}

func lchoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// geoMeanCI is the geometric mean of v with a 95 % Student t interval
// of the mean of log(v) (n-1 degrees of freedom), taken back to ratios.
// It replaced a bootstrap percentile interval over v's elements, which is
// far too narrow for the few points these comparisons have: for n normal
// values it excludes the true mean in about 22 % of samples at n = 4 and
// 12 % at n = 8 instead of 5 % (docs/results/design/aa), so two identical
// configurations looked "significantly" different. The t interval keeps
// 5 % at any n when the log ratios are roughly normal; with one value it
// has no width (OK false).
func geoMeanCI(v []float64) CI {
	est := geoMean(v)
	if len(v) < 2 || math.IsNaN(est) {
		return CI{Est: est, Lo: math.NaN(), Hi: math.NaN()}
	}
	var sum, ss float64
	for _, x := range v {
		sum += math.Log(x)
	}
	m := sum / float64(len(v))
	for _, x := range v {
		ss += (math.Log(x) - m) * (math.Log(x) - m)
	}
	half := tQuantile975(len(v)-1) * math.Sqrt(ss/float64(len(v)-1)/float64(len(v)))
	return CI{Est: est, Lo: math.Exp(m - half), Hi: math.Exp(m + half), OK: true}
}

// t975 holds the 97.5 % quantiles of Student's t for 1..30 degrees of
// freedom (the standard table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// tQuantile975 is the 97.5 % quantile of Student's t with df degrees of
// freedom: the table up to 30, above it the Cornish-Fisher expansion
// around the normal quantile (error below 1e-4 there). No library in
// the module has it (gonum's stat is not a dependency; plot is).
func tQuantile975(df int) float64 {
	if df < 1 {
		return math.NaN()
	}
	if df <= len(t975) {
		return t975[df-1]
	}
	z, n := 1.959964, float64(df)
	z3, z5 := z*z*z, z*z*z*z*z
	return z + (z3+z)/(4*n) + (5*z5+16*z3+3*z)/(96*n*n)
}

// ciText3 is ciText with three decimals.
func ciText3(c CI) string { return ciTextPrec(c, 3) }
