package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// End to end over IPv6 in a dual-stack lab: plain TCP to the server's
// IPv6 address, and the agent adding an IPv6 NAT detour subflow (relay
// with listen6, an IPv6 grant) to an IPv6 connection. An IPv6 procedure
// in an IPv4 lab is unavailable, not faked.
func TestSmokeIPv6(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "pgrep")
	b := binary(t)
	s, err := scenario.Parse("smoke-ipv6", []byte(`name: smoke-ipv6
topology: brennan2017
roles: {client: client, server: server, detours: [detour]}
trials: 1
duration: 2s
warmup: 500ms
cc: cubic
configurations:
  - {name: dual, set: {family: dual}}
  - {name: v4, set: {family: "4"}}
procedures: [tcp6, mptcp-nat6]
`))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	name := labName()
	t.Cleanup(func() { checkClean(t, name) })
	var progress strings.Builder
	_, err = Run(context.Background(), Options{Scenario: s, Out: out, LabName: name, Binary: b, Progress: &progress})
	t.Log(progress.String())
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.Load(filepath.Join(out, results.TrialsFile))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, r := range recs {
		seen++
		if r.Configuration == "v4" {
			if r.Status != results.Unavailable || !strings.Contains(r.Reason, "family") {
				t.Errorf("%s in an IPv4 lab: %s %s", r.Cell, r.Status, r.Reason)
			}
			continue
		}
		if r.Status != results.OK || r.GoodputMbps <= 0 {
			t.Errorf("%s: %s %s", r.Cell, r.Status, r.Reason)
			continue
		}
		for _, sf := range r.Subflows {
			if !strings.HasPrefix(sf.Local, "[fd6c:6162::") || !strings.HasPrefix(sf.Remote, "[fd6c:6162::") {
				t.Errorf("%s: subflow %s -> %s is not IPv6", r.Cell, sf.Local, sf.Remote)
			}
		}
		if strings.Contains(r.Cell, "mptcp-nat6") && (len(r.Subflows) != 2 || r.Subflows[0].Path != "nat:detour" && r.Subflows[1].Path != "nat:detour") {
			t.Errorf("mptcp-nat6 subflows %+v", r.Subflows)
		}
	}
	if seen != 4 {
		t.Errorf("%d records, want 4", seen)
	}
}
