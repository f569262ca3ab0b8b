package bench

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Env is what a procedure gets to run one cell.
type Env struct {
	Lab   *lab.Lab
	Cell  scenario.Cell
	Roles scenario.Roles
	CC    string
	// Duration of each transfer; goodput counts from Warmup to the end.
	Duration, Warmup time.Duration
	Binary           string // mpdetour executable for daemons in lab nodes
	Dir              string // private scratch directory of the cell
	Port             int    // the receiver's port on the server
	// ReceiverLogDir: the receivers log the clients they drop to
	// receiver-NODE.log in it ("": not logged).
	ReceiverLogDir string
	AgentConfig    string // YAML appended to agent configurations (Options.AgentConfig)
	// RelayLease is the relays' lease (0: relayLease, longer than any cell)
	// and RelayConfig YAML appended to their configurations.
	RelayLease  time.Duration
	RelayConfig string
	// RelayMembers are more members list items (YAML, indented two spaces)
	// and RelayConfigFor more configuration for the relay in node with
	// public key pub (nil: none): the soak's in-place attack cases.
	RelayMembers   string
	RelayConfigFor func(node string, pub proto.Key) (string, error)
	// Download: the server sends, the client counts (scenario direction).
	Download bool
	// RelayState gives each relay a state_file (replay protection) and a
	// tunnel state_file (allocations survive restarts), in Dir.
	RelayState bool
	// ServerMPTCP is false when the server node has MPTCP disabled;
	// LatencyPort is its setup-latency responder (0: none).
	ServerMPTCP bool
	LatencyPort int
	// FlowPort is the flow sink's port in the server node (0: none).
	FlowPort int
	// RelayAllow are destinations the detour relays allow besides the
	// server (the converter's address for procedure converted).
	RelayAllow []netip.Addr
	// IPv6: the procedure runs over IPv6 (tcp6, mptcp-nat6, mptcp-tunnel6): the server,
	// the relays and the detours are addressed by their IPv6 twins.
	IPv6 bool
}

// addr is node's address in the procedure's family (Lab.Addr, or
// Lab.Addr6 for an IPv6 procedure).
func (e *Env) addr(node string) netip.Addr {
	if e.IPv6 {
		return e.Lab.Addr6(node)
	}
	return e.Lab.Addr(node)
}

// hostPrefix is a as a one-address prefix (/32 or /128) for configs.
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// ipv6 marks env as an IPv6 procedure's, or says why the lab cannot run
// one.
func ipv6(env *Env, proc string) error {
	if !env.Lab.Family().Has6() {
		return Unavailable("%s needs a lab with IPv6: topology parameter family: dual (this lab is family %s)", proc, env.Lab.Family())
	}
	env.IPv6 = true
	return nil
}

// overIPv6 is setup run over IPv6 as procedure proc (tcp6, tcp-nat6,
// mptcp-nat6, tcp-tunnel6, mptcp-tunnel6): the server, the relays and the
// detours are addressed by their IPv6 twins. The relays then also listen
// on IPv6 (listen6) and grant IPv6 detours to the server's IPv6 address,
// and the agent knows them by their IPv6 addresses; tunnel relays also get
// an IPv6 tunnel subnet (tunnel.subnet6), so WireGuard runs over IPv6 and
// carries IPv6 from the granted IPv6 tunnel address, and a vxlan subnet6
// (tcp-encap6, mptcp-encap6: VXLAN over IPv6 carrying IPv6). Unavailable
// in a lab without IPv6.
func overIPv6(proc string, setup Setup) Setup {
	return func(ctx context.Context, env *Env) (Session, error) {
		if err := ipv6(env, proc); err != nil {
			return nil, err
		}
		return setup(ctx, env)
	}
}

// Measurement is the outcome of one trial.
type Measurement struct {
	GoodputMbps float64
	WindowBytes uint64
	// WindowS, EqualBytes, EqualGoodputMbps: see results.Record (nil
	// unless the trial is one bulk transfer).
	WindowS          *float64
	EqualBytes       *uint64
	EqualGoodputMbps *float64
	// MaxGapS is the longest time the receiver got no data (s), and
	// MaxGapEndS when that stall ended (s after the transfer started).
	MaxGapS, MaxGapEndS float64
	// ResumeS: with a fault, how long after it ended the faulted path
	// carried data again (-1: not before the end; nil: unknown).
	ResumeS *float64
	// TailMbps: with a fault, the rate of the transfer's last third (2/3
	// of the duration to the end) from the client's per-subflow samples
	// (bytes acknowledged in an upload, received in a download): what a
	// policy reached once it had time to choose. Per subflow, so data
	// reinjected on another subflow after a loss counts twice.
	TailMbps *float64
	Subflows []results.Subflow
	// PolicyLog: the agent's decisions on single subflows (see
	// results.Record.PolicyLog), filled by the design's paired runner.
	PolicyLog []string
	// SetupMs: the trial's setup latency probes (connect() to first
	// byte), in ms, when the procedure measures them.
	SetupMs []float64
	Churn   *results.Churn
	// Collective: procedure collective's times.
	Collective *results.Collective
	// FCTMs: with a flow configuration, every flow's completion time (ms).
	FCTMs []float64
	// Attack: with an attack, what it did and the kernels' MPTCP counters
	// over the trial (attack.Run.Stop), also for a failed trial.
	Attack map[string]float64
	// Process: CPU of a cell's daemon over the transfer (procedure
	// converted: the converter's relay), see results.Record.Process.
	Process map[string]float64
}

