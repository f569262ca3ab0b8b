// Package scenario defines the benchmark scenario file read by
// `mpdetour-lab bench`: which topology to build, which link configurations
// to apply to it, which measurement procedures to run in each, how many
// trials, and the targets the report checks. The format is documented in
// docs/bench.md; every validation error names the file and the field.
package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mpdetour/mpdetour/internal/config"
)

// Procedure names. Each is one way of moving bytes from client to server.
const (
	TCP = "tcp" // plain TCP over the default path
	// TCP6 is plain TCP over the default path's IPv6 (a lab of family
	// dual or 6: topology parameter family).
	TCP6 = "tcp6"
	// tcp-nat and mptcp-nat over IPv6: IPv6 relays, IPv6 NAT detours,
	// an IPv6 connection.
	TCPNAT6   = "tcp-nat6"
	MPTCPNAT6 = "mptcp-nat6"
	// tcp-tunnel and mptcp-tunnel over IPv6: WireGuard over IPv6 to
	// relays with an IPv6 tunnel subnet, IPv6 inside the tunnel.
	TCPTunnel6   = "tcp-tunnel6"
	MPTCPTunnel6 = "mptcp-tunnel6"
	// MPTCPCross: a connection that starts on IPv4 (the default path,
	// from an AF_INET6 socket) and adds IPv6 NAT detour subflows (the
	// agent maps the server's IPv4 address to its IPv6 one).
	MPTCPCross = "mptcp-cross"
	TCPNAT     = "tcp-nat"    // plain TCP to a relay's NAT port
	TCPTunnel  = "tcp-tunnel" // plain TCP through a WireGuard tunnel detour
	MPTCP1     = "mptcp-1sf"  // MPTCP, no detour (MPTCP's own overhead)
	// MPTCP1NAT is MPTCP over one NAT detour alone, no agent: MPTCP's own
	// cost on the detour's path (design procedure mptcp-1sf there).
	MPTCP1NAT   = "mptcp-1sf-nat"
	MPTCPNAT    = "mptcp-nat"    // MPTCP, default path + NAT detour subflow(s)
	MPTCPTunnel = "mptcp-tunnel" // MPTCP, default path + tunnel detour subflow(s)
	TCPOpenVPN  = "tcp-openvpn"  // plain TCP through an OpenVPN tunnel (baseline)
	// The unencrypted VXLAN tunnel kind (opt-in, trusted networks).
	TCPEncap   = "tcp-encap"   // plain TCP through a VXLAN tunnel detour
	MPTCPEncap = "mptcp-encap" // MPTCP, default path + VXLAN tunnel detour subflow(s)
	// tcp-encap and mptcp-encap over IPv6: VXLAN over IPv6 to relays with
	// a vxlan subnet6, IPv6 inside the tunnel.
	TCPEncap6   = "tcp-encap6"
	MPTCPEncap6 = "mptcp-encap6"
	// The same as mptcp-nat and mptcp-tunnel with the agent's policy named,
	// so that one run compares the policies side by side.
	MPTCPNATStatic      = "mptcp-nat-static"
	MPTCPNATAdaptive    = "mptcp-nat-adaptive"
	MPTCPTunnelStatic   = "mptcp-tunnel-static"
	MPTCPTunnelAdaptive = "mptcp-tunnel-adaptive"
	// backup-first: detours join as backup, carry data once
	// the measurements say they help.
	MPTCPNATBackupFirst    = "mptcp-nat-backup-first"
	MPTCPTunnelBackupFirst = "mptcp-tunnel-backup-first"
	// The static policy with the agent's cwnd clamps of tunnel subflows
	// (cwnd_clamp: enabled, docs/agent.md).
	MPTCPTunnelStaticClamp = "mptcp-tunnel-static-clamp"
	// The same with the clamp's pacing mode (cwnd_clamp: mode: pacing), and
	// with both a cwnd clamp and a pacing rate (mode: both).
	MPTCPTunnelStaticPacing    = "mptcp-tunnel-static-pacing"
	MPTCPTunnelStaticClampBoth = "mptcp-tunnel-static-clamp-both"
	// The static policy with shared-bottleneck detection
	// (shared_bottleneck: enabled, docs/agent.md).
	MPTCPTunnelStaticSBD = "mptcp-tunnel-static-sbd"
	// The same rules over NAT detours: the static policy with
	// shared-bottleneck detection, and the guard policy (docs/agent.md "The
	// guard policy") with its default starvation condition and without it
	// (guard.starve: 1, the rule of results/design/harm).
	MPTCPNATStaticSBD      = "mptcp-nat-static-sbd"
	MPTCPNATGuard          = "mptcp-nat-guard"
	MPTCPNATGuardStarveOff = "mptcp-nat-guard-starveoff"
	// The cell's detours as backups (relays marked backup: true): the
	// default path carries the data while it works.
	MPTCPNATBackupStatic   = "mptcp-nat-backup-static"
	MPTCPNATBackupAdaptive = "mptcp-nat-backup-adaptive"
	// Converted: a plain TCP program under "mpdetour run" whose server
	// does not speak MPTCP, through the converter in roles.converter
	// (docs/convert.md) and the cell's NAT detours to the converter.
	Converted = "converted"
	// ConvertedDirect: the same through the converter without detours
	// (one subflow to the converter): the converter's own cost, e.g. its
	// throughput beside plain routing (scenario converter-speed).
	ConvertedDirect = "converted-1sf"
	// A client without agent (in-kernel PM) and the server's agent (server
	// role) announcing each detour node's waypoint with ADD_ADDR.
	Announced = "announced"
	// Load balancer (topology loadbalancer): 100 connections to the
	// service address across 16 anycast route changes, the backends
	// without / with the server role (C flag, unique address and detour
	// announced); one bulk transfer to the service with the server role.
	LBConnections          = "lb-connections"
	LBConnectionsAnnounced = "lb-connections-announced"
	LBConnectionsNoCFlag   = "lb-connections-no-cflag"
	LBBulkAnnounced        = "lb-bulk-announced"
	// Collective (topology collective, docs/collective.md): relays with gossip
	// (roles.detours), agents on roles.clients that know one bootstrap
	// relay each; times to discover relays and add detour subflows through
	// them, then to drop a relay killed with SIGKILL and replace its
	// detours.
	Collective = "collective"
)

