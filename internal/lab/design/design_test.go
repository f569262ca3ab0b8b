package design

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
)

// randomMinDistance is the mean minimum pairwise distance of n uniform
// random points in [0,1]^dims over a few seeds: what a design that is not
// space-filling achieves.
func randomMinDistance(dims, n int) float64 {
	var sum float64
	const reps = 5
	for s := range reps {
		rng := rand.New(rand.NewPCG(uint64(s), 7))
		pts := make([][]float64, n)
		for i := range pts {
			pts[i] = make([]float64, dims)
			for j := range pts[i] {
				pts[i][j] = rng.Float64()
			}
		}
		sum += MinDistance(pts)
	}
	return sum / reps
}

func TestWSPSpaceFilling(t *testing.T) {
	for _, c := range []struct{ dims, n int }{{2, 20}, {8, 6}, {8, 40}, {8, 200}, {12, 60}} {
		pts, dmin, err := WSP(c.dims, c.n, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(pts) != c.n {
			t.Fatalf("dims %d: %d points, want %d", c.dims, len(pts), c.n)
		}
		for _, p := range pts {
			if len(p) != c.dims {
				t.Fatalf("point of %d dims, want %d", len(p), c.dims)
			}
			for _, v := range p {
				if v < 0 || v > 1 {
					t.Fatalf("coordinate %g outside [0,1]", v)
				}
			}
		}
		md := MinDistance(pts)
		if md < dmin {
			t.Errorf("dims %d n %d: min distance %.4f below the WSP dmin %.4f", c.dims, c.n, md, dmin)
		}
		// Space-filling: clearly above random sampling's minimum distance,
		// and above half the spacing of a regular grid of n points.
		rnd := randomMinDistance(c.dims, c.n)
		grid := math.Pow(float64(c.n), -1/float64(c.dims))
		if md < 1.5*rnd || md < 0.5*grid {
			t.Errorf("dims %d n %d: min distance %.4f, random %.4f, grid spacing %.4f", c.dims, c.n, md, rnd, grid)
		}
		t.Logf("dims %d n %d: min distance %.3f (random %.3f, grid %.3f)", c.dims, c.n, md, rnd, grid)
	}
}

func TestWSPReproducible(t *testing.T) {
	a, _, err := WSP(8, 30, 42)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := WSP(8, 30, 42)
	if !reflect.DeepEqual(a, b) {
		t.Error("same seed, different designs")
	}
	c, _, _ := WSP(8, 30, 43)
	if reflect.DeepEqual(a, c) {
		t.Error("seeds 42 and 43 gave the same design")
	}
}

func TestWSPErrors(t *testing.T) {
	for _, c := range []struct{ dims, n int }{{0, 5}, {4, 0}, {4, MaxPoints + 1}} {
		if _, _, err := WSP(c.dims, c.n, 1); err == nil {
			t.Errorf("WSP(%d, %d): no error", c.dims, c.n)
		}
	}
}

func TestPointsInsideRanges(t *testing.T) {
	for _, paths := range []int{2, 3} {
		s := DefaultSpace(paths)
		d, err := New(Spec{Space: s, Points: 50, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Points) != 50 {
			t.Fatalf("%d points", len(d.Points))
		}
		for _, pt := range d.Points {
			if len(pt.Paths) != paths {
				t.Fatalf("%s: %d paths", pt.ID, len(pt.Paths))
			}
			for _, p := range pt.Paths {
				in := func(v float64, r Range) bool { return v >= r.Min && v <= r.Max }
				if !in(p.CapacityMbps, s.Capacity) || !in(p.RTTms, s.RTT) || !in(p.LossPct, s.Loss) || !in(p.BufferBDP, s.Buffer) {
					t.Errorf("%s: %+v outside %+v", pt.ID, p, s)
				}
				if p.QueuePackets() < MinQueue {
					t.Errorf("%s: queue %d", pt.ID, p.QueuePackets())
				}
			}
		}
		// Every point's parameters are accepted by the lab's topology.
		topo, err := topology.Builtin(Topology)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range BaseSet(paths) {
			if err := topo.Set(kv.Key, kv.Value); err != nil {
				t.Fatalf("%s=%s: %v", kv.Key, kv.Value, err)
			}
		}
		for _, pt := range d.Points[:5] {
			for _, kv := range pt.Set() {
				if err := topo.Set(kv.Key, kv.Value); err != nil {
					t.Fatalf("%s: %s=%s: %v", pt.ID, kv.Key, kv.Value, err)
				}
			}
		}
		// And the generated scenarios parse, with one cell per procedure.
		runs, err := d.runs()
		if err != nil {
			t.Fatal(err)
		}
		s0, err := d.scenario(runs[0])
		if err != nil {
			t.Fatal(err)
		}
		if got := len(s0.Cells()); got != 50*(paths+1) {
			t.Errorf("%d cells, want %d", got, 50*(paths+1))
		}
	}
}

func TestPointMapping(t *testing.T) {
	pt := Point{ID: "p001", Paths: []Path{
		{CapacityMbps: 10, RTTms: 100, LossPct: 0.5, BufferBDP: 1},     // BDP 125000 B: 83 packets
		{CapacityMbps: 1.5, RTTms: 10.002, LossPct: 0, BufferBDP: 0.1}, // tiny: MinQueue
	}}
	got := strings.Join(pt.Set().Strings(), " ")
	want := "C0.rate=10000kbit C0.delay=50000us C0.loss=0.5% C0.queue=83 C1.rate=1500kbit C1.delay=5001us C1.loss=0% C1.queue=2"
	if got != want {
		t.Errorf("Set:\n got %s\nwant %s", got, want)
	}
	if c := pt.Class(DefaultLowBDP); c != LowBDP {
		t.Errorf("class %s", c)
	}
	pt.Paths[1].CapacityMbps = 100 // 100 Mbit/s x 10 ms: still low
	if c := pt.Class(DefaultLowBDP); c != LowBDP {
		t.Errorf("class %s", c)
	}
	pt.Paths[0].RTTms = 600 // 750 kB: above 625 kB
	if c := pt.Class(DefaultLowBDP); c != HighBDP {
		t.Errorf("class %s", c)
	}
}

func TestBen(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		g    float64
		caps []float64
		want float64
	}{
		{10, []float64{10, 10}, 0},      // as good as the best path
		{20, []float64{10, 10}, 1},      // perfect pooling
		{15, []float64{10, 10}, 0.5},    // half of the second path
		{5, []float64{10, 10}, -0.5},    // worse than the best path
		{0, []float64{10, 4}, -1},       // nothing
		{14, []float64{4, 10}, 1},       // order does not matter
		{12, []float64{10, 4}, 0.5},     // unequal paths
		{11, []float64{10, 2, 2}, 0.25}, // three paths
		{30, []float64{10, 10}, 2},      // above the sum (loss-limited single paths)
		{10, []float64{}, nan},          // no paths
		{10, []float64{0, 0}, nan},      // nothing to compare with
		{12, []float64{10}, nan},        // above a single path: undefined
		{8, []float64{10}, -0.2},        // below a single path
	} {
		got := Ben(c.g, c.caps)
		if math.IsNaN(c.want) != math.IsNaN(got) || (!math.IsNaN(c.want) && math.Abs(got-c.want) > 1e-9) {
			t.Errorf("Ben(%g, %v) = %g, want %g", c.g, c.caps, got, c.want)
		}
	}
}

func TestParseRange(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Range
		ok   bool
	}{
		{"1:100", Range{1, 100, false}, true},
		{" 0.1 : 2 ", Range{0.1, 2, false}, true},
		{"5", Range{5, 5, false}, true},
		{"0.001:2:log", Range{0.001, 2, true}, true},
		{"0:2:log", Range{}, false},
		{"1:log", Range{}, false},
		{"2:2:log", Range{}, false},
		{"2:1", Range{}, false},
		{"a:b", Range{}, false},
		{"1:", Range{}, false},
		{"NaN:1", Range{}, false},
		{"0:Inf", Range{}, false},
		{"", Range{}, false},
	} {
		got, err := ParseRange(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseRange(%q) = %v, %v", c.in, got, err)
		}
	}
}

