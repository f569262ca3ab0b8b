package scenario

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestBuiltinsParse(t *testing.T) {
	names := Builtins()
	for _, want := range []string{"brennan2017", "smoke", "demo"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Fatalf("built-in %q missing from %v", want, names)
		}
	}
	for _, n := range names {
		s, err := Builtin(n)
		if err != nil {
			t.Fatalf("built-in %s: %v", n, err)
		}
		if s.Name != n {
			t.Errorf("built-in file %s.yaml names itself %q", n, s.Name)
		}
		if len(s.Cells()) == 0 {
			t.Errorf("built-in %s: empty plan", n)
		}
	}
}

func TestBrennan2017Plan(t *testing.T) {
	s, err := Builtin("brennan2017")
	if err != nil {
		t.Fatal(err)
	}
	cells := s.Cells()
	if len(cells) != 36 {
		t.Fatalf("brennan2017: %d cells, want 6 configurations x 6 procedures", len(cells))
	}
	if time.Duration(s.Duration) != 10*time.Second || s.CC != "cubic" || s.Trials != 10 {
		t.Errorf("brennan2017: duration %v cc %s trials %d", time.Duration(s.Duration), s.CC, s.Trials)
	}
	c := s.Configuration("core-limited-loss1")
	if c == nil || len(c.Set) != 2 || c.Set[0] != (Param{"profile", "core-limited"}) || c.Set[1] != (Param{"L2.loss", "1%"}) {
		t.Fatalf("core-limited-loss1 parameters not in file order: %+v", c)
	}
	for _, cell := range cells {
		if cell.Procedure == MPTCPNAT {
			ids, ok := s.SinglePathCells(cell)
			if !ok || strings.Join(ids, ",") != "tcp,tcp-nat" {
				t.Errorf("%s/%s: single paths %v %v", cell.Configuration, cell.ID, ids, ok)
			}
		}
	}
	if got := s.Reference.Results["core-limited"][MPTCPNAT]; len(got) != 2 || got[0] != 18.81 {
		t.Errorf("reference core-limited mptcp-nat = %v", got)
	}
}

const base = `
name: x
topology: brennan2017
roles: {detours: [d1, d2]}
configurations:
  - name: a
    set: {profile: core-limited, detours: 2}
procedures: [tcp, mptcp-nat, {procedure: tcp-nat, detour: each}]
`

func TestExpansion(t *testing.T) {
	s, err := Parse("t.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range s.Cells() {
		ids = append(ids, c.ID+"="+strings.Join(c.Detours, "+"))
	}
	if got := strings.Join(ids, " "); got != "tcp= mptcp-nat=d1+d2 tcp-nat@d1=d1 tcp-nat@d2=d2" {
		t.Fatalf("cells: %s", got)
	}
	mp := s.Cells()[1]
	if ids, ok := s.SinglePathCells(mp); !ok || strings.Join(ids, ",") != "tcp,tcp-nat@d1,tcp-nat@d2" {
		t.Fatalf("single paths: %v %v", ids, ok)
	}
	if s.Configurations[0].Set[1].Value != "2" {
		t.Fatalf("numeric parameter: %+v", s.Configurations[0].Set)
	}
	if s.Trials != 10 || s.Roles.Client != "client" || s.Roles.Server != "server" {
		t.Fatalf("defaults not applied: %+v", s)
	}
}