// The static policy with the agent's per-subflow unsent limit written
// out (subflow_lowat: SubflowLowatBytes, agentd.DefaultSubflowLowat,
// docs/agent.md) over NAT and tunnel detours, beside mptcp-nat-static and
// mptcp-tunnel-static; and with the NAT detours as backups, beside
// mptcp-nat-backup-static. The plain names run the agent's defaults,
// which have the same limit since it is on by default; the -lowat names
// stay for the reports that measured them while it was off. The
// -nolowat procedures write subflow_lowat: 0: the static policy without
// the limit, what the plain names measured before the default changed
// (the arm to compare the limit against).
const (
	MPTCPNATStaticLowat       = "mptcp-nat-static-lowat"
	MPTCPTunnelStaticLowat    = "mptcp-tunnel-static-lowat"
	MPTCPNATBackupStaticLowat = "mptcp-nat-backup-static-lowat"
	MPTCPNATStaticNoLowat     = "mptcp-nat-static-nolowat"
	MPTCPTunnelStaticNoLowat  = "mptcp-tunnel-static-nolowat"
	// The -lowatrtt procedures are the -lowat ones with the limit scaled
	// to the subflows' RTTs (subflow_lowat_scale: rtt,
	// SubflowLowatBytes its floor; docs/agent.md).
	MPTCPNATStaticLowatRTT    = "mptcp-nat-static-lowatrtt"
	MPTCPTunnelStaticLowatRTT = "mptcp-tunnel-static-lowatrtt"
	// SubflowLowatBytes is the limit these procedures set: the value the
	// design runs use (docs/results/design/lowat), not tuned per scenario.
	SubflowLowatBytes = 131072
)

// procInfo says what a procedure needs and how it is labelled in reports.
type procInfo struct {
	label string
	// detours: 0 = uses none, 1 = exactly one, -1 = one or more (default all).
	detours int
	// single is, for an MPTCP procedure, the single-path procedure over one
	// of its detours; ratios compare against it.
	single string
}

var procs = map[string]procInfo{
	TCP:          {"TCP", 0, ""},
	TCP6:         {"TCP over IPv6", 0, ""},
	TCPNAT6:      {"TCP via NAT detour, IPv6", 1, ""},
	MPTCPNAT6:    {"MPTCP + NAT detour, IPv6", -1, TCPNAT6},
	MPTCPCross:   {"MPTCP on IPv4 + IPv6 NAT detour", -1, TCPNAT6},
	TCPTunnel6:   {"TCP via tunnel detour, IPv6", 1, ""},
	MPTCPTunnel6: {"MPTCP + tunnel detour, IPv6", -1, TCPTunnel6},
	TCPNAT:       {"TCP via NAT detour", 1, ""},
	TCPTunnel:    {"TCP via tunnel detour", 1, ""},
	MPTCP1:       {"MPTCP 1 subflow", 0, ""},
	MPTCP1NAT:    {"MPTCP 1 subflow via NAT detour", 1, ""},
	MPTCPNAT:     {"MPTCP + NAT detour", -1, TCPNAT},
	MPTCPTunnel:  {"MPTCP + tunnel detour", -1, TCPTunnel},
	TCPOpenVPN:   {"TCP via OpenVPN", 1, ""},
	TCPEncap:     {"TCP via VXLAN tunnel detour (unencrypted)", 1, ""},
	MPTCPEncap:   {"MPTCP + VXLAN tunnel detour (unencrypted)", -1, TCPEncap},
	TCPEncap6:    {"TCP via VXLAN tunnel detour (unencrypted), IPv6", 1, ""},
	MPTCPEncap6:  {"MPTCP + VXLAN tunnel detour (unencrypted), IPv6", -1, TCPEncap6},

	MPTCPNATStatic:             {"MPTCP + NAT detour, static policy", -1, TCPNAT},
	MPTCPNATAdaptive:           {"MPTCP + NAT detour, adaptive policy", -1, TCPNAT},
	MPTCPTunnelStatic:          {"MPTCP + tunnel detour, static policy", -1, TCPTunnel},
	MPTCPTunnelAdaptive:        {"MPTCP + tunnel detour, adaptive policy", -1, TCPTunnel},
	MPTCPNATBackupFirst:        {"MPTCP + NAT detour, backup-first policy", -1, TCPNAT},
	MPTCPTunnelBackupFirst:     {"MPTCP + tunnel detour, backup-first policy", -1, TCPTunnel},
	MPTCPTunnelStaticClamp:     {"MPTCP + tunnel detour, static policy, cwnd clamps", -1, TCPTunnel},
	MPTCPTunnelStaticPacing:    {"MPTCP + tunnel detour, static policy, pacing clamps", -1, TCPTunnel},
	MPTCPTunnelStaticClampBoth: {"MPTCP + tunnel detour, static policy, cwnd and pacing clamps", -1, TCPTunnel},
	MPTCPTunnelStaticSBD:       {"MPTCP + tunnel detour, static policy, shared-bottleneck detection", -1, TCPTunnel},
	MPTCPNATStaticSBD:          {"MPTCP + NAT detour, static policy, shared-bottleneck detection", -1, TCPNAT},
	MPTCPNATGuard:              {"MPTCP + NAT detour, guard policy", -1, TCPNAT},
	MPTCPNATGuardStarveOff:     {"MPTCP + NAT detour, guard policy without the starvation condition (guard.starve: 1)", -1, TCPNAT},

	MPTCPNATBackupStatic:   {"MPTCP + backup NAT detour, static policy", -1, TCPNAT},
	MPTCPNATBackupAdaptive: {"MPTCP + backup NAT detour, adaptive policy", -1, TCPNAT},

	Converted:       {"TCP program under run, via converter + NAT detour", -1, ""},
	ConvertedDirect: {"TCP program under run, via converter (no detour)", 0, ""},
	Announced:       {"MPTCP + detour announced by the server (client without agent)", -1, TCPNAT},

	LBConnections:          {"100 connections via the balancer, 16 route changes, backends as they are", 0, ""},
	LBConnectionsAnnounced: {"100 connections via the balancer, 16 route changes, backends with the server role", -1, ""},
	LBConnectionsNoCFlag:   {"100 connections via the balancer, 16 route changes, server role without the C flag", -1, ""},
	LBBulkAnnounced:        {"MPTCP via the balancer, backends with the server role", -1, ""},

	Collective: {"Discovery from one bootstrap relay, a relay killed", -1, ""},

	MPTCPNATStaticLowat:    {"MPTCP + NAT detour, static policy, subflow unsent limit", -1, TCPNAT},
	MPTCPTunnelStaticLowat: {"MPTCP + tunnel detour, static policy, subflow unsent limit", -1, TCPTunnel},

	MPTCPNATBackupStaticLowat: {"MPTCP + backup NAT detour, static policy, subflow unsent limit", -1, TCPNAT},

	MPTCPNATStaticNoLowat:    {"MPTCP + NAT detour, static policy, no subflow unsent limit", -1, TCPNAT},
	MPTCPTunnelStaticNoLowat: {"MPTCP + tunnel detour, static policy, no subflow unsent limit", -1, TCPTunnel},

	MPTCPNATStaticLowatRTT:    {"MPTCP + NAT detour, static policy, subflow unsent limit scaled to the RTTs", -1, TCPNAT},
	MPTCPTunnelStaticLowatRTT: {"MPTCP + tunnel detour, static policy, subflow unsent limit scaled to the RTTs", -1, TCPTunnel},
}

