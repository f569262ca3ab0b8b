package topology

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]Rate{"10mbit": 10e6, "20Mbit/s": 20e6, "500kbit": 500e3, "1gbit": 1e9, "0": 0, "1.5mbit": 1.5e6} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"10", "10mbps", "fast", "-1mbit", "200gbit", "10 furlongs", "1bit"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
}

func TestParseLossDelayQueue(t *testing.T) {
	if l, err := ParseLoss("1%"); err != nil || l != 0.01 {
		t.Errorf("1%%: %v %v", l, err)
	}
	if l, err := ParseLoss("0.5 %"); err != nil || l != 0.005 {
		t.Errorf("0.5%%: %v %v", l, err)
	}
	for _, in := range []string{"1", "101%", "-1%", "x%", "NaN%"} {
		if _, err := ParseLoss(in); err == nil {
			t.Errorf("ParseLoss(%q) accepted", in)
		}
	}
	if d, err := ParseDelay("100ms"); err != nil || d != 100*time.Millisecond {
		t.Errorf("100ms: %v %v", d, err)
	}
	for _, in := range []string{"100", "-5ms", "11s", "5 ms"} {
		if _, err := ParseDelay(in); err == nil {
			t.Errorf("ParseDelay(%q) accepted", in)
		}
	}
	if _, err := ParseQueue("0"); err == nil {
		t.Error("queue 0 accepted")
	}
}

func TestBuiltins(t *testing.T) {
	b, err := Builtin("brennan2017")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"client": "10.0.1.1", "r1": "10.0.1.2", "r2": "10.0.2.2", "r3": "10.0.4.2", "server": "10.0.3.2", "detour": "10.0.6.2"}
	for n, a := range want {
		if got := b.Primary(n).String(); got != a {
			t.Errorf("%s primary %s, want %s", n, got, a)
		}
	}
	// core-limited by default: access 20, core 10.
	if b.Link("L1").AB.Rate != 20e6 || b.Link("L2").BA.Rate != 10e6 {
		t.Errorf("default profile rates: L1 %v L2 %v", b.Link("L1").AB.Rate, b.Link("L2").BA.Rate)
	}
	if err := b.Set("L2.loss", "2%"); err != nil {
		t.Fatal(err)
	}
	if err := b.Set("profile", "symmetric"); err != nil {
		t.Fatal(err)
	}
	// The parameter change regenerates the topology and keeps the override.
	if b.Link("L1").AB.Rate != 10e6 || b.Link("L2").AB.Loss != 0.02 {
		t.Errorf("after profile=symmetric: L1 %v, L2 loss %v", b.Link("L1").AB.Rate, b.Link("L2").AB.Loss)
	}
	if err := b.Set("variant", "delayed"); err != nil {
		t.Fatal(err)
	}
	if b.Link("L2").AB.Delay != 100*time.Millisecond || b.Link("L4").AB.Delay != 5*time.Millisecond {
		t.Errorf("delayed variant: L2 %v L4 %v", b.Link("L2").AB.Delay, b.Link("L4").AB.Delay)
	}
	if err := b.Set("L2.ab.rate", "5mbit"); err != nil {
		t.Fatal(err)
	}
	if b.Link("L2").AB.Rate != 5e6 || b.Link("L2").BA.Rate != 10e6 {
		t.Errorf("L2.ab.rate: %v / %v", b.Link("L2").AB.Rate, b.Link("L2").BA.Rate)
	}
	if err := b.Set("core.queue", "20"); err != nil || b.Link("L5").BA.Queue != 20 || b.Link("L1").AB.Queue != 0 {
		t.Errorf("core.queue: %v", err)
	}
	for _, kv := range [][2]string{{"L9.rate", "1mbit"}, {"L2.rate", "10mbps"}, {"L2.xy.rate", "1mbit"}, {"profile", "fast"}, {"L2.color", "red"}, {"detours", "3"}} {
		if err := b.Set(kv[0], kv[1]); err == nil {
			t.Errorf("Set(%s=%s) accepted", kv[0], kv[1])
		}
	}

	d, err := Builtin("detours")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Set("detours", "3"); err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if d.Node("detour3") == nil || d.Node("detour4") != nil || d.Primary("detour2").String() != "10.1.2.2" {
		t.Errorf("detours=3: %v", d.Nodes)
	}
	if err := d.Set("C3.delay", "50ms"); err != nil {
		t.Fatal(err)
	}
	if err := d.Set("detours", "2"); err == nil {
		t.Error("detours=2 accepted although C3 is overridden")
	}
	for _, k := range []string{"0", "9", "x"} {
		if err := d.Set("detours", k); err == nil {
			t.Errorf("detours=%s accepted", k)
		}
	}
	if _, err := Builtin("nope"); err == nil {
		t.Error("unknown built-in accepted")
	}
}

