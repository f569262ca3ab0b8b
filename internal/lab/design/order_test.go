package design

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// pairs counts, over rows, how often a directly precedes b.
func pairs[T comparable](rows [][]T) map[[2]T]int {
	m := map[[2]T]int{}
	for _, r := range rows {
		for j := 1; j < len(r); j++ {
			m[[2]T{r[j-1], r[j]}]++
		}
	}
	return m
}

func TestWilliamsBalanced(t *testing.T) {
	for n := 1; n <= 9; n++ {
		rows := williams(n)
		want := n
		if n%2 == 1 {
			want = 2 * n
		}
		if len(rows) != want {
			t.Fatalf("n=%d: %d rows, want %d", n, len(rows), want)
		}
		// Latin: each row a permutation, each symbol each position equally often.
		pos := map[[2]int]int{}
		for _, r := range rows {
			s := slices.Clone(r)
			slices.Sort(s)
			for i, v := range s {
				if v != i {
					t.Fatalf("n=%d: row %v is not a permutation", n, r)
				}
			}
			for j, v := range r {
				pos[[2]int{v, j}]++
			}
		}
		for v := 0; v < n; v++ {
			for j := 0; j < n; j++ {
				if pos[[2]int{v, j}] != len(rows)/n {
					t.Errorf("n=%d: symbol %d at position %d %d times", n, v, j, pos[[2]int{v, j}])
				}
			}
		}
		// Carry-over balance: every ordered pair of distinct symbols
		// neighbours equally often (once for even n, twice for odd).
		p := pairs(rows)
		if n > 1 && len(p) != n*(n-1) {
			t.Errorf("n=%d: %d distinct ordered pairs, want %d", n, len(p), n*(n-1))
		}
		for k, c := range p {
			if k[0] == k[1] || c != len(rows)/n {
				t.Errorf("n=%d: pair %v %d times", n, k, c)
			}
		}
	}
}

func TestBalancedOrder(t *testing.T) {
	procs := []string{"tcp-path1", "tcp-path2", "mptcp-static", "mptcp-static+stale4"}
	for _, n := range []int{2, 3, 4, 5, 6} {
		ps := procs
		if n > len(ps) {
			ps = append(slices.Clone(procs), "mptcp-1sf", "mptcp-adaptive")[:n]
		} else {
			ps = ps[:n]
		}
		cycle := n
		if n%2 == 1 {
			cycle = 2 * n
		}
		for _, pt := range []string{"p001", "p002", "p117"} {
			var rounds [][]string
			for tr := 1; tr <= 2*cycle; tr++ {
				o := balancedOrder(ps, 1, pt, tr)
				// Deterministic: the same inputs, the same order.
				if !reflect.DeepEqual(o, balancedOrder(ps, 1, pt, tr)) {
					t.Fatalf("%s round %d not deterministic", pt, tr)
				}
				s, w := slices.Clone(o), slices.Clone(ps)
				slices.Sort(s)
				slices.Sort(w)
				if !reflect.DeepEqual(s, w) {
					t.Fatalf("%s round %d: %v is not a permutation of %v", pt, tr, o, ps)
				}
				rounds = append(rounds, o)
			}
			// Each cycle of rounds is balanced: every procedure directly
			// follows every other equally often within the rounds.
			for c := 0; c < 2; c++ {
				p := pairs(rounds[c*cycle : (c+1)*cycle])
				for _, a := range ps {
					for _, b := range ps {
						if a != b && p[[2]string{a, b}] != cycle/n {
							t.Errorf("n=%d %s cycle %d: %s before %s %d times, want %d", n, pt, c, a, b, p[[2]string{a, b}], cycle/n)
						}
					}
				}
			}
		}
	}
	// The point and the seed change the order (seeded, not fixed).
	diff := func(f func(int) []string) bool {
		a := f(0)
		for i := 1; i < 20; i++ {
			if !reflect.DeepEqual(a, f(i)) {
				return true
			}
		}
		return false
	}
	if !diff(func(i int) []string { return balancedOrder(procs, 1, fmt.Sprintf("p%03d", i), 1) }) {
		t.Error("every point starts round 1 in the same order")
	}
	if !diff(func(i int) []string { return balancedOrder(procs, uint64(i), "p001", 1) }) {
		t.Error("the seed does not change the order")
	}
	if balancedOrder(nil, 1, "p001", 1) != nil {
		t.Error("empty list")
	}
	if !reflect.DeepEqual(balancedOrder([]string{"a"}, 1, "p001", 3), []string{"a"}) {
		t.Error("one procedure")
	}
}