func TestParseProcedures(t *testing.T) {
	ps, err := ParseProcedures("", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(procNames(ps), ","); got != "tcp-path1,tcp-path2,tcp-path3,mptcp" {
		t.Errorf("default: %s", got)
	}
	cells := []string{}
	for _, p := range ps {
		cells = append(cells, p.cellID())
	}
	if got := strings.Join(cells, ","); got != "tcp,tcp-nat@detour1,tcp-nat@detour2,mptcp-nat" {
		t.Errorf("cells: %s", got)
	}
	for _, bad := range []string{"tcp-path3", "tcp-path0", "tcp-path01", "mptcp-foo", "tcp", "mptcp,mptcp", ""} {
		if bad == "" {
			continue
		}
		if _, err := ParseProcedures(bad, 2); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	ps, err = ParseProcedures("mptcp-adaptive, tcp-path2", 2)
	if err != nil || ps[0].Policy != "adaptive" || ps[1].Path != 2 {
		t.Errorf("%+v %v", ps, err)
	}
}

func TestRuns(t *testing.T) {
	d := &Design{Space: DefaultSpace(2), Procedures: []string{"mptcp-static", "tcp-path1", "mptcp-adaptive", "tcp-path2", "mptcp"}}
	rs, err := d.runs()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, r.Name+":"+strings.Join(procNames(r.Procs), "+"))
	}
	want := "static:tcp-path1+tcp-path2+mptcp-static adaptive:mptcp-adaptive default:mptcp"
	if strings.Join(got, " ") != want {
		t.Errorf("runs %s, want %s", strings.Join(got, " "), want)
	}
}

