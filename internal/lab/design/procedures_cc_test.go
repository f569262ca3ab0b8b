package design

import (
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// +ALGO switches on subflow_congestion for detour subflows with an
// algorithm the kernel offers; one algorithm per procedure.
func TestParseProcedureSubflowCC(t *testing.T) {
	for _, a := range []string{"bbr", "reno"} {
		if err := subflowcc.Check(a); err != nil {
			t.Skip(err)
		}
	}
	ps, err := ParseProcedures("mptcp-static,mptcp-static+bbr,mptcp+reno+buffers", 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"policy: static\n", "policy: static\nsubflow_congestion:\n  detour: bbr\n",
		"subflow_congestion:\n  detour: reno\nbuffer_sizing: true\n"} {
		if cfg, err := ps[i].agentConfig(); err != nil || cfg != want {
			t.Errorf("%s: config %q %v, want %q", ps[i].Name, cfg, err, want)
		}
	}
	for bad, why := range map[string]string{
		"mptcp-static+bbr+reno":  `mechanism "congestion control" named twice`,
		"mptcp-static+vegas9":    `unknown mechanism "vegas9" (valid mechanisms: buffers`,
		"tcp-path1+bbr":          `not after "tcp-path1"`,
		"mptcp-static+bbr+clamp": "tunnel detour subflows only",
	} {
		if _, err := ParseProcedures(bad, 2); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: %v, want an error with %q", bad, err, why)
		}
	}
}