// Policy is the agent policy a procedure names ("" = the agent's default).
func Policy(procedure string) string {
	switch procedure {
	case MPTCPNATStatic, MPTCPTunnelStatic, MPTCPNATBackupStatic, MPTCPTunnelStaticClamp, MPTCPTunnelStaticPacing, MPTCPTunnelStaticClampBoth, MPTCPTunnelStaticSBD, MPTCPNATStaticSBD:
		return "static"
	case MPTCPNATAdaptive, MPTCPTunnelAdaptive, MPTCPNATBackupAdaptive:
		return "adaptive"
	case MPTCPNATBackupFirst, MPTCPTunnelBackupFirst:
		return "backup-first"
	case MPTCPNATGuard, MPTCPNATGuardStarveOff:
		return "guard"
	case MPTCPNATStaticLowat, MPTCPTunnelStaticLowat, MPTCPNATBackupStaticLowat, MPTCPNATStaticNoLowat, MPTCPTunnelStaticNoLowat,
		MPTCPNATStaticLowatRTT, MPTCPTunnelStaticLowatRTT:
		return "static"
	}
	return ""
}

// SubflowLowat is the agent's subflow_lowat (bytes) a -lowat or
// -lowatrtt procedure writes out (of -lowatrtt, the floor), 0 for the
// others (the agent's default then applies: on, agentd.DefaultSubflowLowat;
// the -nolowat procedures write subflow_lowat: 0, AgentExtra).
func SubflowLowat(procedure string) int {
	switch procedure {
	case MPTCPNATStaticLowat, MPTCPTunnelStaticLowat, MPTCPNATBackupStaticLowat, MPTCPNATStaticLowatRTT, MPTCPTunnelStaticLowatRTT:
		return SubflowLowatBytes
	}
	return 0
}

// ClosesSubflows: the procedure's agent may destroy a detour subflow on
// purpose (shared-bottleneck detection, guard's shed rule), so a trial
// that ends with fewer subflows than it opened is still a measurement of
// it.
func ClosesSubflows(procedure string) bool {
	switch procedure {
	case MPTCPTunnelStaticSBD, MPTCPNATStaticSBD, MPTCPNATGuard, MPTCPNATGuardStarveOff:
		return true
	}
	return false
}

// AgentExtra is the agent configuration a procedure adds to its policy
// (the mechanism it measures), "" for none.
func AgentExtra(procedure string) string {
	switch procedure {
	case MPTCPTunnelStaticClamp:
		return "cwnd_clamp:\n  enabled: true\n"
	case MPTCPTunnelStaticPacing:
		return "cwnd_clamp:\n  enabled: true\n  mode: pacing\n"
	case MPTCPTunnelStaticClampBoth:
		return "cwnd_clamp:\n  enabled: true\n  mode: both\n"
	case MPTCPTunnelStaticSBD, MPTCPNATStaticSBD:
		return "shared_bottleneck:\n  enabled: true\n"
	case MPTCPNATGuardStarveOff:
		return "guard:\n  starve: 1\n"
	case MPTCPNATStaticLowat, MPTCPTunnelStaticLowat, MPTCPNATBackupStaticLowat:
		// The agent's BPF program writes the limit; the runner gives it
		// a cgroup of its own (bench.withLabCgroup).
		return fmt.Sprintf("subflow_lowat: %d\n", SubflowLowat(procedure))
	case MPTCPNATStaticLowatRTT, MPTCPTunnelStaticLowatRTT:
		// The same program; the agent measures the subflows for it.
		return fmt.Sprintf("subflow_lowat: %d\nsubflow_lowat_scale: rtt\n", SubflowLowat(procedure))
	case MPTCPNATStaticNoLowat, MPTCPTunnelStaticNoLowat:
		return "subflow_lowat: 0\n"
	}
	return ""
}

// EqualArms lists the pairs among names that run the same agent
// configuration since the limit is on by default: a plain static
// procedure and its -lowat one. A run of both compares two equal arms
// (paired ratios near 1); the arm without the limit is -nolowat
// (subflow_lowat: 0 written out).
func EqualArms(names []string) []string {
	has := map[string]bool{}
	for _, n := range names {
		has[n] = true
	}
	var out []string
	for _, p := range [][3]string{
		{MPTCPNATStatic, MPTCPNATStaticLowat, MPTCPNATStaticNoLowat},
		{MPTCPTunnelStatic, MPTCPTunnelStaticLowat, MPTCPTunnelStaticNoLowat},
		{MPTCPNATBackupStatic, MPTCPNATBackupStaticLowat, ""},
	} {
		if has[p[0]] && has[p[1]] {
			m := fmt.Sprintf("%s and %s run the same agent configuration (subflow_lowat %d is the default)", p[0], p[1], SubflowLowatBytes)
			if p[2] != "" {
				m += "; the arm without the limit is " + p[2]
			}
			out = append(out, m)
		}
	}
	return out
}

