//go:build ignore

// pairs.go: the three comparisons of this run per point and over points,
// with the design runner's own statistics (the paired bootstrap per point,
// the Student t geometric mean over points), to the last byte and over the
// equal window. It copies DIR's design.json and runs/ to a temporary
// directory, lets design.WriteReport load them there (DIR is not written)
// and prints markdown.
//
//	go run docs/results/design/lowatrtt/pairs.go [-points p001,p002] DIR
//
// The runner's report gives X / mptcp-static per point with intervals; the
// pair lowatrtt / lowat it gives only as counts, so this prints it per
// point (the inverse of the runner's lowat / lowatrtt pair: the percentile
// interval of 1/r is the inverse of r's).
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mpdetour/mpdetour/internal/lab/design"
)

const (
	static = "mptcp-static"
	lowat  = "mptcp-static+lowat"
	rtt    = "mptcp-static+lowatrtt"
)

type cmp struct {
	name string
	get  func(s design.PointStat) (design.CI, bool)
}

func inv(c design.CI) design.CI {
	return design.CI{Est: 1 / c.Est, Lo: 1 / c.Hi, Hi: 1 / c.Lo, OK: c.OK}
}

var cmps = []cmp{
	{"lowatrtt / static", func(s design.PointStat) (design.CI, bool) { c, ok := s.VsRef[rtt]; return c, ok }},
	{"lowatrtt / lowat", func(s design.PointStat) (design.CI, bool) {
		c, ok := s.Pairs[lowat+"/"+rtt]
		return inv(c), ok
	}},
	{"lowat / static", func(s design.PointStat) (design.CI, bool) { c, ok := s.VsRef[lowat]; return c, ok }},
}

func ci(c design.CI) string {
	if math.IsNaN(c.Est) {
		return "-"
	}
	if !c.OK {
		return fmt.Sprintf("%.2f", c.Est)
	}
	return fmt.Sprintf("%.2f [%.2f, %.2f]", c.Est, c.Lo, c.Hi)
}

// geo is the geometric mean with the Student t interval over the points'
// log ratios (as the runner's geoMeanCI).
func geo(v []float64) string {
	n := len(v)
	if n < 2 {
		return "-"
	}
	var sum, ss float64
	for _, x := range v {
		sum += math.Log(x)
	}
	m := sum / float64(n)
	for _, x := range v {
		ss += (math.Log(x) - m) * (math.Log(x) - m)
	}
	half := t975(n-1) * math.Sqrt(ss/float64(n-1)/float64(n))
	return fmt.Sprintf("%.3f [%.3f, %.3f]", math.Exp(m), math.Exp(m-half), math.Exp(m+half))
}

func t975(df int) float64 {
	tab := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df <= len(tab) {
		return tab[df-1]
	}
	z, n := 1.959964, float64(df)
	z3, z5 := z*z*z, z*z*z*z*z
	return z + (z3+z)/(4*n) + (5*z5+16*z3+3*z)/(96*n*n)
}