// converted runs alone in its own run, with the server's MPTCP off and the
// converter on r2; the single-path cells stay in a run whose server speaks
// MPTCP, also when converted is listed first.
func TestConvertedRun(t *testing.T) {
	d := &Design{Space: DefaultSpace(2), Procedures: []string{"converted", "tcp-path1", "mptcp", "tcp-path2"},
		Duration: "10s", Warmup: "1s", CC: "cubic", Points: []Point{{ID: "p001", Paths: []Path{{CapacityMbps: 10, RTTms: 20, BufferBDP: 1}, {CapacityMbps: 10, RTTms: 20, BufferBDP: 1}}}}}
	rs, err := d.runs()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, fmt.Sprintf("%s:%s:%v", r.Name, strings.Join(procNames(r.Procs), "+"), r.Converted))
	}
	if want := "default:tcp-path1+tcp-path2+mptcp:false converted:converted:true"; strings.Join(got, " ") != want {
		t.Fatalf("runs %s, want %s", strings.Join(got, " "), want)
	}
	for _, r := range rs {
		s, err := d.scenario(r)
		if err != nil {
			t.Fatal(err)
		}
		if s.ServerSpeaksMPTCP() == r.Converted || (s.Roles.Converter == ConverterNode) != r.Converted {
			t.Errorf("run %s: server MPTCP %v, converter %q", r.Name, s.ServerSpeaksMPTCP(), s.Roles.Converter)
		}
		if r.Converted && (len(s.Procedures) != 1 || s.Procedures[0].Procedure != "converted" || s.Procedures[0].Detour != "all") {
			t.Errorf("converted run procedures %+v", s.Procedures)
		}
	}
	rs, err = (&Design{Space: DefaultSpace(2), Procedures: []string{"converted", "tcp-path1"}}).runs()
	if err != nil || len(rs) != 2 || rs[0].Converted || rs[0].Name != "default" || !rs[1].Converted {
		t.Errorf("converted first: %+v %v", rs, err)
	}
}