// TestBalancedNoFixedPredecessor: the defect of the rotation: over a run
// of 3 rounds at 4 points, under rotate each procedure has exactly one
// predecessor within a round; under balanced, several.
func TestBalancedNoFixedPredecessor(t *testing.T) {
	procs := []string{"tcp-path1", "tcp-path2", "mptcp-static", "mptcp-static+stale4"}
	preds := func(order string) map[string]map[string]bool {
		d := &Design{Seed: 1, Trials: 3, Order: order}
		m := map[string]map[string]bool{}
		for pos := 0; pos < 4; pos++ {
			pt := Point{ID: fmt.Sprintf("p%03d", pos+1)}
			for tr := 1; tr <= 3; tr++ {
				o := d.roundOrder(procs, pt, pos, tr)
				for j := 1; j < len(o); j++ {
					if m[o[j]] == nil {
						m[o[j]] = map[string]bool{}
					}
					m[o[j]][o[j-1]] = true
				}
			}
		}
		return m
	}
	for p, m := range preds(OrderRotate) {
		if len(m) != 1 {
			t.Errorf("rotate: %s has predecessors %v (the old order should have one)", p, m)
		}
	}
	for _, p := range procs {
		if m := preds(OrderBalanced)[p]; len(m) < 2 {
			t.Errorf("balanced: %s always follows %v", p, m)
		}
	}
	// OrderRotate is the old rotation, unchanged.
	d := &Design{Order: OrderRotate}
	if got := d.roundOrder(procs, Point{ID: "p009"}, 1, 2); !reflect.DeepEqual(got, rotation(procs, 2, 1)) {
		t.Errorf("rotate: %v", got)
	}
}

// TestPointScheduleResume: a run interrupted after any number of trials
// and resumed runs exactly the rest of the uninterrupted schedule.
func TestPointScheduleResume(t *testing.T) {
	procs := []string{"tcp-path1", "tcp-path2", "mptcp-static", "mptcp-static+stale4", "mptcp-1sf"}
	for _, order := range Orders {
		d := &Design{Seed: 7, Trials: 4, Order: order}
		pt := Point{ID: "p004"}
		full := d.pointSchedule(procs, pt, 3, func(string) int { return 0 })
		if len(full) != 4*len(procs) {
			t.Fatalf("%s: schedule of %d, want %d", order, len(full), 4*len(procs))
		}
		for k := 0; k <= len(full); k++ {
			done := map[string]int{}
			for _, n := range full[:k] {
				done[n]++
			}
			rest := d.pointSchedule(procs, pt, 3, func(n string) int { return done[n] })
			if !reflect.DeepEqual(rest, full[k:]) && !(len(rest) == 0 && k == len(full)) {
				t.Fatalf("%s: resumed after %d trials: %v, want %v", order, k, rest, full[k:])
			}
		}
	}
}

// TestOrderRecorded: a new design records the balanced order; a paired
// design.json written before the field resumes in the rotation it ran
// in; an explicit different --order on it is refused; an unknown order
// is refused.
func TestOrderRecorded(t *testing.T) {
	spec := Spec{Space: DefaultSpace(2), Points: 4, Seed: 1, Procedures: "tcp-path1,tcp-path2", Trials: 3}
	d, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	if d.Order != "" {
		t.Errorf("New without an order: %q (Run decides)", d.Order)
	}
	if _, err := New(Spec{Space: DefaultSpace(2), Points: 4, Seed: 1, Order: "random"}); err == nil || !strings.Contains(err.Error(), `"random"`) {
		t.Errorf("unknown order: %v", err)
	}

	// An old paired design.json (no order field) loads as rotate.
	dir := t.TempDir()
	old := *d
	old.Order = ""
	if err := old.Save(dir); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, DesignFile))
	if strings.Contains(string(b), `"order"`) {
		t.Fatalf("the old-format file has an order: %s", b)
	}
	l, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.Order != OrderRotate {
		t.Errorf("old paired design loads with order %q, want %q", l.Order, OrderRotate)
	}
	// Run (no binary: it fails after reconciling and saving the design)
	// keeps the recorded order when none is given ...
	d2, _ := New(spec)
	_, _ = Run(t.Context(), d2, Options{Out: dir})
	if d2.Order != OrderRotate {
		t.Errorf("resumed old run: order %q, want %q", d2.Order, OrderRotate)
	}
	if l, err := Load(dir); err != nil || l.Order != OrderRotate {
		t.Errorf("saved order after resume: %v %v", l, err)
	}
	// ... and refuses another.
	spec.Order = OrderBalanced
	d3, _ := New(spec)
	if _, err := Run(t.Context(), d3, Options{Out: dir}); err == nil || !strings.Contains(err.Error(), "order") {
		t.Errorf("a different --order on an old run: %v", err)
	}
	// A new directory gets balanced.
	spec.Order = ""
	d4, _ := New(spec)
	dir2 := t.TempDir()
	_, _ = Run(t.Context(), d4, Options{Out: dir2})
	if l, err := Load(dir2); err != nil || l.Order != OrderBalanced {
		t.Errorf("new run's recorded order: %+v %v", l, err)
	}
	// A corrupt order in design.json is an error naming the file.
	b, _ = os.ReadFile(filepath.Join(dir2, DesignFile))
	_ = os.WriteFile(filepath.Join(dir2, DesignFile), []byte(strings.Replace(string(b), `"balanced"`, `"sideways"`, 1)), 0o644)
	if _, err := Load(dir2); err == nil || !strings.Contains(err.Error(), DesignFile) {
		t.Errorf("bad order in design.json: %v", err)
	}
}
