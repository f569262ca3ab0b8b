package bench

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// The lowat procedures give the agent the static policy and
// subflow_lowat (so a cgroup of this runner's, usesBPF); their
// counterparts without the limit give the static policy and no BPF
// program. The agent accepts every config.
func TestAgentConfigSubflowLowat(t *testing.T) {
	server := netip.MustParseAddrPort("10.0.9.2:5201")
	for proc, want := range map[string]uint32{
		scenario.MPTCPNATStaticLowat:    scenario.SubflowLowatBytes,
		scenario.MPTCPTunnelStaticLowat: scenario.SubflowLowatBytes,
		scenario.MPTCPNATStatic:         0,
		scenario.MPTCPTunnelStatic:      0,
		scenario.MPTCPNAT:               0,
	} {
		env := &Env{Cell: scenario.Cell{ID: proc, Procedure: proc}}
		cfg := agentConfig(env, "/run/x/agent.sock", 1, nil, "", server, server)
		if got := usesBPF(cfg); got != (want > 0) {
			t.Errorf("%s: usesBPF = %v, want %v\n%s", proc, got, want > 0, cfg)
		}
		if want > 0 {
			cfg += "bpf_cgroup: /sys/fs/cgroup/" + cgroupPrefix + "1\n"
		}
		c, err := agentd.ParseConfig([]byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v\n%s", proc, err, cfg)
		}
		if c.SubflowLowat != want {
			t.Errorf("%s: subflow_lowat %d, want %d", proc, c.SubflowLowat, want)
		}
		if wantPol := scenario.Policy(proc); !strings.Contains(cfg, "policy: "+wantPol+"\n") && wantPol != "" {
			t.Errorf("%s: no policy %q in\n%s", proc, wantPol, cfg)
		}
	}
}
