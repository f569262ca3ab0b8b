package design

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
)

// Trial orders of the paired runner (Design.Order, --order).
const (
	// OrderBalanced: per point, the rounds follow a Williams design (a
	// Latin square balanced for first-order carry-over) whose symbols and
	// rows are shuffled from the design's seed and the point's ID. Over
	// one cycle of rows (len(procs) rounds when that is even, twice that
	// when odd) every procedure takes every position equally often and
	// follows every other procedure equally often; shorter runs are
	// balanced in expectation over points. The default since the A/A check
	// of docs/results/design/aa.
	OrderBalanced = "balanced"
	// OrderRotate: the pre-fix order, the procedure list rotated by one
	// per round and per point position. Each procedure always follows the
	// same predecessor (the one before it in --procedures), so whatever a
	// trial leaves behind biases the next one consistently. Designs
	// written before the field existed ran in this order and keep it on
	// --resume.
	OrderRotate = "rotate"
)

// Orders lists the accepted --order values.
var Orders = []string{OrderBalanced, OrderRotate}

// validOrder refuses an unknown order name ("" is allowed: the default).
func validOrder(o string) error {
	switch o {
	case "", OrderBalanced, OrderRotate:
		return nil
	}
	return fmt.Errorf("order %q: want %s or %s", o, OrderBalanced, OrderRotate)
}

// roundOrder is the order of procs in round (trial) t of point pt at
// position pos of the run, under the design's Order. It depends only on
// the design (seed, order), the procedure list, the point and t, never on
// what has run, so that a resumed run continues exactly where an
// uninterrupted one would have been.
func (d *Design) roundOrder(procs []string, pt Point, pos, t int) []string {
	if d.Order == OrderRotate {
		return rotation(procs, t, pos)
	}
	return balancedOrder(procs, d.Seed, pt.ID, t)
}

// rotation is the order of the procedures in trial (round) t of the point
// at position offset of the run: the list rotated by t-1+offset, so that
// every procedure takes every position once per len(procs) trials, and
// the first trial of successive points does not always start with the
// same procedure (OrderRotate).
func rotation(procs []string, trial, offset int) []string {
	n := len(procs)
	if n == 0 {
		return nil
	}
	k := ((trial-1+offset)%n + n) % n
	return append(append([]string{}, procs[k:]...), procs[:k]...)
}

// williams is a Williams design for n treatments: rows of a Latin square
// in which every ordered pair (a, b) of distinct symbols appears as
// neighbours (a directly before b) equally often — once over the n rows
// when n is even; for odd n the n rows and their reversals (2n rows), each
// pair twice. Rows are permutations of 0..n-1. E. J. Williams (1949),
// "Experimental designs balanced for the estimation of residual effects
// of treatments"; the standard construction from the sequence
// 0, 1, n-1, 2, n-2, ... and its cyclic shifts.
func williams(n int) [][]int {
	if n <= 0 {
		return nil
	}
	base := make([]int, n)
	lo, hi := 1, n-1
	for j := 1; j < n; j++ {
		if j%2 == 1 {
			base[j] = lo
			lo++
		} else {
			base[j] = hi
			hi--
		}
	}
	var rows [][]int
	for r := 0; r < n; r++ {
		row := make([]int, n)
		for j, b := range base {
			row[j] = (b + r) % n
		}
		rows = append(rows, row)
	}
	if n%2 == 1 {
		for r := 0; r < n; r++ {
			rev := make([]int, n)
			for j := range rev {
				rev[j] = rows[r][n-1-j]
			}
			rows = append(rows, rev)
		}
	}
	return rows
}

// balancedOrder is round t (1-based) of the point named point under
// OrderBalanced: a row of the Williams design of len(procs), the symbols
// mapped to procedures by a permutation seeded from (seed, point) and the
// rows taken in an order seeded from (seed, point, cycle), one cycle being
// len(rows) rounds.
func balancedOrder(procs []string, seed uint64, point string, t int) []string {
	n := len(procs)
	if n == 0 {
		return nil
	}
	rows := williams(n)
	h := fnv.New64a()
	h.Write([]byte(point))
	ph := h.Sum64()
	label := rand.New(rand.NewPCG(seed, ph)).Perm(n)
	i := max(0, t-1)
	cycle, k := i/len(rows), i%len(rows)
	rowOf := rand.New(rand.NewPCG(seed^ph, 0x9e3779b97f4a7c15+uint64(cycle))).Perm(len(rows))
	out := make([]string, n)
	for j, s := range rows[rowOf[k]] {
		out[j] = procs[label[s]]
	}
	return out
}

// pointSchedule is the sequence of procedures the runner runs at point pt
// (position pos) for its missing trials, given done (trials already
// recorded per procedure): round by round in roundOrder, skipping a
// procedure in round t when it already has t trials. A run interrupted
// after the first k entries and resumed (done counting those k) gets the
// remaining entries of the uninterrupted schedule.
func (d *Design) pointSchedule(procs []string, pt Point, pos int, done func(name string) int) []string {
	var out []string
	for t := 1; t <= max(1, d.Trials); t++ {
		for _, name := range d.roundOrder(procs, pt, pos, t) {
			if done(name) < t {
				out = append(out, name)
			}
		}
	}
	return out
}
