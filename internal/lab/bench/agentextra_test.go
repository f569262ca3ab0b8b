package bench

import (
	"testing"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// Each policy procedure's agent configuration (its policy, the runner's
// probe interval and the mechanism it measures) is one the agent accepts,
// and it switches on what the procedure's name says.
func TestProcedureAgentConfig(t *testing.T) {
	for _, tc := range []struct {
		proc, policy string
		check        func(agentd.Config) bool
	}{
		{scenario.MPTCPNATStaticSBD, "static", func(c agentd.Config) bool { return c.Agent.SharedBottleneck }},
		{scenario.MPTCPTunnelStaticSBD, "static", func(c agentd.Config) bool { return c.Agent.SharedBottleneck }},
		{scenario.MPTCPNATGuard, "guard", func(c agentd.Config) bool { return c.Agent.GuardStarve != 1 && c.Agent.Policy.String() == "guard" }},
		{scenario.MPTCPNATGuardStarveOff, "guard", func(c agentd.Config) bool { return c.Agent.GuardStarve == 1 }},
		{scenario.MPTCPNATStatic, "static", func(c agentd.Config) bool { return !c.Agent.SharedBottleneck }},
		// The limit is the agent's default: the plain and -lowat
		// procedures have it, the -nolowat ones turn it off.
		{scenario.MPTCPNATStaticLowat, "static", func(c agentd.Config) bool { return c.SubflowLowat == 131072 }},
		{scenario.MPTCPTunnelStaticLowat, "static", func(c agentd.Config) bool { return c.SubflowLowat == 131072 }},
		{scenario.MPTCPNATStaticNoLowat, "static", func(c agentd.Config) bool { return c.SubflowLowat == 0 && !c.SubflowLowatDefault }},
		{scenario.MPTCPNATStaticLowatRTT, "static", func(c agentd.Config) bool {
			return c.SubflowLowat == 131072 && c.SubflowLowatScale == agentd.LowatScaleRTT
		}},
		{scenario.MPTCPTunnelStaticLowatRTT, "static", func(c agentd.Config) bool {
			return c.SubflowLowat == 131072 && c.SubflowLowatScale == agentd.LowatScaleRTT
		}},
		{scenario.MPTCPTunnelStaticNoLowat, "static", func(c agentd.Config) bool { return c.SubflowLowat == 0 && !c.SubflowLowatDefault }},
	} {
		if got := scenario.Policy(tc.proc); got != tc.policy {
			t.Errorf("%s: policy %q, want %q", tc.proc, got, tc.policy)
			continue
		}
		if scenario.Label(tc.proc) == "" {
			t.Errorf("%s: no label", tc.proc)
		}
		if _, ok := Procedures()[tc.proc]; !ok {
			t.Errorf("%s: no setup", tc.proc)
		}
		cfg := "socket: /tmp/x.sock\nsubflows: 8\npolicy: " + tc.policy + "\nprobe_interval: 100ms\n" + scenario.AgentExtra(tc.proc)
		c, err := agentd.ParseConfig([]byte(cfg))
		if err != nil {
			t.Errorf("%s: %v\n%s", tc.proc, err, cfg)
			continue
		}
		if !tc.check(c) {
			t.Errorf("%s: config %+v does not switch on what the procedure measures", tc.proc, c)
		}
	}
}
