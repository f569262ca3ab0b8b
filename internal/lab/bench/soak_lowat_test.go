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

// The soak's agent carries SoakOptions.SubflowLowat as subflow_lowat
// (with its policy), and only then gets this runner's lab cgroup for its
// BPF program; without it, no limit and no BPF program. The agent
// accepts every config.
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
		env := &Env{Cell: scenario.Cell{Procedure: "soak"}}
		// The relays section as relays.agentSection writes it.
		section := fmt.Sprintf("relays:\n  key: %s\n  servers:\n    - {name: detour1, address: '10.0.1.2:%d', public_key: %s, backup: false}\n",
			member, relay.DefaultPort, relayKey.Public())
		cfg := agentConfig(env, "/run/x/agent.sock", soakSubflows, nil, section+soakAgentExtra(o), server, server)
		c, err := agentd.ParseConfig([]byte(cfg))
		if err != nil {
			t.Fatalf("%+v: %v\n%s", o, err, cfg)
		}
		if int(c.SubflowLowat) != o.SubflowLowat || c.BPFCgroup != "" || c.CwndClamp != nil {
			t.Errorf("%+v: subflow_lowat %d, bpf_cgroup %q, cwnd_clamp %v; want %d, none, none", o, c.SubflowLowat, c.BPFCgroup, c.CwndClamp, o.SubflowLowat)
		}
		if o.Policy != "" && !strings.Contains(cfg, "policy: "+o.Policy+"\n") {
			t.Errorf("%+v: no policy in\n%s", o, cfg)
		}
		if os.Geteuid() != 0 {
			continue
		}
		if _, err := bpfclamp.Cgroup2Root(); err != nil {
			continue
		}
		got, leave, err := withLabCgroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := leave(); err != nil {
			t.Error(err)
		}
		if has := strings.Contains(got, "bpf_cgroup: ") && strings.Contains(got, "/"+cgroupPrefix); has != (o.SubflowLowat != 0) {
			t.Errorf("%+v: runner cgroup %v, want %v, in\n%s", o, has, o.SubflowLowat != 0, got)
		}
	}
}