// TestReport builds rows and the report from synthetic trials (no lab).
func TestReport(t *testing.T) {
	d, err := New(Spec{Space: DefaultSpace(2), Points: 4, Seed: 9, Duration: 10 * time.Second, Sequential: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := d.Save(dir); err != nil {
		t.Fatal(err)
	}
	d2, err := Load(dir)
	if err != nil || !sameDesign(d, d2) {
		t.Fatalf("reloaded design differs: %v", err)
	}
	st, _, err := results.Open(filepath.Join(dir, "runs", "default"), false)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	good := map[string][3]float64{"p001": {10, 5, 15}, "p002": {4, 8, 6}, "p003": {2, 2, 4}}
	i := 0
	for _, pt := range []string{"p001", "p002", "p003"} {
		for k, cell := range []string{"tcp", "tcp-nat@detour1", "mptcp-nat"} {
			rec := results.Record{Scenario: "design-default", Configuration: pt, Cell: cell, Procedure: strings.Split(cell, "@")[0], Trial: 1, Status: results.OK,
				GoodputMbps: good[pt][k], Start: t0.Add(time.Duration(i) * 20 * time.Second)}
			if pt == "p003" && k == 1 {
				rec.Status, rec.GoodputMbps, rec.Reason = results.Failed, 0, "boom"
			}
			if err := st.Append(rec); err != nil {
				t.Fatal(err)
			}
		}
		i += 3
	}
	st.Close()
	rep, err := WriteReport(dir, d, "test")
	if err != nil {
		t.Fatal(err)
	}
	bens := map[string]*float64{}
	for _, r := range rep.Rows {
		if r.Procedure == "mptcp" {
			bens[r.Point] = r.Ben
		}
		if r.Params["capacity1_mbps"] == 0 || r.BDP == "" {
			t.Errorf("row without parameters: %+v", r)
		}
	}
	if bens["p001"] == nil || *bens["p001"] != 1 || bens["p002"] == nil || *bens["p002"] != -0.25 || bens["p003"] != nil {
		t.Errorf("Ben per point: %v %v %v", bens["p001"], bens["p002"], bens["p003"])
	}
	if rep.PointsDone != 3 || rep.SecondsPerPoint != 60 || rep.OverheadPerPoint != 30 || rep.EffectiveSecondsPerPoint != 60 {
		t.Errorf("timing: %d points, %g s per point, %g s overhead", rep.PointsDone, rep.SecondsPerPoint, rep.OverheadPerPoint)
	}
	for _, f := range []string{"results.json", "results.csv", "report.md", "ben-cdf.png", "ben-vs-rtt2.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	for _, s := range []string{"Worst points: mptcp", "| p002#1 |", "p003 tcp-path2: failed: boom", "Ben >= 0 in >= 95 %"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

func TestSingleMeans(t *testing.T) {
	rows := []Row{
		{Point: "p1", Procedure: "tcp-path1", Status: results.OK, GoodputMbps: 2},
		{Point: "p1", Procedure: "tcp-path1", Status: results.OK, GoodputMbps: 4},
		{Point: "p1", Procedure: "tcp-path1", Status: results.Failed},
		{Point: "p1", Procedure: "mptcp", Status: results.OK, GoodputMbps: 9},
		{Point: "p2", Procedure: "tcp-path2", Status: results.OK, GoodputMbps: 5},
	}
	m := singleMeans(rows)
	if len(m) != 2 || m["p1"]["tcp-path1"] != 3 || len(m["p1"]) != 1 || m["p2"]["tcp-path2"] != 5 {
		t.Errorf("%v", m)
	}
}

func TestAgentPolicyHook(t *testing.T) {
	// Whatever this build's agent says, the answer names the policy.
	if err := AgentHasPolicy("adaptive"); err != nil && !strings.Contains(err.Error(), "adaptive") {
		t.Error(err)
	}
}

func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"1:100", "0.1:2", "5", "2:1", ":", "1e308:1e309", "-0:0", "0x10:0x20", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRange(s)
		if err != nil {
			return
		}
		if math.IsNaN(r.Min) || math.IsInf(r.Min, 0) || math.IsInf(r.Max, 0) || r.Min > r.Max {
			t.Fatalf("%q -> %+v", s, r)
		}
		if r2, err := ParseRange(r.String()); err != nil || r2 != r {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, r, r.String(), r2, err)
		}
	})
}

func FuzzParseProcedures(f *testing.F) {
	for _, s := range []string{"", "tcp-path1,tcp-path2,mptcp", "mptcp-adaptive", "tcp-path9", "tcp-path+1", "mptcp,,", "mptcp-static+buffers+stale2", "mptcp+stale9+"} {
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, s string, paths int) {
		if paths < 2 || paths > MaxPaths {
			return
		}
		ps, err := ParseProcedures(s, paths)
		if err != nil {
			return
		}
		for _, p := range ps {
			if p.Path < 0 || p.Path > paths {
				t.Fatalf("%q: path %d of %d", s, p.Path, paths)
			}
			if q, err := parseProc(p.Name, paths); err != nil || !reflect.DeepEqual(q, p) {
				t.Fatalf("%q: %+v does not round-trip: %+v %v", s, p, q, err)
			}
		}
	})
}

