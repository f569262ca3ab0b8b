package report

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

const scen = `
name: t
topology: brennan2017
roles: {detours: [detour]}
trials: 3
configurations:
  - {name: cl, label: Core-limited, set: {profile: core-limited}}
  - {name: sym, label: Symmetric, set: {profile: symmetric}}
procedures: [tcp, tcp-nat, mptcp-nat, tcp-tunnel, mptcp-tunnel]
targets:
  - {configuration: cl, procedure: mptcp-nat, ratio: sum, min: 0.99}
  - {configuration: sym, procedure: mptcp-nat, ratio: tcp, min: 0.985}
  - {configuration: cl, procedure: mptcp-tunnel, ratio: sum, min: 0.97}
  - {configuration: cl, procedure: tcp-nat, ratio: tcp, min: 0.95}
  - {configuration: cl, procedure: mptcp-nat, ratio: tcp-nat, min: 2}
reference:
  source: "original"
  results: {cl: {tcp: [9.55, 0.0], mptcp-nat: [18.81, 0.02]}}
`

func data(t *testing.T) (*scenario.Scenario, []results.Record) {
	t.Helper()
	s, err := scenario.Parse("t.yaml", []byte(scen))
	if err != nil {
		t.Fatal(err)
	}
	var recs []results.Record
	add := func(cfg, cell string, vals ...float64) {
		for i, v := range vals {
			r := results.Record{Configuration: cfg, Cell: cell, Procedure: cell, Trial: i + 1, Status: results.OK, GoodputMbps: v}
			if cell == "mptcp-nat" {
				r.Subflows = []results.Subflow{{Path: "nat:detour", Bytes: 1e6, RTTms: 60}, {Path: "default", Bytes: 3e6, RTTms: 30}}
			}
			recs = append(recs, r)
		}
	}
	add("cl", "tcp", 9.5, 9.6, 9.4)
	add("cl", "tcp-nat", 9.4, 9.5, 9.6)
	add("cl", "mptcp-nat", 18.8, 19.0, 18.9)
	add("sym", "tcp", 9.5, 9.5)
	add("sym", "mptcp-nat", 9.2, 9.3)
	recs = append(recs,
		results.Record{Configuration: "sym", Cell: "tcp", Procedure: "tcp", Trial: 3, Status: results.Failed, Reason: "receiver: timeout"},
		results.Record{Configuration: "cl", Cell: "tcp-tunnel", Procedure: "tcp-tunnel", Status: results.Unavailable, Reason: "internal/tunnel not built"},
		results.Record{Configuration: "gone", Cell: "tcp", Procedure: "tcp", Status: results.OK, GoodputMbps: 99})
	return s, recs
}

func TestRatiosAndTargets(t *testing.T) {
	s, recs := data(t)
	d := Build(s, recs)
	mp := d.Get("cl", "mptcp-nat")
	if mp.Goodput.N != 3 || math.Abs(mp.Goodput.Mean-18.9) > 1e-9 {
		t.Fatalf("mptcp-nat summary %+v", mp.Goodput)
	}
	r := d.Ratios(mp)
	if !r.Complete || math.Abs(r.Sum-18.9/19) > 1e-9 || math.Abs(r.OverTCP-18.9/9.5) > 1e-9 || math.Abs(r.Best-18.9/9.5) > 1e-9 {
		t.Fatalf("ratios %+v", r)
	}
	if math.Abs(r.Benefit-(18.9-9.5)/9.5) > 1e-9 {
		t.Fatalf("benefit %v", r.Benefit)
	}
	if len(mp.Subflows) != 2 || mp.Subflows[0].Path != "default" || math.Abs(mp.Subflows[0].Share-0.75) > 1e-9 {
		t.Fatalf("subflows %+v", mp.Subflows)
	}
	// Symmetric has no tcp-nat: sum is undefined, tcp ratio is not.
	rs := d.Ratios(d.Get("sym", "mptcp-nat"))
	if rs.Complete || !math.IsNaN(rs.Sum) || math.Abs(rs.OverTCP-9.25/9.5) > 1e-9 {
		t.Fatalf("symmetric ratios %+v", rs)
	}
	trs := d.Targets()
	if !trs[0].Met || trs[1].Met || !math.IsNaN(trs[2].Value) || trs[2].Met {
		t.Fatalf("targets %+v", trs)
	}
	// A procedure as the ratio: tcp-nat / tcp (9.5 / 9.5) and mptcp-nat
	// / tcp-nat (18.9 / 9.5, below 2).
	if !trs[3].Met || math.Abs(trs[3].Value-1) > 1e-9 || trs[4].Met || math.Abs(trs[4].Value-18.9/9.5) > 1e-9 || trs[4].Detail != "18.90 / 9.50" {
		t.Fatalf("procedure ratios %+v %+v", trs[3], trs[4])
	}
	if d.Get("sym", "tcp").Failed != 1 || d.Get("cl", "tcp-tunnel").Unavailable == "" {
		t.Fatal("failed/unavailable not counted")
	}
	g := d.Gains()
	if len(g) != 2 || g[0] != "aggregation [Core-limited]: MPTCP+NAT detour = 1.99x TCP (18.9 vs 9.5 Mbit/s)" {
		t.Fatalf("gains %q", g)
	}
}

