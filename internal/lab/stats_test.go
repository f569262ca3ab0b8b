package lab

import (
	"math"
	"testing"
)

func TestBinomialInterval(t *testing.T) {
	// Reference values: 5/10 and 0/n have textbook/closed forms (1-0.005^(1/n));
	// 20/2000 was checked by exact decimal summation of the binomial tail.
	cases := []struct {
		k, n   int
		conf   float64
		lo, hi float64
	}{
		{20, 2000, 0.99, 0.005188, 0.017270},
		{0, 2000, 0.99, 0, 0.002646},
		{5, 10, 0.95, 0.187086, 0.812914},
	}
	for _, c := range cases {
		lo, hi := BinomialInterval(c.k, c.n, c.conf)
		if math.Abs(lo-c.lo) > 2e-5 || math.Abs(hi-c.hi) > 2e-5 {
			t.Errorf("BinomialInterval(%d, %d, %v) = [%.6f, %.6f], want [%.6f, %.6f]", c.k, c.n, c.conf, lo, hi, c.lo, c.hi)
		}
	}
}
