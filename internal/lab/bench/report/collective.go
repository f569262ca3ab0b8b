package report

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// collectiveTarget is the bound (docs/collective.md) for every time of procedure
// collective (s).
const collectiveTarget = 5.0

// timesOnly says every cell of the plan measures times, not goodput
// (procedure collective): the goodput table is left out.
func (d *Data) timesOnly() bool {
	for _, c := range d.Cells {
		if c.Procedure != scenario.Collective {
			return false
		}
	}
	return len(d.Cells) > 0
}

// timeStat summarises times in s; negative values were not reached.
type timeStat struct {
	n, missing int
	median     float64
	max        float64
	over       int // reached but above the target
}

func timesOf(v []float64) timeStat {
	var ok []float64
	st := timeStat{n: len(v)}
	for _, x := range v {
		if x < 0 {
			st.missing++
			continue
		}
		ok = append(ok, x)
		if x > collectiveTarget {
			st.over++
		}
	}
	if len(ok) > 0 {
		slices.Sort(ok)
		if m := len(ok); m%2 == 1 {
			st.median = ok[m/2]
		} else {
			st.median = (ok[m/2-1] + ok[m/2]) / 2
		}
		st.max = ok[len(ok)-1]
	}
	return st
}

func (st timeStat) row(what, per string, target bool) []string {
	med, mx := "", ""
	if st.n > st.missing {
		med, mx = fmt.Sprintf("%.2f", st.median), fmt.Sprintf("%.2f", st.max)
	}
	verdict := ""
	if target {
		switch {
		case st.n == 0:
		case st.missing == 0 && st.over == 0:
			verdict = "met"
		default:
			verdict = fmt.Sprintf("**missed**: %d over %.0f s, %d not reached", st.over, collectiveTarget, st.missing)
		}
	}
	t := ""
	if target {
		t = fmt.Sprintf("<= %.0f s", collectiveTarget)
	}
	return []string{what, per, fmt.Sprint(st.n), med, mx, fmt.Sprint(st.missing), t, verdict}
}

// short is "median / max" (and how many were not reached).
func (st timeStat) short() string {
	if st.n == st.missing {
		return "-"
	}
	s := fmt.Sprintf("%.2f / %.2f", st.median, st.max)
	if st.missing > 0 {
		s += fmt.Sprintf(" (%d not reached)", st.missing)
	}
	return s
}

func fmtS(v float64) string {
	if v < 0 {
		return "not reached"
	}
	return fmt.Sprintf("%.2f", v)
}

// writeCollective reports procedure collective: per member, the times to
// discover relays and use them; per trial, the times to drop a killed
// relay and replace its detours.
func (d *Data) writeCollective(p *printer) {
	for _, c := range d.Cells {
		if len(c.Collectives) == 0 {
			continue
		}
		var usable, detours, disc, connect, out, dropped, replaced, gone []float64
		for _, t := range c.Collectives {
			for _, cl := range t.Clients {
				usable = append(usable, cl.UsableS)
				detours = append(detours, cl.DetoursS)
				disc = append(disc, cl.DiscoveredDetoursS)
				connect = append(connect, cl.ConnectS)
				if cl.ReplacedS != nil {
					replaced = append(replaced, *cl.ReplacedS)
				}
				if cl.VictimGoneS != nil {
					gone = append(gone, *cl.VictimGoneS)
				}
			}
			out = append(out, t.OutOfRostersS)
			dropped = append(dropped, t.DroppedByAgentsS)
		}
		p.f("## Collective: %s (%d trials)\n\n", d.Scenario.Configuration(c.Configuration).Label, len(c.Collectives))
		intervals := map[string]int{}
		for _, t := range c.Collectives {
			iv := t.DiscoveryInterval
			if iv == "" {
				iv = "2s (the default of records written before the roster digest)"
			}
			intervals[iv]++
		}
		var ivs []string
		for iv, n := range intervals {
			ivs = append(ivs, fmt.Sprintf("%s (%d trials)", iv, n))
		}
		slices.Sort(ivs)
		p.f("Agents' roster poll (`discovery.interval`): %s.\n\n", strings.Join(ivs, ", "))
		p.f("Times in seconds. Discovery: from the start of each member's agent (one bootstrap relay configured); death: from the SIGKILL of a relay carrying detours. \"not reached\" counts values that did not happen within the trial's limit (20 s).\n\n")
		p.row([]string{"measured", "per", "n", "median", "max", "not reached", "target", "verdict"})
		p.row([]string{"---", "---", "---:", "---:", "---:", "---:", "---", "---"})
		p.row(timesOf(connect).row("agent start -> status socket, MPTCP connection opened", "member", false))
		p.row(timesOf(usable).row("(a) agent start -> grants from >= 3 discovered relays (agent log)", "member", true))
		p.row(timesOf(detours).row("(b) agent start -> subflows established through >= 3 relays (kernel)", "member", true))
		p.row(timesOf(disc).row("(b') agent start -> subflows through >= 3 discovered relays (not the bootstrap)", "member", true))
		p.row(timesOf(out).row("(c) SIGKILL -> gone from every other relay's roster", "trial", true))
		p.row(timesOf(dropped).row("(c') SIGKILL -> dropped by every affected agent (agent log)", "trial", true))
		p.row(timesOf(gone).row("SIGKILL -> the subflow through it closed (kernel)", "affected member", false))
		p.row(timesOf(replaced).row("(d) SIGKILL -> subflows through as many live relays as before (kernel)", "affected member", false))
		p.f("\n### Per trial\n\n")
		p.row([]string{"trial", "killed", "at (s after the agents' start)", "affected", "(c) out of every roster", "median relay", "(c') agents dropped it", "(d) replaced, per affected member", "(b) max over members", "relays per member"})
		p.row([]string{"---:", "---", "---:", "---", "---:", "---:", "---:", "---", "---:", "---"})
		for i, t := range c.Collectives {
			var rep, per []string
			bmax := 0.0
			for _, cl := range t.Clients {
				if cl.ReplacedS != nil {
					rep = append(rep, fmt.Sprintf("%s %s", cl.Name, fmtS(*cl.ReplacedS)))
				}
				if cl.DetoursS < 0 || bmax < 0 {
					bmax = -1
				} else {
					bmax = max(bmax, cl.DetoursS)
				}
				per = append(per, fmt.Sprint(len(cl.Relays)))
			}
			first := ""
			if st := timesOf(t.OutOfRosterEachS); st.n > st.missing {
				first = fmt.Sprintf("%.2f", st.median)
			}
			at := ""
			if t.KilledAtS > 0 {
				at = fmt.Sprintf("%.2f", t.KilledAtS)
			}
			p.row([]string{fmt.Sprint(i + 1), t.Killed, at, strings.Join(t.Affected, ", "), fmtS(t.OutOfRostersS), first,
				fmtS(t.DroppedByAgentsS), strings.Join(rep, ", "), fmtS(bmax), strings.Join(per, " ")})
		}
		p.f("\n")
	}
}