// ProcedureNames lists every known procedure in report order.
func ProcedureNames() []string {
	return []string{MPTCP1, MPTCP1NAT, MPTCPNAT, MPTCPNAT6, MPTCPCross, MPTCPNATStatic, MPTCPNATAdaptive, MPTCPNATBackupFirst, MPTCPNATStaticSBD, MPTCPNATGuard, MPTCPNATGuardStarveOff, MPTCPNATBackupStatic, MPTCPNATBackupAdaptive, MPTCPTunnel, MPTCPTunnelStatic, MPTCPTunnelAdaptive, MPTCPTunnelBackupFirst, MPTCPTunnelStaticClamp, MPTCPTunnelStaticPacing, MPTCPTunnelStaticClampBoth, MPTCPTunnelStaticSBD, MPTCPTunnel6,
		MPTCPNATStaticLowat, MPTCPTunnelStaticLowat, MPTCPNATBackupStaticLowat, MPTCPNATStaticNoLowat, MPTCPTunnelStaticNoLowat,
		MPTCPNATStaticLowatRTT, MPTCPTunnelStaticLowatRTT,
		Converted, ConvertedDirect, Announced, Collective, LBBulkAnnounced, LBConnections, LBConnectionsAnnounced, LBConnectionsNoCFlag, MPTCPEncap, MPTCPEncap6, TCP, TCP6, TCPNAT, TCPNAT6, TCPTunnel, TCPTunnel6, TCPEncap, TCPEncap6, TCPOpenVPN}
}

// Label is the human name of procedure name ("" if unknown).
func Label(name string) string { return procs[name].label }

// SinglePath returns the single-path procedure an MPTCP detour procedure
// aggregates with the default path (tcp-nat for mptcp-nat), or "".
func SinglePath(name string) string { return procs[name].single }

// DefaultPath is the single-path procedure over the default path that
// procedure name is compared against: tcp6 for the IPv6 procedures, else
// tcp.
func DefaultPath(name string) string {
	switch name {
	case TCPNAT6, MPTCPNAT6, TCPTunnel6, MPTCPTunnel6, TCPEncap6, MPTCPEncap6:
		return TCP6
	}
	return TCP
}

// Ratio kinds a target can check; see docs/bench.md.
const (
	RatioSum     = "sum"     // g / (g(tcp) + sum of g(single path via each detour))
	RatioTCP     = "tcp"     // g / g(tcp)
	RatioBest    = "best"    // g / max(g(tcp), g(single path via each detour))
	RatioBenefit = "benefit" // aggregation benefit Ben, see stats.Benefit
	// Any other procedure name P: g / g(P) in the same configuration (e.g.
	// tcp-tunnel over tcp-openvpn).
)

var ratios = map[string]bool{RatioSum: true, RatioTCP: true, RatioBest: true, RatioBenefit: true}

// Duration is the config layer's duration ("10s", "500ms").
type Duration = config.Duration

// Param is one lab parameter, as for `lab up --set KEY=VALUE`.
type Param struct{ Key, Value string }

// Params keeps the file's order: later keys override earlier ones in the
// lab (a profile first, then a per-link change).
type Params []Param

// UnmarshalYAML reads a mapping of scalars in document order.
func (p *Params) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a mapping of KEY: VALUE", n.Line)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			return fmt.Errorf("line %d: parameter name must be a non-empty string", k.Line)
		}
		if v.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: parameter %q: value must be a single value such as 1%% or 100ms", v.Line, k.Value)
		}
		if seen[k.Value] {
			return fmt.Errorf("line %d: parameter %q given twice", k.Line, k.Value)
		}
		if strings.ContainsAny(k.Value, "= \t\n") {
			return fmt.Errorf("line %d: parameter name %q must not contain '=' or spaces", k.Line, k.Value)
		}
		seen[k.Value] = true
		*p = append(*p, Param{k.Value, v.Value})
	}
	return nil
}

// MarshalYAML writes the parameters as a mapping in order.
func (p Params) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, kv := range p {
		n.Content = append(n.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Value: kv.Key},
			&yaml.Node{Kind: yaml.ScalarNode, Value: kv.Value, Style: yaml.DoubleQuotedStyle})
	}
	return n, nil
}

// Strings renders the parameters as KEY=VALUE.
func (p Params) Strings() []string {
	var s []string
	for _, kv := range p {
		s = append(s, kv.Key+"="+kv.Value)
	}
	return s
}

// Roles names the lab nodes the procedures use.
type Roles struct {
	Client  string   `yaml:"client"`
	Server  string   `yaml:"server"`
	Detours []string `yaml:"detours"`
	// Converter is the node whose relay runs the converter (procedure
	// converted).
	Converter string `yaml:"converter,omitempty"`
	// Clients are the member nodes of procedure collective, each running
	// an agent (default: [client]).
	Clients []string `yaml:"clients,omitempty"`
}

// ProcedureSpec is one entry of a procedures list: a name, or a mapping
// {procedure: NAME, detour: NODE|each|all}.
type ProcedureSpec struct {
	Procedure string `yaml:"procedure"`
	// Detour picks the detour node(s): a node name, "each" (single-path
	// procedures: one cell per detour) or "all" (MPTCP: one subflow via
	// every detour, the default). Empty = the procedure's default.
	Detour string `yaml:"detour"`
	// Subflows is the agent's `subflows` (K, the detour subflows kept per
	// connection) for an MPTCP procedure through detours; 0 = one per
	// detour of the cell.
	Subflows int `yaml:"subflows"`
}

// UnmarshalYAML accepts the short form "tcp" as well as the mapping.
func (s *ProcedureSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		s.Procedure = n.Value
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a procedure name or {procedure: NAME, detour: NODE}", n.Line)
	}
	type plain ProcedureSpec
	var p plain
	if err := decodeStrict(n, &p); err != nil {
		return err
	}
	*s = ProcedureSpec(p)
	return nil
}

