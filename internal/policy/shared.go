package policy

import (
	"fmt"
	"math"
	"time"
)

// Shared-bottleneck detection, in the spirit of RFC 8382 (Shared
// Bottleneck Detection for Coupled Congestion Control): two flows that
// cross the same queue see the same queueing delay at the same time. The
// RFC summarises each flow's one-way delay over a window (skewness,
// variability, oscillation frequency) and groups flows whose summaries
// agree; the agent has no one-way delays, but it samples every subflow's
// smoothed RTT and minimum RTT every probe (measure.go), so each subflow
// has a queueing-delay series q = RTT - base RTT on a common time base.
// Two subflows are judged to share a bottleneck when, over the window,
// both queue (their mean q is at least MinQueue and it moves), their q
// series move together (Pearson correlation at least MinCorr) and they
// sit at the same level (the mean |qa - qb| is at most MaxGap of their
// mean q: one queue gives one delay; two queues that fill and drain at
// the same time still differ in depth). Disjoint bottlenecks, an idle
// subflow, or a queue on only one path say "not shared".

// MinSharedSamples is the default of SharedTest.MinSamples: the fewest
// aligned samples a verdict is given on (a window must hold that many
// probes).
const MinSharedSamples = 10

// SharedTest holds the detector's thresholds; zero fields take the
// defaults in brackets.
type SharedTest struct {
	// MinSamples: fewer aligned samples than this give no verdict [10].
	MinSamples int
	// MinQueue: both subflows' mean queueing delay must reach it [5ms].
	MinQueue time.Duration
	// MinCorr: the correlation of the two series must reach it [0.8].
	MinCorr float64
	// MaxGap: the mean |qa - qb| must be at most this share of the two
	// series' mean [0.3].
	MaxGap float64
	// MaxLag: the series are also compared shifted by up to this many
	// samples either way [2].
	MaxLag int
}

// SharedVerdict is the detector's answer with the statistics it used.
type SharedVerdict struct {
	Shared bool
	// N is the number of aligned samples; QA and QB the mean queueing
	// delays; Corr the correlation; Gap the mean |qa - qb| over the mean
	// of QA and QB.
	N       int
	QA, QB  time.Duration
	Corr    float64
	Gap     float64
	Verdict string // why (not) shared, for logs and status
}

func (t SharedTest) withDefaults() SharedTest {
	positive(&t.MinSamples, MinSharedSamples)
	positive(&t.MinQueue, 5*time.Millisecond)
	positive(&t.MinCorr, 0.8)
	positive(&t.MaxGap, 0.3)
	positive(&t.MaxLag, 2)
	return t
}

// Judge compares two queueing-delay series sampled at the same instants
// (a[i] and b[i] at the same probe). Negative entries are treated as 0 (a
// smoothed RTT below the minimum is a sampling artefact). Each subflow
// sees the queue through its own smoothed RTT, which lags the queue by
// about 8 of its acks: the series are compared at every shift of up to
// MaxLag samples, and the shift that correlates best counts.
func (t SharedTest) Judge(a, b []time.Duration) SharedVerdict {
	t = t.withDefaults()
	n := min(len(a), len(b))
	v := SharedVerdict{N: n}
	if n < t.MinSamples {
		v.Verdict = fmt.Sprintf("%d samples, need %d", n, t.MinSamples)
		return v
	}
	x, y := make([]float64, n), make([]float64, n)
	var mx, my float64
	for i := range n {
		x[i], y[i] = max(a[i].Seconds(), 0), max(b[i].Seconds(), 0)
		mx += x[i]
		my += y[i]
	}
	v.QA, v.QB = seconds(mx/float64(n)), seconds(my/float64(n))
	if min(v.QA, v.QB) < t.MinQueue {
		v.Verdict = fmt.Sprintf("not both queueing (mean queueing delay %s and %s, need %s)", ms(v.QA), ms(v.QB), t.MinQueue)
		return v
	}
	best, lag := -2.0, 0
	for l := -t.MaxLag; l <= t.MaxLag; l++ {
		xs, ys := x[max(0, -l):n-max(0, l)], y[max(0, l):n-max(0, -l)]
		corr, gap, ok := compare(xs, ys)
		if ok && corr > best {
			best, lag, v.Corr, v.Gap = corr, l, corr, gap
		}
	}
	if best < -1 {
		v.Verdict = fmt.Sprintf("a queueing delay does not move (%s and %s)", ms(v.QA), ms(v.QB))
		return v
	}
	v.Shared = v.Corr >= t.MinCorr && v.Gap <= t.MaxGap
	v.Verdict = fmt.Sprintf("queueing %s and %s, correlation %.2f (need %.2f) at a shift of %d samples, gap %.2f of the mean (at most %.2f) over %d samples",
		ms(v.QA), ms(v.QB), v.Corr, t.MinCorr, lag, v.Gap, t.MaxGap, n)
	return v
}

// compare returns the Pearson correlation of x and y (same length) and
// their mean absolute difference over their mean; ok is false when either
// does not move (sd below 0.5 ms: nothing to correlate).
func compare(x, y []float64) (corr, gap float64, ok bool) {
	n := float64(len(x))
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
		gap += math.Abs(x[i] - y[i])
	}
	mx, my, gap = mx/n, my/n, gap/n
	var sxy, sxx, syy float64
	for i := range x {
		dx, dy := x[i]-mx, y[i]-my
		sxy += dx * dy
		sxx += dx * dx
		syy += dy * dy
	}
	if flat := 0.5e-3 * 0.5e-3 * n; sxx < flat || syy < flat {
		return 0, 0, false
	}
	return sxy / math.Sqrt(sxx*syy), gap / ((mx + my) / 2), true
}

func seconds(s float64) time.Duration  { return time.Duration(s * float64(time.Second)) }
func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