// Procedures carry agent mechanisms after "+": each adds its agent
// configuration line after the policy's; anything else is refused with an
// error naming the valid mechanisms (or, for the cwnd clamp, why it does
// not apply to a design's NAT detours).
func TestParseProcedureMechanisms(t *testing.T) {
	ps, err := ParseProcedures("mptcp-static,mptcp-static+buffers,mptcp-static+stale2,mptcp+stale3+buffers,mptcp-static+nobuffers,mptcp-guard+starveoff,mptcp-guard+starve30,mptcp-static+lowat,mptcp+lowat64+buffers,mptcp-static+nolowat,mptcp-static+lowatrtt,mptcp+buffers+lowatrtt,mptcp-static+pace,mptcp-static+lowat+probe100,mptcp-guard+share15+starveoff,mptcp-guard+starve40+share10,mptcp-guard+share15+starveoff+rttoff,mptcp-guard+share15+starveoff+rttoff+outageoff", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, policy, cfg string }{
		{"mptcp-static", "static", "policy: static\n"},
		{"mptcp-static+buffers", "static", "policy: static\nbuffer_sizing: true\n"},
		{"mptcp-static+stale2", "static", "policy: static\nstale_loss_cnt: 2\n"},
		{"mptcp+stale3+buffers", "", "stale_loss_cnt: 3\nbuffer_sizing: true\n"},
		{"mptcp-static+nobuffers", "static", "policy: static\nbuffer_sizing: false\n"},
		{"mptcp-guard+starveoff", "guard", "policy: guard\nguard:\n  starve: 1\n"},
		{"mptcp-guard+starve30", "guard", "policy: guard\nguard:\n  starve: 0.3\n"},
		{"mptcp-static+lowat", "static", "policy: static\nsubflow_lowat: 131072\n"},
		{"mptcp+lowat64+buffers", "", "subflow_lowat: 65536\nbuffer_sizing: true\n"},
		{"mptcp-static+nolowat", "static", "policy: static\nsubflow_lowat: 0\n"},
		{"mptcp-static+lowatrtt", "static", "policy: static\nsubflow_lowat: 131072\nsubflow_lowat_scale: rtt\n"},
		{"mptcp+buffers+lowatrtt", "", "buffer_sizing: true\nsubflow_lowat: 131072\nsubflow_lowat_scale: rtt\n"},
		{"mptcp-static+pace", "static", "policy: static\nsubflow_pacing: true\n"},
		{"mptcp-static+lowat+probe100", "static", "policy: static\nsubflow_lowat: 131072\nprobe_interval: 100ms\n"},
		{"mptcp-guard+share15+starveoff", "guard", "policy: guard\nguard:\n  share: 0.15\n  starve: 1\n"},
		{"mptcp-guard+starve40+share10", "guard", "policy: guard\nguard:\n  starve: 0.4\n  share: 0.1\n"},
		{"mptcp-guard+share15+starveoff+rttoff", "guard", "policy: guard\nguard:\n  share: 0.15\n  starve: 1\n  rtt: 0\n"},
		{"mptcp-guard+share15+starveoff+rttoff+outageoff", "guard", "policy: guard\nguard:\n  share: 0.15\n  starve: 1\n  rtt: 0\n  outage: 0\n"},
	}
	for i, w := range want {
		p := ps[i]
		cfg, err := p.agentConfig()
		if p.Name != w.name || p.Policy != w.policy || !p.Multipath() || err != nil || cfg != w.cfg {
			t.Errorf("%s: %+v config %q %v, want policy %q config %q", w.name, p, cfg, err, w.policy, w.cfg)
		}
	}
	for bad, why := range map[string]string{
		"mptcp-static+":                  `unknown mechanism ""`,
		"mptcp-static+pacing":            `unknown mechanism "pacing" (valid mechanisms: buffers`,
		"mptcp-static+stale0":            "staleN with N 1-255",
		"mptcp-static+stale256":          "staleN with N 1-255",
		"mptcp-static+stale02":           "staleN with N 1-255",
		"mptcp-static+stale":             "staleN with N 1-255",
		"mptcp-static+clamp":             "tunnel detour subflows only",
		"mptcp-static+buffers+buffers":   `mechanism "buffers" named twice`,
		"mptcp-static+stale2+stale3":     `mechanism "stale" named twice`,
		"mptcp+buffers+nobuffers":        `mechanism "buffers" named twice`,
		"mptcp+lowat+nolowat":            `mechanism "lowat" named twice`,
		"tcp-path1+buffers":              "not after \"tcp-path1\"",
		"mptcp-1sf+buffers":              "not after \"mptcp-1sf\"",
		"converted+buffers":              "not after \"converted\"",
		"mptcp-nosuch+buffers":           "mptcp-nosuch",
		"mptcp-static+starveoff":         `mechanism "starveoff" tunes the guard policy's shed rule (guard.starve): mptcp-guard only`,
		"mptcp+starve50":                 `mechanism "starve50" tunes the guard policy's shed rule (guard.starve): mptcp-guard only`,
		"mptcp-guard+starve0":            "starveN with N 1-99",
		"mptcp-guard+starve100":          "starveN with N 1-99",
		"mptcp-guard+starve":             "starveN with N 1-99",
		"mptcp-guard+starve5+starveoff":  `mechanism "starve" named twice`,
		"mptcp-static+share15":           `mechanism "share15" tunes the guard policy's shed rule (guard.share): mptcp-guard only`,
		"mptcp-guard+share0":             "shareN with N 1-99",
		"mptcp-guard+share100":           "shareN with N 1-99",
		"mptcp-guard+share10+share20":    `mechanism "share" named twice`,
		"mptcp-static+rttoff":            `mechanism "rttoff" tunes the guard policy's shed rule (guard.rtt): mptcp-guard only`,
		"mptcp-static+outageoff":         `mechanism "outageoff" tunes the guard policy's shed rule (guard.outage): mptcp-guard only`,
		"mptcp-static+lowat8":            "lowatN with N 16-65536",
		"mptcp-static+lowat016":          "lowatN with N 16-65536",
		"mptcp-static+lowat+lowat64":     `mechanism "lowat" named twice`,
		"mptcp-static+lowatrtt+lowat":    `mechanism "lowat" named twice`,
		"mptcp-static+nolowat+lowatrtt":  `mechanism "lowat" named twice`,
		"mptcp-static+lowatrtt+lowatrtt": `mechanism "lowat" named twice`,
		"mptcp-static+lowatRTT":          "lowatN with N 16-65536",
		"mptcp-static+probe5":            "probeN with N 10-10000",
		"mptcp-static+probe":             "probeN with N 10-10000",
		"mptcp-static+probe100+probe200": `mechanism "probe" named twice`,
		"mptcp-1sf+lowatrtt":             "not after \"mptcp-1sf\"",
		"mptcp-1sf+lowat":                "not after \"mptcp-1sf\"",
	} {
		if _, err := ParseProcedures(bad, 2); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: %v, want an error with %q", bad, err, why)
		}
	}
	if _, err := ParseProcedures("mptcp-static+buffers,mptcp-static+buffers", 2); err == nil {
		t.Error("a procedure with mechanisms listed twice accepted")
	}
}

