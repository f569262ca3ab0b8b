package bench

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// The lowat procedures give the agent the static policy and
// subflow_lowat written out; their counterparts give the agent's
// defaults, which have the same limit since it is on by default; every
// one gets a cgroup of this runner's (withLabCgroup). The agent accepts
// every config.
func TestAgentConfigSubflowLowat(t *testing.T) {
	server := netip.MustParseAddrPort("10.0.9.2:5201")
	for proc, want := range map[string]uint32{
		scenario.MPTCPNATStaticLowat:    scenario.SubflowLowatBytes,
		scenario.MPTCPTunnelStaticLowat: scenario.SubflowLowatBytes,
		scenario.MPTCPNATStatic:         agentd.DefaultSubflowLowat,
		scenario.MPTCPTunnelStatic:      agentd.DefaultSubflowLowat,
		scenario.MPTCPNAT:               agentd.DefaultSubflowLowat,
	} {
		env := &Env{Cell: scenario.Cell{ID: proc, Procedure: proc}}
		cfg := agentConfig(env, "/run/x/agent.sock", 1, nil, scenario.AgentExtra(proc), server, server)
		c, err := agentd.ParseConfig([]byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v\n%s", proc, err, cfg)
		}
		// withLabCgroup gives an agent with subflow_lowat and no
		// bpf_cgroup this runner's cgroup.
		if c.SubflowLowat != want || c.BPFCgroup != "" || c.CwndClamp != nil {
			t.Errorf("%s: subflow_lowat %d, bpf_cgroup %q, cwnd_clamp %v; want %d, none, none", proc, c.SubflowLowat, c.BPFCgroup, c.CwndClamp, want)
		}
		if want > 0 && os.Geteuid() == 0 {
			if _, err := bpfclamp.Cgroup2Root(); err == nil {
				got, leave, err := withLabCgroup(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := leave(); err != nil {
					t.Error(err)
				}
				if !strings.Contains(got, "bpf_cgroup: ") || !strings.Contains(got, "/"+cgroupPrefix) {
					t.Errorf("%s: no runner cgroup in\n%s", proc, got)
				}
			}
		}
		if wantPol := scenario.Policy(proc); !strings.Contains(cfg, "policy: "+wantPol+"\n") && wantPol != "" {
			t.Errorf("%s: no policy %q in\n%s", proc, wantPol, cfg)
		}
	}
}
