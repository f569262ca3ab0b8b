package stats

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{4, 1, 3, 2})
	if s.N != 4 || !near(s.Mean, 2.5) || !near(s.Median, 2.5) || s.Min != 1 || s.Max != 4 {
		t.Fatalf("summary %+v", s)
	}
	// sample sd of 1..4 = sqrt(5/3)
	if !near(s.SD, math.Sqrt(5.0/3)) {
		t.Fatalf("sd %v", s.SD)
	}
	if !near(s.Q1, 1.75) || !near(s.Q3, 3.25) {
		t.Fatalf("quartiles %v %v", s.Q1, s.Q3)
	}
	if one := Summarize([]float64{9.5}); one.SD != 0 || one.Median != 9.5 {
		t.Fatalf("single value %+v", one)
	}
	if (Summarize(nil) != Summary{}) {
		t.Fatal("empty sample not zero")
	}
	odd := Summarize([]float64{5, 1, 9})
	if odd.Median != 5 {
		t.Fatalf("odd median %v", odd.Median)
	}
}

func TestBenefit(t *testing.T) {
	caps := []float64{9.55, 9.55}
	cases := []struct{ g, want float64 }{
		{19.10, 1},    // perfect aggregation
		{9.55, 0},     // as good as the best path
		{0, -1},       // nothing delivered
		{14.325, 0.5}, // half the second path
		{4.775, -0.5}, // half the best path
	}
	for _, c := range cases {
		if got := Benefit(c.g, caps); !near(got, c.want) {
			t.Errorf("Benefit(%v) = %v, want %v", c.g, got, c.want)
		}
	}
	if got := Benefit(10, []float64{6, 9, 3}); !near(got, 1.0/9) {
		t.Errorf("three paths: %v", got)
	}
	if !math.IsNaN(Benefit(5, nil)) || !math.IsNaN(Benefit(12, []float64{10})) {
		t.Error("undefined benefit not NaN")
	}
}
