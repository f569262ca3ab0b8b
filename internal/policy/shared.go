package policy

import (
	"fmt"
	"slices"
	"time"
)

// Shared-bottleneck detection, in the spirit of RFC 8382 (Shared
// Bottleneck Detection for Coupled Congestion Control): flows that cross
// the same queue see the same queueing delay. The RFC summarises each
// flow's one-way delay over a window (skewness, variability, oscillation
// frequency) and groups flows whose summaries agree; the agent has no
// one-way delays, but it samples every subflow's smoothed RTT and minimum
// RTT every probe (measure.go), so each subflow has a queueing-delay
// series q = RTT - base RTT on a common time base. Two subflows are
// judged to share a bottleneck when, over the window, both queue (the
// upper quartile of q is at least MinQueue), they queue at the same level
// (the smaller upper quartile is at least MinLevel of the larger: one
// queue gives one delay) and they agree sample by sample (at least
// MinAgree of the probes see |qa - qb| within a quarter of the larger, or
// MinQueue).
//
// Why not the correlation of the two series: sampled in the lab
// (brennan2017, a WireGuard tunnel detour and the default path through
// the client's 10 Mbit/s access link, every 100 ms), the default path's
// smoothed RTT drops to its minimum for single probes every second or so
// while the tunnel's stays at the shared queue's ~50 ms, which puts the
// correlation of the shared pair near 0 (-0.1 to 0.6 over 3 s windows)
// and that of a disjoint pair (core-limited) up to 0.65. The levels
// separate them: on the shared pair the two upper quartiles are within
// 4-38 %, on the disjoint ones 23 % to 100x apart.

// SharedTest holds the detector's thresholds; zero fields take the
// defaults in brackets.
type SharedTest struct {
	// MinSamples: fewer aligned samples than this give no verdict
	// [MinSharedSamples].
	MinSamples int
	// MinQueue: both subflows' upper-quartile queueing delay must reach
	// it; also the smallest tolerance of a sample's agreement [5ms].
	MinQueue time.Duration
	// MinLevel: the smaller upper quartile must be at least this share of
	// the larger [0.75].
	MinLevel float64
	// MinAgree: at least this share of the samples must agree [0.5].
	MinAgree float64
	// MaxLag: the series are also compared shifted by up to this many
	// samples either way (each subflow's smoothed RTT lags the queue by
	// about 8 of its own acks) [2].
	MaxLag int
}

// MinSharedSamples is the default of SharedTest.MinSamples: the fewest
// aligned samples a verdict is given on (a window must hold that many
// probes).
const MinSharedSamples = 10

// sharedTolerance: two samples agree within this share of the larger.
const sharedTolerance = 0.25

// SharedVerdict is the detector's answer with the statistics it used.
type SharedVerdict struct {
	Shared bool
	// N is the number of aligned samples; QA and QB the upper quartiles of
	// the queueing delays; Level the smaller over the larger; Agree the
	// share of samples that agree (at the best shift).
	N       int
	QA, QB  time.Duration
	Level   float64
	Agree   float64
	Verdict string // why (not) shared, for logs and status
}

func (t SharedTest) withDefaults() SharedTest {
	positive(&t.MinSamples, MinSharedSamples)
	positive(&t.MinQueue, 5*time.Millisecond)
	positive(&t.MinLevel, 0.75)
	positive(&t.MinAgree, 0.5)
	positive(&t.MaxLag, 2)
	return t
}

// Judge compares two queueing-delay series sampled at the same instants
// (a[i] and b[i] at the same probe). Negative entries are treated as 0 (a
// smoothed RTT below the minimum is a sampling artefact).
func (t SharedTest) Judge(a, b []time.Duration) SharedVerdict {
	t = t.withDefaults()
	n := min(len(a), len(b))
	v := SharedVerdict{N: n}
	if n < t.MinSamples {
		v.Verdict = fmt.Sprintf("%d samples, need %d", n, t.MinSamples)
		return v
	}
	x, y := make([]time.Duration, n), make([]time.Duration, n)
	for i := range n {
		x[i], y[i] = max(a[i], 0), max(b[i], 0)
	}
	v.QA, v.QB = quartile3(x), quartile3(y)
	if min(v.QA, v.QB) < t.MinQueue {
		v.Verdict = fmt.Sprintf("not both queueing (upper quartiles %s and %s, need %s)", ms(v.QA), ms(v.QB), t.MinQueue)
		return v
	}
	v.Level = float64(min(v.QA, v.QB)) / float64(max(v.QA, v.QB))
	lag := 0
	for l := -t.MaxLag; l <= t.MaxLag; l++ {
		if ag := agree(x[max(0, -l):n-max(0, l)], y[max(0, l):n-max(0, -l)], t.MinQueue); ag > v.Agree {
			v.Agree, lag = ag, l
		}
	}
	v.Shared = v.Level >= t.MinLevel && v.Agree >= t.MinAgree
	v.Verdict = fmt.Sprintf("upper quartiles %s and %s (level %.2f, need %.2f), %.0f%% of %d samples agree at a shift of %d (need %.0f%%)",
		ms(v.QA), ms(v.QB), v.Level, t.MinLevel, 100*v.Agree, n, lag, 100*t.MinAgree)
	return v
}

// agree is the share of pairs (x[i], y[i]) within sharedTolerance of the
// larger, or within floor.
func agree(x, y []time.Duration, floor time.Duration) float64 {
	if len(x) == 0 {
		return 0
	}
	ok := 0
	for i := range x {
		d := x[i] - y[i]
		if d < 0 {
			d = -d
		}
		if d <= max(floor, time.Duration(sharedTolerance*float64(max(x[i], y[i])))) {
			ok++
		}
	}
	return float64(ok) / float64(len(x))
}

// quartile3 is the upper quartile of s (s is not changed).
func quartile3(s []time.Duration) time.Duration {
	c := slices.Clone(s)
	slices.Sort(c)
	return c[(len(c)-1)*3/4]
}

func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
