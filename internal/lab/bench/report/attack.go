package report

import (
	"fmt"
	"sort"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
)

func (c *Cell) addAttack(r results.Record) {
	if c.Attack == nil {
		c.Attack = map[string][]float64{}
	}
	for k, v := range r.Attack {
		c.Attack[k] = append(c.Attack[k], v)
	}
	if r.Status == results.OK {
		c.SubflowCounts = append(c.SubflowCounts, float64(len(r.Subflows)))
	}
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// attackColumns are the counters the attack table shows, in order, with
// their headings; a column whose counter is zero in every row is left out.
var attackColumns = []struct{ key, head string }{
	{"attack.sent", "attack pkts sent"},
	{"attack.tokens", "tokens learnt"},
	{"attack.synacks", "SYN/ACKs to attacker"},
	{"attack.injected", "forged ACKs/injections"},
	{"server.MPJoinSynRx", "server MPJoinSynRx"},
	{"server.MPJoinNoTokenFound", "server MPJoinNoTokenFound"},
	{"server.MPJoinAckHMacFailure", "server MPJoinAckHMacFailure"},
	{"server.MPJoinAckRx", "server MPJoinAckRx"},
	{"server.MPJoinRejected", "server MPJoinRejected"},
	{"client.AddAddr", "client AddAddr"},
	{"client.AddAddrDrop", "client AddAddrDrop"},
	{"client.EchoAddTx", "client EchoAddTx"},
	{"client.RmAddr", "client RmAddr"},
	{"client.RmSubflow", "client RmSubflow"},
	{"client.MPJoinSynTx", "client MPJoinSynTx"},
	{"client.MPJoinSynAckRx", "client MPJoinSynAckRx"},
	{"attacker.MPJoinSynRx", "other peer MPJoinSynRx"},
	{"attacker.MPJoinNoTokenFound", "other peer MPJoinNoTokenFound"},
	{"attack.in_bytes", "flood bytes in"},
	{"attack.out_pkts", "victim pkts to flood sources"},
	{"attack.out_bytes", "victim bytes to flood sources"},
	{"attack.out_capable", "victim MP_CAPABLE replies"},
	{"attack.out_other_mptcp", "victim other MPTCP options to flood sources"},
	{"server.MPCapableSYNRX", "server MPCapableSYNRX"},
	{"server.TcpExt.SyncookiesSent", "server SyncookiesSent"},
	{"server.MPCapableACKRX", "server MPCapableACKRX"},
	{"server.AddAddrTx", "server AddAddrTx"},
}

// writeAttacks is the attack table: per configuration with an attack and
// procedure, the genuine transfers (ok / trials, goodput), the prober's
// genuine connections, subflows at the end, and the attack's and kernels'
// counters summed over the trials.
func (d *Data) writeAttacks(p *printer) {
	type row struct {
		label string
		cell  *Cell
	}
	var rows []row
	for _, cfg := range d.Scenario.Configurations {
		if cfg.Attack == nil {
			continue
		}
		a := cfg.Attack
		label := fmt.Sprintf("%s (%s", cfg.Label, a.Kind)
		if a.From != "" {
			label += " from " + a.From
		}
		if a.Kind != "none" && a.Kind != "join-redirect" && a.Kind != "join-masquerade" {
			rate := a.Rate
			if rate == 0 {
				rate = 1000
			}
			label += fmt.Sprintf(", %d/s", rate)
		}
		label += ")"
		for _, c := range d.Cells {
			if c.Configuration == cfg.Name {
				rows = append(rows, row{label, c})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	var cols []struct{ key, head string }
	for _, col := range attackColumns {
		for _, r := range rows {
			if sum(r.cell.Attack[col.key]) != 0 {
				cols = append(cols, col)
				break
			}
		}
	}
	p.f("## Attacks: genuine traffic under attack\n\n")
	p.f("Per trial one genuine bulk transfer (goodput as above) while the attack runs and a prober opens short genuine MPTCP connections from the client (each given 2 s). *transfers ok*: trials whose transfer completed; *genuine connections*: established / attempted (MPTCP among them); *subflows*: mean subflows at the end of ok transfers. Counters are the kernels' MPTcpExt deltas summed over the trials (server = the server node, client = the client node).\n\n")
	head := []string{"configuration (attack)", "procedure", "transfers ok", "goodput", "genuine connections", "subflows"}
	align := []string{"---", "---", "---:", "---:", "---:", "---:"}
	for _, c := range cols {
		head = append(head, c.head)
		align = append(align, "---:")
	}
	p.row(head)
	p.row(align)
	for _, r := range rows {
		c := r.cell
		n := c.Goodput.N + c.Failed
		gp := "-"
		if c.Goodput.N > 0 {
			gp = f2(c.Goodput.Mean)
		}
		conns := "-"
		if att := sum(c.Attack["probe.attempts"]); att > 0 {
			est := sum(c.Attack["probe.established"])
			conns = fmt.Sprintf("%.0f / %.0f (%.1f%%), MPTCP %.0f", est, att, 100*est/att, sum(c.Attack["probe.mptcp"]))
		}
		sf := "-"
		if len(c.SubflowCounts) > 0 {
			sf = fmt.Sprintf("%.1f", sum(c.SubflowCounts)/float64(len(c.SubflowCounts)))
		}
		line := []string{r.label, c.Label(), fmt.Sprintf("%d / %d", c.Goodput.N, n), gp, conns, sf}
		for _, col := range cols {
			line = append(line, fmt.Sprintf("%.0f", sum(c.Attack[col.key])))
		}
		p.row(line)
	}
	p.f("\n")
	// Failure reasons of attacked cells, so a broken transfer says why.
	var reasons []string
	for _, r := range rows {
		for _, fr := range r.cell.FailReasons {
			reasons = append(reasons, fmt.Sprintf("- %s, %s: %s", r.label, r.cell.Label(), fr))
		}
	}
	sort.Strings(reasons)
	if len(reasons) > 0 {
		p.f("Failed transfers under attack (first reasons per cell):\n\n")
		for _, s := range reasons {
			p.f("%s\n", s)
		}
		p.f("\n")
	}
}