// A sequential design runs a procedure with mechanisms in a run of its own,
// named after policy and mechanisms, with their agent configuration.
func TestRunsMechanisms(t *testing.T) {
	d := &Design{Space: DefaultSpace(2), Procedures: []string{"tcp-path1", "mptcp-static", "mptcp-static+buffers"}}
	rs, err := d.runs()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		cfg, err := Proc{Policy: r.Policy, Mechanisms: r.Mechanisms}.agentConfig()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%s:%q", r.Name, strings.Join(procNames(r.Procs), "+"), cfg))
	}
	want := `static:tcp-path1+mptcp-static:"policy: static\n" static+buffers:mptcp-static+buffers:"policy: static\nbuffer_sizing: true\n"`
	if strings.Join(got, " ") != want {
		t.Errorf("runs %s, want %s", strings.Join(got, " "), want)
	}
}

// Since the limit is the agent's default, mptcp-static and
// mptcp-static+lowat give the agent one configuration: a run of both is
// announced; +nolowat (the agent without it) and +lowatrtt differ.
func TestEqualArms(t *testing.T) {
	ps, err := ParseProcedures("tcp-path1,tcp-path2,mptcp-1sf,mptcp-static,mptcp-static+nolowat,mptcp-static+lowat,mptcp-static+lowatrtt,mptcp-static+lowat64", 2)
	if err != nil {
		t.Fatal(err)
	}
	got := EqualArms(ps)
	if len(got) != 1 || !strings.Contains(got[0], "mptcp-static and mptcp-static+lowat give the agent the same configuration") || !strings.Contains(got[0], "+nolowat") {
		t.Errorf("EqualArms: %q", got)
	}
	ps, err = ParseProcedures("mptcp-static,mptcp-static+nolowat,mptcp-adaptive+lowat", 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := EqualArms(ps); len(got) != 0 {
		t.Errorf("EqualArms without an equal pair: %q", got)
	}
}
