package design

import (
	"fmt"
	"io"
	"strings"
)

// Describe prints the design: its points and their lab settings.
func (d *Design) Describe(w io.Writer) {
	fmt.Fprintf(w, "%d points, seed %d, min. distance %.3f (unit cube of %d dimensions)\n", len(d.Points), d.Seed, d.MinDistance, 4*d.Space.Paths)
	fmt.Fprintf(w, "base: %s\n", strings.Join(BaseSet(d.Space.Paths).Strings(), " "))
	for _, pt := range d.Points {
		fmt.Fprintf(w, "%s %-4s %s\n", pt.ID, pt.Class(d.LowBDP), strings.Join(pt.Set().Strings(), " "))
	}
}

// Summary prints Ben per MPTCP procedure and BDP class.
func (rep *Report) Summary(w io.Writer) {
	for _, proc := range rep.Design.mptcpProcs() {
		for _, class := range []string{LowBDP, HighBDP, ""} {
			v := rep.bens(proc, class)
			if len(v) == 0 {
				continue
			}
			if class == "" {
				class = "all"
			}
			fmt.Fprintf(w, "%s %s BDP: n=%d median Ben %.2f, Ben>=0.85 %s, Ben>=0 %s\n", proc, class, len(v), quantile(v, 0.5),
				pct(fracAtLeast(v, TargetLowBen)), pct(fracAtLeast(v, 0)))
		}
	}
}