func TestWriteAll(t *testing.T) {
	s, recs := data(t)
	d := Build(s, recs)
	dir := t.TempDir()
	if err := d.WriteAll(dir, Meta{Generated: time.Now(), Host: "kernel test", Note: "partial"}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Benchmark report: t", "load average during its trials", "> partial", "**Partial run**",
		"| Core-limited | 9.50 (0.10) n=3 |", "18.81 (0.02)", "| 1.005 |",
		"unavailable: internal/tunnel not built", "1 failed: receiver: timeout",
		"| 0.995 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(string(md), "| Symmetric | MPTCP + NAT detour | tcp | >= 0.985 | 0.974 | **missed** |") {
		t.Errorf("missed target row missing:\n%s", md)
	}
	if !strings.Contains(string(md), "| Core-limited | MPTCP + NAT detour | sum | >= 0.990 | 0.995 | met |") {
		t.Errorf("target row missing:\n%s", md)
	}
	// One configuration with a complete sum ratio is no curve.
	if _, err := os.Stat(filepath.Join(dir, "aggregation.png")); err == nil {
		t.Error("aggregation plot drawn from a single point")
	}
	for _, f := range []string{"plot-cl.png", "plot-sym.png"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		svg, err := os.ReadFile(filepath.Join(dir, strings.TrimSuffix(f, ".png")+".svg"))
		if err != nil || !bytes.Contains(svg, []byte("<svg")) {
			t.Fatalf("%s svg: %v", f, err)
		}
		if !strings.Contains(string(md), "("+f+")") {
			t.Errorf("report does not link %s", f)
		}
	}
}

// A run without MPTCP results (e.g. the tunnels scenario) gets no empty
// ratios table.
func TestMarkdownWithoutMultipathOmitsRatios(t *testing.T) {
	s, recs := data(t)
	var single []results.Record
	for _, r := range recs {
		if scenario.SinglePath(r.Procedure) == "" {
			single = append(single, r)
		}
	}
	var md bytes.Buffer
	if err := Build(s, single).WriteMarkdown(&md, Meta{Generated: time.Now()}, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(md.String(), "## Ratios") || !strings.Contains(md.String(), "| Core-limited | 9.50 (0.10) n=3 |") {
		t.Errorf("report without multipath cells:\n%s", md.String())
	}
	var full bytes.Buffer
	if err := Build(s, recs).WriteMarkdown(&full, Meta{Generated: time.Now()}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(full.String(), "## Ratios") {
		t.Errorf("report with multipath cells lacks the ratios table:\n%s", full.String())
	}
}

// Trials of many connections across route changes get their own table:
// broken connections summed and per trial, the errors, the kernel counters.
func TestChurnTable(t *testing.T) {
	s, err := scenario.Parse("lb.yaml", []byte(`
name: lb
topology: loadbalancer
roles: {server: b1, detours: [detour]}
configurations: [{name: lb, label: LB}]
procedures: [lb-connections, lb-connections-announced]
`))
	if err != nil {
		t.Fatal(err)
	}
	ch := func(broken int, reasons ...string) *results.Churn {
		return &results.Churn{Connections: 100, Broken: broken, RouteChanges: 16, Reasons: reasons,
			Counters: map[string]uint64{"client.AddAddr": 200, "b1.AddAddrTxDrop": 1}}
	}
	recs := []results.Record{
		{Configuration: "lb", Cell: "lb-connections", Procedure: "lb-connections", Trial: 1, Status: results.OK, Churn: ch(100, "100 x write: connection reset by peer")},
		{Configuration: "lb", Cell: "lb-connections-announced", Procedure: "lb-connections-announced", Trial: 1, Status: results.OK, GoodputMbps: 18, Churn: ch(0)},
		{Configuration: "lb", Cell: "lb-connections-announced", Procedure: "lb-connections-announced", Trial: 2, Status: results.OK, GoodputMbps: 18, Churn: ch(1, "1 x write: connection reset by peer")},
	}
	var md bytes.Buffer
	if err := Build(s, recs).WriteMarkdown(&md, Meta{Generated: time.Now()}, nil); err != nil {
		t.Fatal(err)
	}
	out := md.String()
	for _, want := range []string{
		"## Connections across route changes",
		"| 1 | 100 | 16 | **100** | 100 | 100 x write: connection reset by peer |",
		"| 2 | 200 | 32 | **1** | 0, 1 | 1 x write: connection reset by peer |",
		"summed over 2 trial(s): b1.AddAddrTxDrop 2, client.AddAddr 400.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// Flow configurations get the FCT table: median and quartiles of every
// flow of every trial, and each median over plain TCP's.
func TestFCTTable(t *testing.T) {
	s, err := scenario.Parse("rack.yaml", []byte(`
name: rack
topology: rack
roles: {client: s1, server: remote, detours: [s2]}
configurations: [{name: small, label: 15 KB, flow: {size: 15KB, flows: 3}}]
procedures: [tcp, mptcp-nat]
`))
	if err != nil {
		t.Fatal(err)
	}
	rec := func(cell string, trial int, fct ...float64) results.Record {
		med := fct[len(fct)/2]
		return results.Record{Configuration: "small", Cell: cell, Procedure: cell, Trial: trial, Status: results.OK,
			GoodputMbps: 15000 * 8 / 1e3 / med, FCTMs: &med, FCTAllMs: fct, FlowBytes: 15000}
	}
	recs := []results.Record{
		rec("tcp", 1, 1, 2, 3), rec("tcp", 2, 2, 2, 2),
		rec("mptcp-nat", 1, 3, 4, 5), rec("mptcp-nat", 2, 4, 4, 4),
	}
	var md bytes.Buffer
	if err := Build(s, recs).WriteMarkdown(&md, Meta{Generated: time.Now()}, nil); err != nil {
		t.Fatal(err)
	}
	out := md.String()
	for _, want := range []string{
		"## Flow completion time (ms)",
		"| 15 KB | 2.00 [2.00–2.00] n=6 | 4.00 [4.00–4.00] n=6 |",
		"| 15 KB | 1.000 | 2.000 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
