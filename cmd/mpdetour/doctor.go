package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/doctor"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/relayd"
)

// doctorCommand builds the doctor subcommand.
func doctorCommand() *cli.Command {
	var agentConfig, relayConfig, server, socket string
	var subflows int
	return &cli.Command{
		Name:    "doctor",
		Summary: "check this host for what mpdetour needs (kernel, relay data plane, relays, MPTCP through each detour) and print what to fix",
		Usage:   "[--agent-config FILE [--server HOST:PORT]] [--relay-config FILE] [--subflows N]",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&agentConfig, "agent-config", "", "a client: check every relay of this agent config with a real handshake")
			fs.StringVar(&server, "server", "", "with --agent-config: ask each relay for a detour to this MPTCP server and check that MPTCP options survive the path (the detour is released at once)")
			fs.StringVar(&relayConfig, "relay-config", "", "a relay: check its config, forwarding, nftables and WireGuard")
			fs.IntVar(&subflows, "subflows", 0, "a server: the MPTCP subflow limit it needs (detours per client + 1); 0 = do not judge")
			fs.StringVar(&socket, "socket", agent.DefaultSocket, "a running agent's status socket: its view of the kernel is checked too (blackhole fallback)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("doctor takes no arguments")
			}
			if server != "" && agentConfig == "" {
				return cli.Usagef("doctor: --server needs --agent-config (the relays to ask)")
			}
			if subflows < 0 || subflows > 255 {
				return cli.Usagef("doctor: --subflows %d out of range 0-255", subflows)
			}
			r := doctor.Kernel(doctor.Paths{}, subflows)
			var running *agent.Status
			if st, err := agent.FetchStatus(socket); err == nil {
				running = &st
			}
			r = append(r, doctor.Blackhole(doctor.Paths{}, blackholeOf(running))...)
			// The BPF program's cgroup: the agent config's bpf_cgroup,
			// else the cgroup v2 root (the agent's default).
			var cfg agentd.Config
			var cfgErr error
			if agentConfig != "" {
				cfg, cfgErr = agentd.LoadConfig(agentConfig)
			}
			if why := bpfNotUsed(agentConfig, relayConfig, cfg, cfgErr); why == "" {
				r = append(r, doctor.BPF(cfg.BPFCgroup, bpfclamp.Probe)...)
			} else {
				r = append(r, doctor.Result{Area: "kernel", Check: "BPF program", Status: doctor.Info, Detail: why})
			}
			r = append(r, doctor.RunningAgent(doctor.Paths{}, running)...)
			fi := doctor.FamilyInput{DefaultRoute: doctor.DefaultRoute, Running: running}
			if relayConfig != "" {
				s, err := relayd.LoadConfig(relayConfig)
				if err != nil {
					r = append(r, doctor.Result{Area: "relay", Check: "config", Status: doctor.Fail, Detail: err.Error()})
				} else {
					r = append(r, doctor.Result{Area: "relay", Check: "config", Status: doctor.OK, Detail: relayConfig + " is valid"})
					r = append(r, doctor.RelayHost(doctor.Paths{}, relay.TableName, s.Tunnel != nil, s.Convert.Enabled)...)
				}
			}
			if agentConfig != "" {
				switch {
				case cfgErr != nil:
					r = append(r, doctor.Result{Area: "client", Check: "config", Status: doctor.Fail, Detail: cfgErr.Error()})
				case cfg.Relays == nil:
					r = append(r, doctor.Result{Area: "client", Check: "config", Status: doctor.OK, Detail: agentConfig + " is valid; it has no relays section, nothing to reach"})
				default:
					r = append(r, doctor.Result{Area: "client", Check: "config", Status: doctor.OK, Detail: agentConfig + " is valid"})
					fi.Relays, fi.OtherFamily = []netip.AddrPort{}, len(cfg.Agent.OtherFamily)
					for _, rel := range cfg.Relays.Relays {
						fi.Relays = append(fi.Relays, rel.Addr)
					}
					cc := doctor.ClientConfig{Source: *cfg.Relays}
					cc.Source.Options.ListenPacket = relayconn.ListenIn(cfg.Agent.NetNS)
					if server != "" {
						ap, err := netip.ParseAddrPort(server)
						if err != nil {
							return cli.Usagef("doctor: --server %q is not HOST:PORT (numeric address)", server)
						}
						cc.Server = ap
					}
					r = append(r, doctor.Client(ctx, cc)...)
					r = append(r, doctor.Tunnels(ctx, running, cc.Server, 3*time.Second)...)
				}
			}
			r = append(r, doctor.Families(doctor.Paths{}, fi)...)
			r.Print(os.Stdout)
			if r.Failed() {
				return errors.New("doctor: some checks failed (FAIL lines above say what to fix)")
			}
			fmt.Println("doctor: no failed check")
			return nil
		},
	}
}

// blackholeOf is the running agent's blackhole view (nil without agent).
func blackholeOf(st *agent.Status) *agent.BlackholeStatus {
	if st == nil {
		return nil
	}
	return st.Blackhole
}

// bpfNotUsed says why doctor does not probe the agent's BPF program, ""
// when it does: with --agent-config when the file uses it (or is
// invalid), without one unless only --relay-config is given (a relay
// host runs no agent).
func bpfNotUsed(agentConfig, relayConfig string, cfg agentd.Config, cfgErr error) string {
	switch {
	case agentConfig == "" && relayConfig != "":
		return "no --agent-config (a relay host): the agent's BPF program is not checked"
	case agentConfig == "" || cfgErr != nil || cfg.SubflowLowat > 0 || cfg.CwndClamp != nil || cfg.SubflowPacing:
		return ""
	case cfg.SubflowLowatDefault:
		return agentConfig + " is a server-role-only agent without subflow_lowat (off by default there) and no cwnd_clamp: the agent loads no BPF program"
	}
	return agentConfig + " has subflow_lowat: 0 (off) and no cwnd_clamp: the agent loads no BPF program"
}
