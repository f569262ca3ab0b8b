// Package stats holds the summary statistics of benchmark reports: mean,
// sample standard deviation, median, and the aggregation benefit of a
// multipath transfer.
package stats

import (
	"math"
	"sort"
)

// Summary describes a sample of goodputs.
type Summary struct {
	N                int
	Mean, SD, Median float64
	Min, Max, Q1, Q3 float64
}

// Summarize computes the summary of xs; a zero Summary for no data. SD is
// the sample standard deviation (n-1), 0 for a single value.
func Summarize(xs []float64) Summary {
	n := len(xs)
	if n == 0 {
		return Summary{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(n)
	var ss float64
	for _, x := range s {
		ss += (x - mean) * (x - mean)
	}
	sd := 0.0
	if n > 1 {
		sd = math.Sqrt(ss / float64(n-1))
	}
	return Summary{
		N: n, Mean: mean, SD: sd,
		Median: Quantile(s, 0.5), Q1: Quantile(s, 0.25), Q3: Quantile(s, 0.75),
		Min: s[0], Max: s[n-1],
	}
}

// Quantile returns the p-quantile of sorted xs by linear interpolation
// between closest ranks (the R-7 / spreadsheet definition).
func Quantile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	h := p * float64(n-1)
	lo := math.Floor(h)
	i := int(lo)
	if i >= n-1 {
		return sorted[n-1]
	}
	return sorted[i] + (h-lo)*(sorted[i+1]-sorted[i])
}

// Benefit is the aggregation benefit of goodput g over paths of capacities
// caps (from the 2013 MPTCP evaluation cited in detour-evaluation.md):
// (g - Cmax) / (sum C - Cmax) when g >= Cmax, else (g - Cmax) / Cmax.
// 0 = as good as the best single path, 1 = perfect aggregation, -1 =
// nothing delivered. NaN when it is undefined (no capacities, or g above
// Cmax with a single path).
func Benefit(g float64, caps []float64) float64 {
	if len(caps) == 0 {
		return math.NaN()
	}
	var sum, cmax float64
	for _, c := range caps {
		sum += c
		cmax = math.Max(cmax, c)
	}
	if cmax <= 0 {
		return math.NaN()
	}
	if g >= cmax {
		if sum-cmax <= 0 {
			return math.NaN()
		}
		return (g - cmax) / (sum - cmax)
	}
	return (g - cmax) / cmax
}
