package lab

import "math"

// BinomialInterval returns the exact (Clopper-Pearson) two-sided
// confidence interval for a probability p after k successes in n trials.
// It is conservative: the true coverage is at least conf.
func BinomialInterval(k, n int, conf float64) (lo, hi float64) {
	if n <= 0 || k < 0 || k > n {
		return 0, 1
	}
	alpha := (1 - conf) / 2
	if k > 0 {
		// lo: P(X >= k | lo) = alpha.
		lo = bisect(func(p float64) bool { return 1-binomCDF(k-1, n, p) < alpha })
	}
	hi = 1
	if k < n {
		// hi: P(X <= k | hi) = alpha.
		hi = bisect(func(p float64) bool { return binomCDF(k, n, p) > alpha })
	}
	return lo, hi
}

// bisect finds the boundary in [0, 1] where below(p) turns false,
// assuming below is true for small p and false for large p.
func bisect(below func(float64) bool) float64 {
	a, b := 0.0, 1.0
	for range 60 {
		m := (a + b) / 2
		if below(m) {
			a = m
		} else {
			b = m
		}
	}
	return (a + b) / 2
}

// binomCDF is P(X <= k) for X ~ Binomial(n, p), summed in log space.
func binomCDF(k, n int, p float64) float64 {
	if p <= 0 {
		return 1
	}
	if p >= 1 {
		if k >= n {
			return 1
		}
		return 0
	}
	lp, lq := math.Log(p), math.Log1p(-p)
	lgn, _ := math.Lgamma(float64(n + 1))
	s := 0.0
	for i := 0; i <= k; i++ {
		a, _ := math.Lgamma(float64(i + 1))
		b, _ := math.Lgamma(float64(n - i + 1))
		s += math.Exp(lgn - a - b + float64(i)*lp + float64(n-i)*lq)
	}
	return math.Min(s, 1)
}
