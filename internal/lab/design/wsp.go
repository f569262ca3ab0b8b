// Package design evaluates MPTCP with detours over a space-filling design
// of path conditions (`mpdetour-lab design`, docs/design.md): it generates a WSP
// design over capacity, RTT, loss and buffer of two or three paths, maps
// each point onto the lab's detours topology, runs the points with
// `lab bench`'s runner (so runs resume the same way), and scores the MPTCP
// procedures with the aggregation benefit Ben. See docs/design.md.
package design

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// WSP returns n points in the unit cube [0,1]^dims chosen by the WSP
// algorithm (Wootton, Sergent, Phan-Tan-Luu; as used by the CoNEXT 2013
// MPTCP evaluation): from a seeded candidate set, start at the candidate
// nearest the centre, drop every candidate closer than dmin to it, move to
// the nearest remaining candidate, and repeat until none is left. dmin is
// found by bisection as the largest distance that still leaves at least n
// points; the first n are returned, so every pair of returned points is at
// least dmin apart, which WSP also returns. The same (dims, n, seed) give
// the same points.
func WSP(dims, n int, seed uint64) ([][]float64, float64, error) {
	if dims < 1 || n < 1 {
		return nil, 0, fmt.Errorf("WSP: want dims >= 1 and n >= 1, got %d and %d", dims, n)
	}
	if n > MaxPoints {
		return nil, 0, fmt.Errorf("WSP: at most %d points, got %d", MaxPoints, n)
	}
	m := min(max(20*n, 1000), 8000)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	cand := make([][]float64, m)
	for i := range cand {
		c := make([]float64, dims)
		for j := range c {
			c[j] = rng.Float64()
		}
		cand[i] = c
	}
	lo, hi := 0.0, math.Sqrt(float64(dims))
	best := wspPass(cand, lo, n)
	if len(best) < n {
		return nil, 0, fmt.Errorf("WSP: only %d candidates for %d points", len(best), n)
	}
	for range 50 {
		mid := (lo + hi) / 2
		if sel := wspPass(cand, mid, n); len(sel) >= n {
			lo, best = mid, sel
		} else {
			hi = mid
		}
	}
	out := make([][]float64, n)
	for i, k := range best[:n] {
		out[i] = cand[k]
	}
	return out, lo, nil
}

// MaxPoints bounds a design (the runner needs about a minute per point).
const MaxPoints = 2000

// wspPass runs one WSP selection with distance dmin and returns the
// indices of the selected candidates, stopping once it has more than
// stop (enough to know dmin is feasible).
func wspPass(cand [][]float64, dmin float64, stop int) []int {
	alive := make([]int, len(cand))
	for i := range alive {
		alive[i] = i
	}
	centre := make([]float64, len(cand[0]))
	for j := range centre {
		centre[j] = 0.5
	}
	cur := nearest(cand, alive, centre)
	var sel []int
	d2 := dmin * dmin
	for cur >= 0 {
		sel = append(sel, cur)
		if len(sel) > stop {
			break
		}
		p := cand[cur]
		next, nd := -1, math.Inf(1)
		kept := alive[:0]
		for _, k := range alive {
			if k == cur {
				continue
			}
			d := dist2(cand[k], p)
			if d < d2 {
				continue
			}
			kept = append(kept, k)
			if d < nd {
				next, nd = k, d
			}
		}
		alive = kept
		cur = next
	}
	return sel
}

func nearest(cand [][]float64, idx []int, p []float64) int {
	best, bd := -1, math.Inf(1)
	for _, k := range idx {
		if d := dist2(cand[k], p); d < bd {
			best, bd = k, d
		}
	}
	return best
}

func dist2(a, b []float64) float64 {
	var s float64
	for i := range a {
		d := a[i] - b[i]
		s += d * d
	}
	return s
}

// MinDistance is the smallest Euclidean distance between two of pts
// (+Inf for fewer than two).
func MinDistance(pts [][]float64) float64 {
	m := math.Inf(1)
	for i := range pts {
		for j := i + 1; j < len(pts); j++ {
			m = math.Min(m, dist2(pts[i], pts[j]))
		}
	}
	return math.Sqrt(m)
}