// Configuration is one set of link parameters applied to the topology.
type Configuration struct {
	Name   string `yaml:"name"`
	Label  string `yaml:"label"`
	Set    Params `yaml:"set"`
	Trials int    `yaml:"trials,omitempty"` // 0 = the scenario's
	Roles  *Roles `yaml:"roles,omitempty"`  // nil = the scenario's
	// Procedures, if given, replaces the scenario's list for this
	// configuration. omitempty: the "scenario as run" file a run writes
	// must run the same cells again.
	Procedures []ProcedureSpec `yaml:"procedures,omitempty"`
	// Fault, if given, black-holes a link during every trial.
	Fault *Fault `yaml:"fault,omitempty"`
	// Attack, if given, runs an attack of the lab's attack suite
	// (internal/lab/attack) during every trial.
	Attack *Attack `yaml:"attack,omitempty"`
	// Flow, if given, makes every trial a series of flows of one size,
	// measured by their completion time instead of a timed transfer.
	Flow *Flow `yaml:"flow,omitempty"`
}

// Flow is the flow-completion-time measurement of a configuration (the
// rack scenario): each trial sends Flows flows of Size bytes one after the
// other (default 1), each on a new connection, optionally while a plain
// TCP bulk transfer from the client to the server (Background) loads the
// default path.
type Flow struct {
	Size       ByteSize `yaml:"size"`
	Flows      int      `yaml:"flows"`
	Background bool     `yaml:"background"`
}

// ByteSize is a byte count written with a decimal unit: "15KB", "1MB",
// "100MB", "1500" (bytes); KB = 1000 bytes, MB = 10^6, GB = 10^9.
type ByteSize int64

// ParseByteSize parses a ByteSize.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	var n int64
	if _, err := fmt.Sscanf(t, "%d", &n); err != nil || fmt.Sprint(n) != t {
		return 0, fmt.Errorf("bad size %q: want a whole number with an optional unit B, KB, MB or GB (e.g. 15KB)", s)
	}
	if n <= 0 || n > 10e9/mult {
		return 0, fmt.Errorf("bad size %q: must be between 1 byte and 10GB", s)
	}
	return ByteSize(n * mult), nil
}

// String writes the size with the largest unit that divides it.
func (b ByteSize) String() string {
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}} {
		if int64(b) >= u.m && int64(b)%u.m == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.m, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", int64(b))
}

// UnmarshalYAML reads "15KB" or a bare number of bytes.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a size such as 15KB", n.Line)
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*b = v
	return nil
}

// MarshalYAML writes the size with its unit.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

// Attack is one attack of the suite during every trial of a configuration:
// Kind (none, join-flood, join-hmac, add-addr, remove-addr, stolen-keys,
// syn-flood, join-redirect, join-masquerade) sent from the
// node From at Rate packets (or injections) per second, while a prober
// opens Probes genuine MPTCP connections per second from the client.
type Attack struct {
	Kind   string `yaml:"kind"`
	From   string `yaml:"from"`
	Rate   int    `yaml:"rate"`
	Probes int    `yaml:"probes"`
}

// AttackKinds are the kinds an attack may name (internal/lab/attack.Kinds).
var AttackKinds = []string{"none", "join-flood", "join-hmac", "add-addr", "remove-addr", "stolen-keys", "syn-flood", "join-redirect", "join-masquerade"}

// Fault black-holes a lab link (both directions, every packet dropped
// where the link leaves its first node) from At after the transfer starts,
// for For (0: until the end): failover scenarios.
type Fault struct {
	Link string   `yaml:"link"`
	At   Duration `yaml:"at"`
	For  Duration `yaml:"for"`
}

// Target is a ratio the report checks, e.g. core-limited mptcp-nat sum >= 0.99.
type Target struct {
	Configuration string  `yaml:"configuration"`
	Procedure     string  `yaml:"procedure"`
	Ratio         string  `yaml:"ratio"`
	Min           float64 `yaml:"min"`
	Note          string  `yaml:"note"`
}

// Reference holds published numbers to print beside ours.
type Reference struct {
	Source string `yaml:"source"`
	// Results maps configuration -> procedure -> [mean, sd] in Mbit/s.
	Results map[string]map[string][]float64 `yaml:"results"`
}

// Scenario is a parsed, validated scenario file.
type Scenario struct {
	Name        string   `yaml:"name"`
	Description string   `yaml:"description"`
	Topology    string   `yaml:"topology"`
	Roles       Roles    `yaml:"roles"`
	Trials      int      `yaml:"trials"`
	Duration    Duration `yaml:"duration"`
	Warmup      Duration `yaml:"warmup"`
	CC          string   `yaml:"cc"`
	// Direction of the transfers: upload (client sends, the default) or
	// download (the server sends, the client counts).
	Direction string `yaml:"direction"`
	// ServerMPTCP false disables MPTCP in the server node
	// (net.mptcp.enabled=0) and serves plain TCP: a server that does not
	// speak MPTCP (scenario converter). Default true.
	ServerMPTCP    *bool           `yaml:"server_mptcp,omitempty"`
	Set            Params          `yaml:"set"`
	Configurations []Configuration `yaml:"configurations"`
	Procedures     []ProcedureSpec `yaml:"procedures"`
	Targets        []Target        `yaml:"targets"`
	Reference      *Reference      `yaml:"reference"`

	// Source is where the scenario came from (file path or "builtin:NAME").
	Source string `yaml:"-"`
}

// Cell is one (configuration, procedure) pair of the plan.
type Cell struct {
	Configuration string
	// ID identifies the procedure instance: the procedure name, plus
	// "@node" when a single-path procedure was expanded per detour.
	ID        string
	Procedure string
	// Detours are the detour nodes this cell uses (empty for tcp, mptcp-1sf).
	Detours []string
	// Subflows is the agent's K (0 = len(Detours)); the ID ends in "/kK".
	Subflows int
	Trials   int
	// Fault is the configuration's, if any.
	Fault *Fault
	// Attack is the configuration's, if any.
	Attack *Attack
	// Flow is the configuration's, if any.
	Flow *Flow
}