func main() {
	pts := flag.String("points", "", "only these points (comma-separated)")
	flag.Parse()
	dir := flag.Arg(0)
	tmp, err := os.MkdirTemp("", "pairs")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{design.DesignFile, "runs"} {
		if out, err := exec.Command("cp", "-r", filepath.Join(dir, f), tmp).CombinedOutput(); err != nil {
			panic(fmt.Sprintf("%v: %s", err, out))
		}
	}
	d, err := design.Load(tmp)
	if err != nil {
		panic(err)
	}
	rep, err := design.WriteReport(tmp, d, "")
	if err != nil {
		panic(err)
	}
	only := map[string]bool{}
	for _, p := range strings.Split(*pts, ",") {
		if p != "" {
			only[p] = true
		}
	}
	for _, w := range []struct {
		name  string
		stats []design.PointStat
	}{{"to the last byte", rep.PointStats()}, {"equal window (1-10 s)", rep.EqualPointStats()}} {
		var stats []design.PointStat
		for _, s := range w.stats {
			if (len(only) == 0 || only[s.Point]) && len(s.Means) > 0 {
				stats = append(stats, s)
			}
		}
		sort.Slice(stats, func(i, j int) bool { return stats[i].Point < stats[j].Point })
		fmt.Printf("### %s (%d points)\n\n", w.name, len(stats))
		fmt.Printf("| point | BDP | static / best | lowat / best | lowatrtt / best |")
		for _, c := range cmps {
			fmt.Printf(" %s |", c.name)
		}
		fmt.Printf("\n|---|---|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range stats {
			fmt.Printf("| %s | %s |", s.Point, s.BDP)
			for _, m := range []string{static, lowat, rtt} {
				r, ok := s.Ratio[m]
				h := ""
				if s.Harmed[m] {
					h = " **H**"
				}
				if !ok {
					fmt.Printf(" - |")
					continue
				}
				fmt.Printf(" %s%s |", ci(r), h)
			}
			for _, c := range cmps {
				r, ok := c.get(s)
				if !ok {
					fmt.Printf(" - |")
					continue
				}
				mark := ""
				if r.OK && r.Hi < 1 {
					mark = " **below**"
				} else if r.OK && r.Lo > 1 {
					mark = " **above**"
				}
				fmt.Printf(" %s%s |", ci(r), mark)
			}
			fmt.Println()
		}
		fmt.Printf("\n| comparison | points | geometric mean [95 %% t interval over points] | below: points | above: points | expected by chance, each way | sign test |\n|---|---:|---|---|---|---:|---:|\n")
		for _, c := range cmps {
			var v []float64
			var below, above []string
			chance := 0.0
			for _, s := range stats {
				r, ok := c.get(s)
				if !ok || math.IsNaN(r.Est) {
					continue
				}
				v = append(v, r.Est)
				k := s.RefRounds[rtt]
				if c.name == "lowat / static" {
					k = s.RefRounds[lowat]
				}
				chance += design.ChanceOneWay(k)
				if r.OK && r.Hi < 1 {
					below = append(below, fmt.Sprintf("%s %.2f", s.Point, r.Est))
				}
				if r.OK && r.Lo > 1 {
					above = append(above, fmt.Sprintf("%s %.2f", s.Point, r.Est))
				}
			}
			if len(v) == 0 {
				continue
			}
			fmt.Printf("| %s | %d | %s | %d: %s | %d: %s | %.1f | p = %.3f |\n", c.name, len(v), geo(v),
				len(below), strings.Join(below, ", "), len(above), strings.Join(above, ", "), chance,
				design.SignTest(len(below), len(above)))
		}
		fmt.Printf("\n| procedure | points | harmed | mean >= 0.95 x best | MPTCP / best: geometric mean [t interval] | median Ben | median Ben, low BDP (n) | median Ben, high BDP (n) |\n|---|---:|---|---:|---|---:|---:|---:|\n")
		for _, m := range []string{static, lowat, rtt} {
			var v, ben, low, high []float64
			var harmed []string
			near := 0
			for _, s := range stats {
				r, ok := s.Ratio[m]
				if !ok || math.IsNaN(r.Est) {
					continue
				}
				v = append(v, r.Est)
				if r.Est >= design.HarmFactor {
					near++
				}
				if s.Harmed[m] {
					harmed = append(harmed, s.Point)
				}
				if b := s.Ben[m]; !math.IsNaN(b.Est) {
					ben = append(ben, b.Est)
					if s.BDP == design.LowBDP {
						low = append(low, b.Est)
					} else {
						high = append(high, b.Est)
					}
				}
			}
			if len(v) == 0 {
				continue
			}
			hl := strings.Join(harmed, ", ")
			if hl == "" {
				hl = "none"
			}
			fmt.Printf("| %s | %d | %d (%.0f %%: %s) | %d (%.0f %%) | %s | %s | %s (%d) | %s (%d) |\n", m, len(v),
				len(harmed), 100*float64(len(harmed))/float64(len(v)), hl,
				near, 100*float64(near)/float64(len(v)), geo(v), med(ben), med(low), len(low), med(high), len(high))
		}
		fmt.Println()
	}
}

// med is the median (the mean of the middle two for an even count).
func med(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return fmt.Sprintf("%.2f", s[n/2])
	}
	return fmt.Sprintf("%.2f", (s[n/2-1]+s[n/2])/2)
}
