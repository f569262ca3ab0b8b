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
// IPv6 address, the agent adding an IPv6 NAT detour subflow (relay with
// listen6, an IPv6 grant) to an IPv6 connection, and an IPv6 subflow
// through a WireGuard tunnel over IPv6 (relay with tunnel.subnet6) that
// carries bytes. An IPv6 procedure in an IPv4 lab is unavailable, not
// faked.
func TestSmokeIPv6(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "pgrep")
	b := binary(t)
	s, err := scenario.Parse("smoke-ipv6", []byte(`name: smoke-ipv6
topology: brennan2017
roles: {client: client, server: server, detours: [detour]}
trials: 1
duration: 1s
warmup: 300ms
cc: cubic
configurations:
  - {name: dual, set: {family: dual}}
  - {name: v4, set: {family: "4"}}
procedures: [tcp6, mptcp-nat6, mptcp-tunnel6]
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
		var tunnelBytes uint64
		for _, sf := range r.Subflows {
			local := "[fd6c:6162::" // the lab's IPv6 twins
			if sf.Path == "tunnel:detour" {
				local = "[fd64:80:1::" // the relay's tunnel.subnet6
				tunnelBytes += sf.Bytes
			}
			if !strings.HasPrefix(sf.Local, local) || !strings.HasPrefix(sf.Remote, "[fd6c:6162::") {
				t.Errorf("%s: subflow %s %s -> %s is not IPv6 on its path", r.Cell, sf.Path, sf.Local, sf.Remote)
			}
		}
		if strings.Contains(r.Cell, "mptcp-nat6") && (len(r.Subflows) != 2 || r.Subflows[0].Path != "nat:detour" && r.Subflows[1].Path != "nat:detour") {
			t.Errorf("mptcp-nat6 subflows %+v", r.Subflows)
		}
		if strings.Contains(r.Cell, "mptcp-tunnel6") && (len(r.Subflows) != 2 || tunnelBytes == 0) {
			t.Errorf("mptcp-tunnel6: %d bytes through the tunnel, subflows %+v", tunnelBytes, r.Subflows)
		}
	}
	if seen != 6 {
		t.Errorf("%d records, want 6", seen)
	}
}