// Label is the cell's procedure label, with the detour when expanded.
func (c Cell) Label() string {
	l := Label(c.Procedure)
	id, _, _ := strings.Cut(c.ID, "/k")
	if i := strings.IndexByte(id, '@'); i >= 0 {
		l += " (" + id[i+1:] + ")"
	}
	if c.Subflows > 0 {
		l += fmt.Sprintf(" K=%d", c.Subflows)
	}
	return l
}

// K is the number of detour subflows the cell's agent keeps.
func (c Cell) K() int {
	if c.Subflows > 0 {
		return c.Subflows
	}
	return len(c.Detours)
}

const maxTrials = 10000

var unknownFieldRE = regexp.MustCompile(`field (\S+) not found in type \S+`)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Parse reads and validates a scenario. source names it in errors.
func Parse(source string, data []byte) (*Scenario, error) {
	var s Scenario
	doc, err := config.Parse(source, data, &s)
	if err != nil {
		return nil, err
	}
	if doc.Empty() {
		return nil, &config.Error{File: source, Msg: "empty scenario file"}
	}
	if err := s.validate(); err != nil {
		return nil, doc.Locate(err)
	}
	s.Source = source
	return &s, nil
}

func decodeStrict(n *yaml.Node, v any) error {
	// yaml.Node.Decode does not honour KnownFields, so re-encode and decode
	// strictly: unknown keys inside procedure mappings must be errors too.
	b, err := yaml.Marshal(n)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("line %d: %s", n.Line, strings.TrimPrefix(cleanYAMLError(err).Error(), "line 1: "))
	}
	return nil
}

// cleanYAMLError turns yaml.v3's "yaml: unmarshal errors:\n  line 3: ..."
// into one line per problem.
func cleanYAMLError(err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: unmarshal errors:\n")
	msg = strings.TrimPrefix(msg, "yaml: ")
	lines := strings.Split(msg, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
		lines[i] = unknownFieldRE.ReplaceAllString(lines[i], `unknown field "$1"`)
	}
	return errors.New(strings.Join(lines, "; "))
}

func (s *Scenario) validate() error {
	if s.Name == "" {
		return errors.New("name: missing")
	}
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("name: %q must be letters, digits, '.', '_' or '-' (max 64)", s.Name)
	}
	if s.Topology == "" {
		return errors.New("topology: missing (a built-in topology name or a topology file)")
	}
	if s.Roles.Client == "" {
		s.Roles.Client = "client"
	}
	if s.Roles.Server == "" {
		s.Roles.Server = "server"
	}
	if s.Trials == 0 {
		s.Trials = 10
	}
	if s.Trials < 1 || s.Trials > maxTrials {
		return fmt.Errorf("trials: %d out of range 1..%d", s.Trials, maxTrials)
	}
	if s.Duration == 0 {
		s.Duration = Duration(10 * time.Second)
	}
	if s.Warmup == 0 {
		s.Warmup = Duration(time.Second)
	}
	if s.Duration < Duration(time.Second) || s.Duration > Duration(time.Hour) {
		return fmt.Errorf("duration: %s out of range 1s..1h", time.Duration(s.Duration))
	}
	if s.Warmup < 0 || s.Warmup >= s.Duration {
		return fmt.Errorf("warmup: %s must be >= 0 and shorter than duration %s", time.Duration(s.Warmup), time.Duration(s.Duration))
	}
	if s.CC == "" {
		s.CC = "cubic"
	}
	switch s.Direction {
	case "":
		s.Direction = "upload"
	case "upload", "download":
	default:
		return fmt.Errorf("direction: %q is not upload or download", s.Direction)
	}
	if !nameRE.MatchString(s.CC) {
		return fmt.Errorf("cc: %q is not a congestion control name", s.CC)
	}
	if len(s.Configurations) == 0 {
		return errors.New("configurations: at least one is needed")
	}
	if err := checkRoles("roles", &s.Roles); err != nil {
		return err
	}
	if err := checkProcs("procedures", s.Procedures); err != nil {
		return err
	}
	configs := map[string]bool{}
	for i := range s.Configurations {
		c := &s.Configurations[i]
		field := fmt.Sprintf("configurations[%d]", i)
		if c.Name == "" {
			return fmt.Errorf("%s.name: missing", field)
		}
		if !nameRE.MatchString(c.Name) {
			return fmt.Errorf("%s.name: %q must be letters, digits, '.', '_' or '-' (max 64)", field, c.Name)
		}
		if configs[c.Name] {
			return fmt.Errorf("%s.name: %q used twice", field, c.Name)
		}
		configs[c.Name] = true
		if c.Label == "" {
			c.Label = c.Name
		}
		if c.Trials < 0 || c.Trials > maxTrials {
			return fmt.Errorf("%s.trials: %d out of range 1..%d", field, c.Trials, maxTrials)
		}
		if c.Procedures != nil && len(c.Procedures) == 0 {
			return fmt.Errorf("%s.procedures: empty list: the configuration would run nothing (leave the key out to use the scenario's procedures)", field)
		}
		if f := c.Fault; f != nil {
			switch {
			case f.Link == "":
				return fmt.Errorf("%s.fault.link: missing (the lab link to black-hole)", field)
			case f.At.D() <= 0 || f.At.D() >= s.Duration.D():
				return fmt.Errorf("%s.fault.at: %s must be within the transfer (duration %s)", field, f.At, s.Duration)
			case f.For.D() < 0:
				return fmt.Errorf("%s.fault.for: must not be negative", field)
			}
		}
		if a := c.Attack; a != nil {
			known := false
			for _, k := range AttackKinds {
				known = known || a.Kind == k
			}
			switch {
			case !known:
				return fmt.Errorf("%s.attack.kind: %q unknown (known: %s)", field, a.Kind, strings.Join(AttackKinds, ", "))
			case a.Kind != "none" && a.From == "":
				return fmt.Errorf("%s.attack.from: missing (the lab node that attacks)", field)
			case a.Rate < 0 || a.Rate > 100000:
				return fmt.Errorf("%s.attack.rate: %d out of range 0..100000 packets/s (0: 1000)", field, a.Rate)
			case a.Probes < 0 || a.Probes > 100:
				return fmt.Errorf("%s.attack.probes: %d out of range 0..100 connections/s", field, a.Probes)
			}
		}
		if f := c.Flow; f != nil {
			switch {
			case f.Size <= 0:
				return fmt.Errorf("%s.flow.size: missing (bytes per flow, e.g. 15KB)", field)
			case f.Flows < 0 || f.Flows > 1000:
				return fmt.Errorf("%s.flow.flows: %d out of range 1..1000 (0: 1)", field, f.Flows)
			case c.Fault != nil || c.Attack != nil:
				return fmt.Errorf("%s.flow: not together with a fault or an attack", field)
			}
			if f.Flows == 0 {
				f.Flows = 1
			}
		}
		if c.Roles != nil {
			if c.Roles.Client == "" {
				c.Roles.Client = s.Roles.Client
			}
			if c.Roles.Server == "" {
				c.Roles.Server = s.Roles.Server
			}
			if c.Roles.Converter == "" {
				c.Roles.Converter = s.Roles.Converter
			}
			if c.Roles.Clients == nil {
				c.Roles.Clients = s.Roles.Clients
			}
			if err := checkRoles(field+".roles", c.Roles); err != nil {
				return err
			}
		}
		if c.Procedures != nil {
			if err := checkProcs(field+".procedures", c.Procedures); err != nil {
				return err
			}
		} else if len(s.Procedures) == 0 {
			return fmt.Errorf("%s.procedures: none here and no scenario-wide procedures list", field)
		}
		if _, err := s.cells(c); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	for i, t := range s.Targets {
		field := fmt.Sprintf("targets[%d]", i)
		if !configs[t.Configuration] {
			return fmt.Errorf("%s.configuration: %q is not one of the configurations", field, t.Configuration)
		}
		if _, ok := procs[t.Procedure]; !ok {
			return fmt.Errorf("%s.procedure: unknown procedure %q (known: %s)", field, t.Procedure, strings.Join(ProcedureNames(), ", "))
		}
		_, isProc := procs[t.Ratio]
		if !ratios[t.Ratio] && !isProc {
			return fmt.Errorf("%s.ratio: unknown ratio %q (known: sum, tcp, best, benefit, or a procedure name)", field, t.Ratio)
		}
		if ratios[t.Ratio] && t.Ratio != RatioTCP && procs[t.Procedure].single == "" {
			return fmt.Errorf("%s.ratio: %q needs an MPTCP detour procedure, not %q", field, t.Ratio, t.Procedure)
		}
	}
	if s.Reference != nil {
		for cfg, m := range s.Reference.Results {
			if !configs[cfg] {
				return fmt.Errorf("reference.results: %q is not one of the configurations", cfg)
			}
			for p, v := range m {
				if _, ok := procs[p]; !ok {
					return fmt.Errorf("reference.results.%s: unknown procedure %q", cfg, p)
				}
				if len(v) != 2 {
					return fmt.Errorf("reference.results.%s.%s: want [mean, sd]", cfg, p)
				}
			}
		}
	}
	return nil
}