func TestBadFiles(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"empty", ``, "empty scenario file"},
		{"syntax", "name: [", "t.yaml"},
		{"unknown top field", base + "trails: 3\n", "unknown key \"trails\""},
		{"unknown field line", base + "trails: 3\n", "t.yaml:9:1"},
		{"no name", strings.Replace(base, "name: x", "", 1), "name: missing"},
		{"bad name", strings.Replace(base, "name: x", "name: ../x", 1), "name:"},
		{"no topology", strings.Replace(base, "topology: brennan2017", "", 1), "topology: missing"},
		{"bad duration", base + "duration: 10\n", "duration: \"10\" is not a duration"},
		{"warmup too long", base + "duration: 2s\nwarmup: 3s\n", "warmup"},
		{"trials negative", base + "trials: -1\n", "trials: -1"},
		{"unknown procedure", strings.Replace(base, "[tcp,", "[tpc,", 1), `procedures[0]: unknown procedure "tpc"`},
		{"unknown detour", strings.Replace(base, "detour: each", "detour: d9", 1), `procedures[2].detour: "d9" is not a detour node`},
		{"detour on tcp", strings.Replace(base, "[tcp,", "[{procedure: tcp, detour: d1},", 1), "uses no detour"},
		{"unknown key in procedure", strings.Replace(base, "detour: each", "detuor: each", 1), "detuor"},
		{"duplicate cell", strings.Replace(base, "[tcp,", "[tcp, tcp,", 1), "tcp listed twice"},
		{"duplicate configuration", base + "  - {name: a, set: {}}\n", ""},
		{"nested parameter", strings.Replace(base, "detours: 2}", "detours: {k: 2}}", 1), `parameter "detours": value must be a single value`},
		{"duplicate parameter", strings.Replace(base, "detours: 2}", "profile: x}", 1), `parameter "profile" given twice`},
		{"no detours", strings.Replace(base, "roles: {detours: [d1, d2]}", "", 1), "roles.detours is empty"},
		{"target config", base + "targets: [{configuration: b, procedure: mptcp-nat, ratio: sum, min: 1}]\n", `targets[0].configuration: "b"`},
		{"target ratio", base + "targets: [{configuration: a, procedure: mptcp-nat, ratio: xx, min: 1}]\n", `targets[0].ratio: unknown ratio "xx"`},
		{"target ratio on tcp", base + "targets: [{configuration: a, procedure: tcp, ratio: sum, min: 1}]\n", `targets[0].ratio: "sum" needs an MPTCP`},
		{"reference shape", base + "reference: {results: {a: {tcp: [1]}}}\n", "reference.results.a.tcp: want [mean, sd]"},
		{"two documents", base + "---\nname: y\n", "more than one YAML document"},
		{"same client server", base + "roles: {client: s, server: s}\n", ""},
		{"subflows on tcp", strings.Replace(base, "[tcp,", "[{procedure: tcp, subflows: 2},", 1), "procedures[0].subflows: 2: only an MPTCP procedure"},
		{"subflows too many", strings.Replace(base, "[tcp,", "[{procedure: mptcp-nat, subflows: 9},", 1), "procedures[0].subflows: 9"},
		{"converted without converter", strings.Replace(base, "[tcp,", "[converted, tcp,", 1), "converted needs roles.converter"},
		{"converter is a detour", strings.Replace(base, "roles: {detours: [d1, d2]}", "roles: {detours: [d1, d2], converter: d1}", 1), `roles.converter: "d1" is also`},
		{"server_mptcp not a bool", base + "server_mptcp: maybe\n", "server_mptcp"},
		{"empty procedures of a configuration", strings.Replace(base, "detours: 2}", "detours: 2}\n    procedures: []", 1), "configurations[0].procedures: empty list"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(c.text))
			if err == nil {
				t.Fatalf("accepted:\n%s", c.text)
			}
			if !strings.HasPrefix(err.Error(), "t.yaml:") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not name the file and %q", err, c.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.yaml")
	if err := os.WriteFile(p, []byte(base), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Load(p)
	if err != nil || s.Name != "x" || s.Source != p {
		t.Fatalf("Load(file) = %+v, %v", s, err)
	}
	if s, err := Load("smoke"); err != nil || s.Source != "builtin:smoke" {
		t.Fatalf("Load(builtin) = %+v, %v", s, err)
	}
	if _, err := Load("nosuch"); err == nil || !strings.Contains(err.Error(), "built-in: ") {
		t.Fatalf("Load(nosuch) error %v does not list the built-ins", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("Load(missing file) error %v", err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("Load(dir) error %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(base))
	for _, n := range Builtins() {
		b, _ := os.ReadFile(filepath.Join("../../../../lab/scenarios", n+".yaml"))
		f.Add(b)
	}
	f.Add([]byte("name: x\ntopology: t\nconfigurations: [{name: a}]\nprocedures: [{procedure: mptcp-nat, detour: all}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz") {
				t.Fatalf("error does not name the source: %v", err)
			}
			return
		}
		// A valid scenario has a plan whose cells all name known procedures
		// and configurations, and parses again to the same plan.
		cells := s.Cells()
		for _, c := range cells {
			if Label(c.Procedure) == "" || s.Configuration(c.Configuration) == nil || c.Trials < 1 {
				t.Fatalf("bad cell %+v", c)
			}
		}
		s2, err := Parse("fuzz", data)
		if err != nil || len(s2.Cells()) != len(cells) {
			t.Fatalf("reparse differs: %v", err)
		}
	})
}

func TestSetProcedures(t *testing.T) {
	s, err := Builtin("brennan2017")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetProcedures([]string{"tcp", "tcp-openvpn"}); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Cells()); n != 12 {
		t.Fatalf("%d cells after --procedures tcp,tcp-openvpn", n)
	}
	err = s.SetProcedures([]string{"tcp", "udp"})
	if err == nil || !strings.Contains(err.Error(), `unknown procedure "udp"`) {
		t.Fatalf("bad procedure accepted: %v", err)
	}
	if n := len(s.Cells()); n != 12 {
		t.Fatalf("failed SetProcedures changed the plan: %d cells", n)
	}
}

// A subset of detours for an MPTCP procedure, and faults.
func TestDetourSetsAndFaults(t *testing.T) {
	src := strings.Replace(base, "procedures: [tcp, mptcp-nat,", "procedures: [tcp, mptcp-nat, {procedure: mptcp-nat-static, detour: d2+d1},", 1)
	src = strings.Replace(src, "    set: {profile: core-limited, detours: 2}\n", "    set: {profile: core-limited, detours: 2}\n    fault: {link: L2, at: 4s, for: 2s}\n", 1)
	s, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, c := range s.Cells() {
		if c.ID == "mptcp-nat-static@d2+d1" {
			found = len(c.Detours) == 2 && c.Detours[0] == "d2" && c.Fault != nil && c.Fault.Link == "L2" && c.K() == 2
		}
	}
	if !found {
		t.Fatalf("cells %+v", s.Cells())
	}
	k1, err := Parse("t.yaml", []byte(strings.Replace(src, "detour: d2+d1}", "detour: d2+d1, subflows: 1}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	found = false
	for _, c := range k1.Cells() {
		if c.ID == "mptcp-nat-static@d2+d1/k1" {
			found = c.K() == 1 && len(c.Detours) == 2 && c.Label() == "MPTCP + NAT detour, static policy (d2+d1) K=1"
		}
	}
	if !found {
		t.Fatalf("subflows: 1: cells %+v", k1.Cells())
	}
	for bad, want := range map[string]string{
		strings.Replace(src, "d2+d1", "d2+d9", 1):             `"d9" in "d2+d9" is not a detour node`,
		strings.Replace(src, "d2+d1", "d2+d2", 1):             "is repeated",
		strings.Replace(src, "at: 4s, for: 2s", "at: 20s", 1): "fault.at",
		strings.Replace(src, "link: L2, ", "", 1):             "fault.link: missing",
	} {
		if _, err := Parse("t.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
}

// Attacks: copied to every cell of their configuration; bad
// ones are refused naming the field.
func TestAttacks(t *testing.T) {
	src := strings.Replace(base, "    set: {profile: core-limited, detours: 2}\n", "    set: {profile: core-limited, detours: 2}\n    attack: {kind: join-flood, from: r2, rate: 5000, probes: 5}\n", 1)
	s, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range s.Cells() {
		if c.Attack != nil {
			n++
			if c.Attack.Kind != "join-flood" || c.Attack.From != "r2" || c.Attack.Rate != 5000 || c.Attack.Probes != 5 {
				t.Fatalf("cell %s attack %+v", c.ID, c.Attack)
			}
		}
	}
	if n == 0 {
		t.Fatal("no cell carries the attack")
	}
	for bad, want := range map[string]string{
		strings.Replace(src, "kind: join-flood", "kind: smurf", 1): `attack.kind: "smurf" unknown`,
		strings.Replace(src, "from: r2, ", "", 1):                  "attack.from: missing",
		strings.Replace(src, "rate: 5000", "rate: -1", 1):          "attack.rate",
		strings.Replace(src, "probes: 5", "probes: 1000", 1):       "attack.probes",
		strings.Replace(src, "probes: 5", "probes: 5, size: 3", 1): "size",
	} {
		if _, err := Parse("t.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
	// kind none needs no attacker node.
	ok := strings.Replace(src, "kind: join-flood, from: r2, ", "kind: none, ", 1)
	if _, err := Parse("t.yaml", []byte(ok)); err != nil {
		t.Errorf("attack none: %v", err)
	}
}

// The "scenario as run" a run writes (yaml.Marshal of the parsed scenario)
// must parse again into the same cells: a configuration without its own
// procedures must not come back as an empty list that runs nothing.
func TestMarshalRoundTrip(t *testing.T) {
	s, err := Parse("t.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("again.yaml", b)
	if err != nil {
		t.Fatalf("as-run file does not parse: %v\n%s", err, b)
	}
	ids := func(s *Scenario) (out []string) {
		for _, c := range s.Cells() {
			out = append(out, c.Configuration+"/"+c.ID)
		}
		return out
	}
	if a, b := strings.Join(ids(s), " "), strings.Join(ids(again), " "); a != b || a == "" {
		t.Fatalf("cells changed through the as-run file: %q -> %q", a, b)
	}
}

// Flow configurations (rack scenario): sizes with units, copied to every
// cell; bad ones are refused naming the field.
func TestFlow(t *testing.T) {
	src := strings.Replace(base, "    set: {profile: core-limited, detours: 2}\n", "    set: {profile: core-limited, detours: 2}\n    flow: {size: 75KB, flows: 20, background: true}\n", 1)
	s, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range s.Cells() {
		if c.Flow != nil {
			n++
			if c.Flow.Size != 75000 || c.Flow.Flows != 20 || !c.Flow.Background {
				t.Fatalf("cell %s flow %+v", c.ID, c.Flow)
			}
		}
	}
	if n == 0 {
		t.Fatal("no cell carries the flow")
	}
	for bad, want := range map[string]string{
		strings.Replace(src, "size: 75KB", "size: 75kib", 1):    "bad size",
		strings.Replace(src, "size: 75KB", "size: 0", 1):        "bad size",
		strings.Replace(src, "size: 75KB, ", "", 1):             "flow.size: missing",
		strings.Replace(src, "flows: 20", "flows: 5000", 1):     "flow.flows",
		strings.Replace(src, "flows: 20", "flows: 20, x: 1", 1): "x",
	} {
		if _, err := Parse("t.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
	for in, want := range map[string]ByteSize{"15KB": 15000, "100MB": 100e6, "1500": 1500, "2 mb": 2e6, "1GB": 1e9} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v", in, got, err)
		}
		if got, _ := ParseByteSize(want.String()); got != want {
			t.Errorf("%d round trip via %s", want, want.String())
		}
	}
	for _, in := range []string{"", "-1KB", "1.5MB", "11GB", "KB", "1e3"} {
		if _, err := ParseByteSize(in); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", in)
		}
	}
}

// An IPv6 MPTCP procedure is compared against the IPv6 single paths: tcp6
// and its own single-path procedure, not the IPv4 tcp row of the same run.
func TestSinglePathCellsIPv6(t *testing.T) {
	s, err := Parse("t.yaml", []byte(`name: t
topology: brennan2017
roles: {detours: [d]}
configurations:
  - {name: a, set: {family: dual}}
procedures: [tcp, tcp6, tcp-nat, tcp-nat6, mptcp-nat, mptcp-nat6, tcp-tunnel6, mptcp-tunnel6]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"mptcp-nat": "tcp,tcp-nat", "mptcp-nat6": "tcp6,tcp-nat6", "mptcp-tunnel6": "tcp6,tcp-tunnel6"}
	for _, c := range s.Cells() {
		w, has := want[c.ID]
		if !has {
			continue
		}
		if ids, ok := s.SinglePathCells(c); !ok || strings.Join(ids, ",") != w {
			t.Errorf("%s: single paths %v %v, want %s", c.ID, ids, ok, w)
		}
	}
}