// A shared detour has no egress link: it reaches the server through r1 and
// the default path's core link C0.
func TestDetoursShared(t *testing.T) {
	d, err := Builtin("detours")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"detours", "4"}, {"shared", "2+4"}} {
		if err := d.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if d.Link("E1") == nil || d.Link("E2") != nil || d.Link("E3") == nil || d.Link("E4") != nil || d.Link("C2") == nil {
		t.Errorf("shared=2+4: links %v", d.Links)
	}
	if rs := d.Node("detour2").Routes; len(rs) != 1 || rs[0].Dst.String() != "0.0.0.0/0" || rs[0].Via.String() != "10.1.2.1" {
		t.Errorf("detour2 routes %v: want only the default route via r1", rs)
	}
	if err := d.Set("detours", "3"); err == nil {
		t.Error("detours=3 accepted with shared=2+4")
	}
	for _, v := range []string{"0", "9", "2+2", "x", "2,4", ""} {
		if err := d.Set("shared", v); err == nil && v != "" {
			t.Errorf("shared=%q accepted", v)
		}
	}
}

func TestLoadExample(t *testing.T) {
	topo, err := LoadFile("../../../lab/triangle.yaml")
	if err != nil {
		t.Fatal(err)
	}
	core := topo.Link("core")
	if core.AB.Loss != 0.005 || core.BA.Loss != 0 || core.AB.Queue != 50 || core.BA.Rate != 10e6 {
		t.Errorf("core link: %+v", core)
	}
	if topo.Primary("server").String() != "10.9.2.2" {
		t.Errorf("server %v", topo.Primary("server"))
	}
}

const goodFile = `name: t
nodes:
  - name: a
    routes:
      - {to: default, via: 10.0.0.2}
  - name: b
links:
  - name: x
    a: a
    b: b
    subnet: 10.0.0.0/24
    rate: 10mbit
`

func TestParseErrors(t *testing.T) {
	if _, err := Parse("f.yaml", []byte(goodFile)); err != nil {
		t.Fatalf("good file: %v", err)
	}
	cases := []struct{ name, from, to, want string }{
		{"unknown node", "    b: b\n", "    b: zz\n", `f.yaml:10: link x.b: unknown node "zz"`},
		{"bad unit", "rate: 10mbit", "rate: 10mbps", `f.yaml:12:11: links[0].rate: bad rate "10mbps": unknown unit`},
		{"route to nowhere", "via: 10.0.0.2}", "via: 10.0.9.2}", `f.yaml:5:9: node a.routes[0]: route to 0.0.0.0/0 via 10.0.9.2 goes nowhere`},
		{"route to unassigned", "via: 10.0.0.2}", "via: 10.0.0.7}", `goes nowhere: no node has address 10.0.0.7`},
		{"unknown field", "    rate: 10mbit\n", "    rate: 10mbit\n    colour: red\n", `f.yaml:13:5: links[0].colour: unknown field`},
		{"duplicate address", "    subnet: 10.0.0.0/24\n", "    a_addr: 10.0.0.1/24\n    b_addr: 10.0.0.1/24\n", `f.yaml:12:13: link x.b_addr: duplicate address 10.0.0.1`},
		{"duplicate node", "  - name: b\n", "  - name: a\n", `duplicate node "a"`},
		{"bad subnet", "10.0.0.0/24\n", "10.0.0.1/24\n", `f.yaml:11:13: link x.subnet: bad subnet`},
		{"not yaml", "nodes:", "nodes: [", `f.yaml`},
		{"bad sysctl", "  - name: b\n", "  - name: b\n    sysctls: {kernel.panic: 1}\n", `only net.* keys`},
		{"link named like node", "  - name: x\n", "  - name: a\n", `f.yaml:8:5: link a: link "a" has the name of a node`},
	}
	for _, c := range cases {
		in := strings.Replace(goodFile, c.from, c.to, 1)
		if in == goodFile {
			t.Fatalf("%s: replacement did not apply", c.name)
		}
		_, err := Parse("f.yaml", []byte(in))
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not contain %q", c.name, err, c.want)
		}
		var le *Error
		if !errors.As(err, &le) || le.Source != "f.yaml" {
			t.Errorf("%s: error %v does not name the file", c.name, err)
		}
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(goodFile))
	for _, name := range []string{"../../../lab/brennan2017.yaml", "../../../lab/triangle.yaml"} {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("nodes: [{name: a}]\nlinks: []\n"))
	f.Add([]byte("nodes:\n  - name: a\n    sysctls: {net.x: 1}\nlinks:\n  - {name: l, a: a, b: a, a_addr: 1.2.3.4/24, b_addr: 1.2.3.5/24, ab: {delay: 5ms}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		// Whatever parses must validate again and have a consistent model.
		if err := topo.Validate(); err != nil {
			t.Fatalf("parsed topology fails validation: %v", err)
		}
		for _, l := range topo.Links {
			if topo.Node(l.A.Node) == nil || topo.Node(l.B.Node) == nil {
				t.Fatalf("link %s with unknown endpoint", l.Name)
			}
		}
	})
}