func checkRoles(field string, r *Roles) error {
	for _, n := range append([]string{r.Client, r.Server}, r.Detours...) {
		if !nameRE.MatchString(n) {
			return fmt.Errorf("%s: %q is not a node name", field, n)
		}
	}
	if r.Client == r.Server {
		return fmt.Errorf("%s: client and server are the same node %q", field, r.Client)
	}
	seen := map[string]bool{r.Client: true, r.Server: true}
	for _, d := range r.Detours {
		if seen[d] {
			return fmt.Errorf("%s.detours: %q listed twice or also client/server", field, d)
		}
		seen[d] = true
	}
	clients := map[string]bool{}
	for _, c := range r.Clients {
		if !nameRE.MatchString(c) {
			return fmt.Errorf("%s.clients: %q is not a node name", field, c)
		}
		if clients[c] || c != r.Client && seen[c] {
			return fmt.Errorf("%s.clients: %q listed twice or also the server or a detour", field, c)
		}
		clients[c] = true
	}
	if r.Converter != "" {
		if !nameRE.MatchString(r.Converter) {
			return fmt.Errorf("%s.converter: %q is not a node name", field, r.Converter)
		}
		if seen[r.Converter] {
			return fmt.Errorf("%s.converter: %q is also the client, the server or a detour", field, r.Converter)
		}
	}
	return nil
}

func checkProcs(field string, ps []ProcedureSpec) error {
	for i, p := range ps {
		if _, ok := procs[p.Procedure]; !ok {
			return fmt.Errorf("%s[%d]: unknown procedure %q (known: %s)", field, i, p.Procedure, strings.Join(ProcedureNames(), ", "))
		}
	}
	return nil
}

// Cells expands the scenario into its plan, configuration by configuration.
func (s *Scenario) Cells() []Cell {
	var out []Cell
	for i := range s.Configurations {
		cs, _ := s.cells(&s.Configurations[i]) // validated by Parse
		out = append(out, cs...)
	}
	return out
}

// ServerSpeaksMPTCP reports whether the server node keeps MPTCP on
// (server_mptcp, default true).
func (s *Scenario) ServerSpeaksMPTCP() bool { return s.ServerMPTCP == nil || *s.ServerMPTCP }

// RolesFor returns the node roles in effect for configuration c.
func (s *Scenario) RolesFor(c *Configuration) Roles {
	if c.Roles != nil {
		return *c.Roles
	}
	return s.Roles
}

// Configuration returns the named configuration or nil.
func (s *Scenario) Configuration(name string) *Configuration {
	for i := range s.Configurations {
		if s.Configurations[i].Name == name {
			return &s.Configurations[i]
		}
	}
	return nil
}