// Session is a cell prepared for its trials (daemons started, grants
// obtained); Close undoes the preparation.
type Session interface {
	Trial(ctx context.Context, n int) (Measurement, error)
	Close() error
}

// Setup prepares a cell. It returns an *UnavailableError when a component
// the procedure needs is missing from this build or host.
type Setup func(ctx context.Context, env *Env) (Session, error)

// Procedures maps every procedure name to its implementation: the one
// list of what the bench can run (a procedure missing here is reported as
// unavailable).
func Procedures() map[string]Setup {
	return map[string]Setup{
		scenario.TCP:          setupTCP,
		scenario.TCP6:         overIPv6(scenario.TCP6, setupTCP),
		scenario.MPTCP1:       setupMPTCP1,
		scenario.MPTCP1NAT:    setupMPTCP1NAT,
		scenario.TCPNAT:       setupTCPNAT,
		scenario.MPTCPNAT:     setupMPTCPNAT,
		scenario.TCPNAT6:      overIPv6(scenario.TCPNAT6, setupTCPNAT),
		scenario.MPTCPNAT6:    overIPv6(scenario.MPTCPNAT6, setupMPTCPNAT),
		scenario.MPTCPCross:   setupMPTCPCross,
		scenario.TCPTunnel:    setupTCPTunnel,
		scenario.MPTCPTunnel:  setupMPTCPTunnel,
		scenario.TCPTunnel6:   overIPv6(scenario.TCPTunnel6, setupTCPTunnel),
		scenario.MPTCPTunnel6: overIPv6(scenario.MPTCPTunnel6, setupMPTCPTunnel),
		scenario.TCPOpenVPN:   setupOpenVPN,
		scenario.TCPEncap:     setupTCPEncap,
		scenario.MPTCPEncap:   setupMPTCPEncap,
		scenario.TCPEncap6:    overIPv6(scenario.TCPEncap6, setupTCPEncap),
		scenario.MPTCPEncap6:  overIPv6(scenario.MPTCPEncap6, setupMPTCPEncap),

		scenario.MPTCPNATStatic:             setupMPTCPNAT,
		scenario.MPTCPNATAdaptive:           setupMPTCPNAT,
		scenario.MPTCPTunnelStatic:          setupMPTCPTunnel,
		scenario.MPTCPTunnelAdaptive:        setupMPTCPTunnel,
		scenario.MPTCPNATBackupFirst:        setupMPTCPNAT,
		scenario.MPTCPNATStaticSBD:          setupMPTCPNAT,
		scenario.MPTCPNATGuard:              setupMPTCPNAT,
		scenario.MPTCPNATGuardStarveOff:     setupMPTCPNAT,
		scenario.MPTCPTunnelBackupFirst:     setupMPTCPTunnel,
		scenario.MPTCPTunnelStaticClamp:     setupMPTCPTunnel,
		scenario.MPTCPTunnelStaticPacing:    setupMPTCPTunnel,
		scenario.MPTCPTunnelStaticClampBoth: setupMPTCPTunnel,
		scenario.MPTCPTunnelStaticSBD:       setupMPTCPTunnel,

		scenario.MPTCPNATBackupStatic:   setupMPTCPNATBackup,
		scenario.MPTCPNATBackupAdaptive: setupMPTCPNATBackup,

		scenario.Converted:       setupConverted,
		scenario.ConvertedDirect: setupConverted,
		scenario.Announced:       setupAnnounced,

		scenario.LBConnections:          setupLBConnections,
		scenario.LBConnectionsAnnounced: setupLBConnectionsAnnounced,
		scenario.LBConnectionsNoCFlag:   setupLBConnectionsNoCFlag,
		scenario.LBBulkAnnounced:        setupLBBulkAnnounced,

		scenario.Collective: setupCollective,

		scenario.MPTCPNATStaticLowat:    setupMPTCPNAT,
		scenario.MPTCPTunnelStaticLowat: setupMPTCPTunnel,

		scenario.MPTCPNATBackupStaticLowat: setupMPTCPNATBackup,

		scenario.MPTCPNATStaticNoLowat:    setupMPTCPNAT,
		scenario.MPTCPTunnelStaticNoLowat: setupMPTCPTunnel,

		scenario.MPTCPNATStaticLowatRTT:    setupMPTCPNAT,
		scenario.MPTCPTunnelStaticLowatRTT: setupMPTCPTunnel,
	}
}

// UnavailableError says a procedure cannot run here, and why.
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string { return "unavailable: " + e.Reason }

// Unavailable returns an *UnavailableError.
func Unavailable(format string, a ...any) error {
	return &UnavailableError{Reason: fmt.Sprintf(format, a...)}
}

func marshalScenario(s *scenario.Scenario) ([]byte, error) {
	b, err := yaml.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append([]byte("# scenario as run (source: "+s.Source+")\n"), b...), nil
}
