package bench

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
)

// The lowat procedures give the agent the static policy and
// subflow_lowat written out; their counterparts give the agent's
// defaults, which have the same limit since it is on by default; every
// one gets a cgroup of this runner's (withLabCgroup), never the cgroup v2
// root. The -nolowat ones write subflow_lowat: 0 (the old default) and
// get no cgroup (no program). The agent accepts every config.
func TestAgentConfigSubflowLowat(t *testing.T) {
	server := netip.MustParseAddrPort("10.0.9.2:5201")
	for proc, want := range map[string]uint32{
		scenario.MPTCPNATStaticLowat:       scenario.SubflowLowatBytes,
		scenario.MPTCPTunnelStaticLowat:    scenario.SubflowLowatBytes,
		scenario.MPTCPNATBackupStaticLowat: scenario.SubflowLowatBytes,
		scenario.MPTCPNATBackupStatic:      agentd.DefaultSubflowLowat,
		scenario.MPTCPNATStatic:            agentd.DefaultSubflowLowat,
		scenario.MPTCPTunnelStatic:         agentd.DefaultSubflowLowat,
		scenario.MPTCPNAT:                  agentd.DefaultSubflowLowat,
		scenario.MPTCPNATStaticNoLowat:     0,
		scenario.MPTCPTunnelStaticNoLowat:  0,
		scenario.MPTCPNATStaticLowatRTT:    scenario.SubflowLowatBytes,
		scenario.MPTCPTunnelStaticLowatRTT: scenario.SubflowLowatBytes,
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
		checkLabCgroup(t, proc, cfg, want > 0)
		if wantPol := scenario.Policy(proc); !strings.Contains(cfg, "policy: "+wantPol+"\n") && wantPol != "" {
			t.Errorf("%s: no policy %q in\n%s", proc, wantPol, cfg)
		}
	}
}

// checkLabCgroup checks (as root, with cgroup v2) that withLabCgroup
// gives cfg this runner's cgroup as bpf_cgroup if and only if want.
func checkLabCgroup(t *testing.T, name, cfg string, want bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	if _, err := bpfclamp.Cgroup2Root(); err != nil {
		return
	}
	got, leave, err := withLabCgroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := leave(); err != nil {
		t.Error(err)
	}
	if has := strings.Contains(got, "bpf_cgroup: ") && strings.Contains(got, "/"+cgroupPrefix); has != want {
		t.Errorf("%s: runner cgroup %v, want %v, in\n%s", name, has, want, got)
	}
}

// The soak's agent carries SoakOptions.SubflowLowat as subflow_lowat
// (with its policy), and only then gets this runner's lab cgroup for its
// BPF program; with 0 (written out: the limit is on by default), no limit
// and no BPF program. The agent accepts every config.
func TestSoakAgentConfigSubflowLowat(t *testing.T) {
	server := netip.MustParseAddrPort("10.0.9.2:5201")
	member, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	relayKey, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []SoakOptions{
		{Policy: "static", SubflowLowat: scenario.SubflowLowatBytes},
		{Policy: "static"},
		{SubflowLowat: 1 << 20},
		{},
	} {
		name := fmt.Sprintf("soak policy %q subflow_lowat %d", o.Policy, o.SubflowLowat)
		env := &Env{Cell: scenario.Cell{Procedure: "soak"}}
		// The relays section as relays.agentSection writes it.
		section := fmt.Sprintf("relays:\n  key: %s\n  servers:\n    - {name: detour1, address: '10.0.1.2:%d', public_key: %s, backup: false}\n",
			member, relay.DefaultPort, relayKey.Public())
		cfg := agentConfig(env, "/run/x/agent.sock", soakSubflows, nil, section+soakAgentExtra(o), server, server)
		c, err := agentd.ParseConfig([]byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, cfg)
		}
		if int(c.SubflowLowat) != o.SubflowLowat || c.BPFCgroup != "" || c.CwndClamp != nil {
			t.Errorf("%s: subflow_lowat %d, bpf_cgroup %q, cwnd_clamp %v; want %d, none, none", name, c.SubflowLowat, c.BPFCgroup, c.CwndClamp, o.SubflowLowat)
		}
		if o.Policy != "" && !strings.Contains(cfg, "policy: "+o.Policy+"\n") {
			t.Errorf("%s: no policy in\n%s", name, cfg)
		}
		checkLabCgroup(t, name, cfg, o.SubflowLowat != 0)
	}
}