func (s *Scenario) cells(c *Configuration) ([]Cell, error) {
	roles := s.RolesFor(c)
	list := s.Procedures
	field := "procedures"
	if c.Procedures != nil {
		list = c.Procedures
		field = "procedures (of the configuration)"
	}
	trials := s.Trials
	if c.Trials > 0 {
		trials = c.Trials
	}
	var out []Cell
	seen := map[string]bool{}
	var spec ProcedureSpec
	add := func(i int, cell Cell) error {
		if spec.Subflows != 0 {
			cell.Subflows = spec.Subflows
			cell.ID += fmt.Sprintf("/k%d", spec.Subflows)
		}
		if seen[cell.ID] {
			return fmt.Errorf("%s[%d]: %s listed twice", field, i, cell.ID)
		}
		seen[cell.ID] = true
		cell.Configuration, cell.Trials, cell.Fault, cell.Attack, cell.Flow = c.Name, trials, c.Fault, c.Attack, c.Flow
		out = append(out, cell)
		return nil
	}
	isDetour := func(n string) bool {
		for _, d := range roles.Detours {
			if d == n {
				return true
			}
		}
		return false
	}
	for i, p := range list {
		spec = p
		info := procs[p.Procedure]
		if p.Subflows != 0 && (info.detours != -1 || p.Subflows < 1 || p.Subflows > 8) {
			return nil, fmt.Errorf("%s[%d].subflows: %d: only an MPTCP procedure through detours takes subflows, from 1 to 8", field, i, p.Subflows)
		}
		if (p.Procedure == Converted || p.Procedure == ConvertedDirect) && roles.Converter == "" {
			return nil, fmt.Errorf("%s[%d]: %s needs roles.converter (the node that runs the converter)", field, i, p.Procedure)
		}
		if info.detours == 0 {
			if p.Detour != "" {
				return nil, fmt.Errorf("%s[%d].detour: %s uses no detour", field, i, p.Procedure)
			}
			if err := add(i, Cell{ID: p.Procedure, Procedure: p.Procedure}); err != nil {
				return nil, err
			}
			continue
		}
		if len(roles.Detours) == 0 {
			return nil, fmt.Errorf("%s[%d]: %s needs a detour node but roles.detours is empty", field, i, p.Procedure)
		}
		switch {
		case p.Detour == "" && info.detours == 1:
			err := add(i, Cell{ID: p.Procedure, Procedure: p.Procedure, Detours: roles.Detours[:1]})
			if err != nil {
				return nil, err
			}
		case p.Detour == "" || p.Detour == "all":
			if info.detours == 1 {
				return nil, fmt.Errorf("%s[%d].detour: %s uses exactly one detour; use \"each\" or a node name", field, i, p.Procedure)
			}
			err := add(i, Cell{ID: p.Procedure, Procedure: p.Procedure, Detours: append([]string(nil), roles.Detours...)})
			if err != nil {
				return nil, err
			}
		case p.Detour == "each":
			for _, d := range roles.Detours {
				if err := add(i, Cell{ID: p.Procedure + "@" + d, Procedure: p.Procedure, Detours: []string{d}}); err != nil {
					return nil, err
				}
			}
		case isDetour(p.Detour):
			if err := add(i, Cell{ID: p.Procedure + "@" + p.Detour, Procedure: p.Procedure, Detours: []string{p.Detour}}); err != nil {
				return nil, err
			}
		case strings.Contains(p.Detour, "+"):
			// A subset of the detours, e.g. "detour1+detour3" (MPTCP only).
			if info.detours == 1 {
				return nil, fmt.Errorf("%s[%d].detour: %s uses exactly one detour, not the set %q", field, i, p.Procedure, p.Detour)
			}
			set := strings.Split(p.Detour, "+")
			seenD := map[string]bool{}
			for _, d := range set {
				if !isDetour(d) || seenD[d] {
					return nil, fmt.Errorf("%s[%d].detour: %q in %q is not a detour node or is repeated (roles.detours: %s)", field, i, d, p.Detour, strings.Join(roles.Detours, ", "))
				}
				seenD[d] = true
			}
			if err := add(i, Cell{ID: p.Procedure + "@" + p.Detour, Procedure: p.Procedure, Detours: set}); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%s[%d].detour: %q is not a detour node (roles.detours: %s), \"each\", \"all\" or a set \"a+b\"", field, i, p.Detour, strings.Join(roles.Detours, ", "))
		}
	}
	return out, nil
}

// SinglePathCells returns, for an MPTCP detour cell, the IDs of the
// single-path cells of the same configuration it is compared against: TCP
// over the default path, then the single-path procedure via each of its
// detours ("tcp-nat@d" if measured per detour, else "tcp-nat" for the
// first detour). ok is false if some are not in the plan.
func (s *Scenario) SinglePathCells(c Cell) (ids []string, ok bool) {
	single := SinglePath(c.Procedure)
	if single == "" {
		return nil, false
	}
	plan := map[string]Cell{}
	for _, x := range s.Cells() {
		if x.Configuration == c.Configuration {
			plan[x.ID] = x
		}
	}
	ids = []string{DefaultPath(c.Procedure)}
	ok = true
	if _, has := plan[ids[0]]; !has {
		ok = false
	}
	for _, d := range c.Detours {
		if _, has := plan[single+"@"+d]; has {
			ids = append(ids, single+"@"+d)
			continue
		}
		if x, has := plan[single]; has && len(x.Detours) == 1 && x.Detours[0] == d {
			ids = append(ids, single)
			continue
		}
		ok = false
	}
	return ids, ok
}

// FileSafe reports whether name can be used in a file name.
func FileSafe(name string) bool { return nameRE.MatchString(name) && path.Base(name) == name }

// SetProcedures replaces the procedures of every configuration with names
// (`lab bench --procedures`) and validates the result.
func (s *Scenario) SetProcedures(names []string) error {
	var ps []ProcedureSpec
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n != "" {
			ps = append(ps, ProcedureSpec{Procedure: n})
		}
	}
	if len(ps) == 0 {
		return errors.New("no procedures given")
	}
	old, oldCfg := s.Procedures, make([][]ProcedureSpec, len(s.Configurations))
	s.Procedures = ps
	for i := range s.Configurations {
		oldCfg[i] = s.Configurations[i].Procedures
		s.Configurations[i].Procedures = nil
	}
	if err := s.validate(); err != nil {
		s.Procedures = old
		for i := range s.Configurations {
			s.Configurations[i].Procedures = oldCfg[i]
		}
		return fmt.Errorf("--procedures: %w", err)
	}
	return nil
}