// TestBrennanFileMatchesBuiltin keeps lab/brennan2017.yaml equal to the
// built-in (core-limited).
func TestBrennanFileMatchesBuiltin(t *testing.T) {
	f, err := LoadFile("../../../lab/brennan2017.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Builtin("brennan2017")
	if len(f.Nodes) != len(b.Nodes) || len(f.Links) != len(b.Links) {
		t.Fatalf("file has %d nodes/%d links, built-in %d/%d", len(f.Nodes), len(f.Links), len(b.Nodes), len(b.Links))
	}
	for i, n := range b.Nodes {
		fn := f.Nodes[i]
		if fn.Name != n.Name || fn.Forward != n.Forward || len(fn.Routes) != len(n.Routes) {
			t.Errorf("node %d: file %+v, built-in %+v", i, fn, n)
			continue
		}
		for j, r := range n.Routes {
			if fn.Routes[j].Dst != r.Dst || fn.Routes[j].Via != r.Via {
				t.Errorf("node %s route %d: file %v via %v, built-in %v via %v", n.Name, j, fn.Routes[j].Dst, fn.Routes[j].Via, r.Dst, r.Via)
			}
		}
	}
	for i, l := range b.Links {
		fl := f.Links[i]
		if fl.Name != l.Name || fl.Class != l.Class || fl.A != l.A || fl.B != l.B || fl.AB != l.AB || fl.BA != l.BA {
			t.Errorf("link %d: file %+v, built-in %+v", i, fl, l)
		}
	}
}

// The rack: 8 servers under a ToR, degree direct links per server, each
// server reaching its neighbours' primary addresses over the direct link.
func TestRack(t *testing.T) {
	for d := 1; d <= MaxRackDegree; d++ {
		r, err := Builtin("rack")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Set("degree", strconv.Itoa(d)); err != nil {
			t.Fatal(err)
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("degree %d: %v", d, err)
		}
		peers := 0
		for _, l := range r.Links {
			if l.Class == "peer" {
				peers++
			}
		}
		if want := RackServers * d / 2; peers != want {
			t.Errorf("degree %d: %d peer links, want %d", d, peers, want)
		}
		for i := 1; i <= RackServers; i++ {
			s := r.Node(fmt.Sprintf("s%d", i))
			if got := r.Primary(s.Name).String(); got != fmt.Sprintf("10.3.%d.2", i) {
				t.Errorf("degree %d: %s primary %s", d, s.Name, got)
			}
			nb := RackNeighbours(i, d)
			if len(nb) != d || len(s.Routes) != d+1 {
				t.Errorf("degree %d: %s neighbours %v, routes %d", d, s.Name, nb, len(s.Routes))
			}
		}
	}
	if got := RackNeighbours(1, 4); fmt.Sprint(got) != "[2 8 3 7]" {
		t.Errorf("neighbours of s1 at degree 4: %v", got)
	}
	r, _ := Builtin("rack")
	for _, v := range []string{"0", "5", "x"} {
		if err := r.Set("degree", v); err == nil {
			t.Errorf("degree=%s accepted", v)
		}
	}
	if err := r.Set("server.rate", "100mbit"); err != nil || r.Link("U3").AB.Rate != 100*mbit || r.Link("X").AB.Rate != 0 {
		t.Errorf("server.rate: %v", err)
	}
}
