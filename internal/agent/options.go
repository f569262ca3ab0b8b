package agent

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// DefaultSocket is where the agent serves its status.
const DefaultSocket = "/run/mpdetour/agent.sock"

// Options are the agent core's settings: the validated form of the
// agent file's core fields (internal/agentd builds them; tests write them
// directly). The detour kinds' settings (relays, tunnels, legacy v1, the
// converter, the server role) are internal/agentd's: the core only gets
// their sources.
type Options struct {
	// NetNS is the namespace whose connections the agent manages (name in
	// /run/netns or a path); empty means the agent's own.
	NetNS             string
	Socket            string
	Subflows          int
	AnnouncedSubflows int
	MaxConnections    int
	Backoff           time.Duration
	MaxBackoff        time.Duration
	ConnectTimeout    time.Duration
	// ProbeInterval is how often subflows are checked for stalls through
	// inet_diag (0 = never); StallRetransmits is the number of consecutive
	// retransmission timeouts that marks an established subflow dead.
	ProbeInterval    time.Duration
	StallRetransmits int
	// SweepEvery is how often tracked connections are checked against the
	// kernel's table, to forget those whose CLOSED event never came
	// (0 = 10 s; not in the YAML: tests shorten it).
	SweepEvery time.Duration
	// Policy chooses subflows: static (keep N), adaptive (measure, keep
	// the best, back up, fail over), backup-first or guard; Watchdog,
	// Window and Hold tune the adaptive one, Hold also how long guard keeps
	// a shed detour out (policy.Config).
	Policy                 policy.Mode
	Watchdog, Window, Hold time.Duration
	// GuardShare and GuardWindow tune the guard policy (the `guard:`
	// block): a subflow slower than the main carrier that delivers below
	// GuardShare of the connection's bytes over GuardWindow is shed, while
	// the subflow delivering the most is limited by its congestion window
	// in less than GuardStarve of the probes (1: without that condition)
	// (0 = the policy's defaults).
	GuardShare  float64
	GuardWindow time.Duration
	GuardStarve float64
	// GuardRTT: guard sheds only a subflow whose base RTT exceeds GuardRTT
	// x the top subflow's (0: the policy's default, 1.25; negative: no RTT
	// condition, the file's guard.rtt: 0).
	GuardRTT float64
	// GuardOutage: guard does not judge a subflow within two judging
	// windows of GuardOutage consecutive retransmission timeouts (0: the
	// policy's default, 1; negative: judged anyway, the file's
	// guard.outage: 0).
	GuardOutage    int
	CommandWorkers int
	// Nice, when non-zero, is applied to the agent's threads at start.
	Nice int
	// EventBuffer is the event socket's receive buffer in bytes.
	EventBuffer int
	LogLevel    slog.Level
	// MetricsListen, when set, serves Prometheus metrics (e.g. 127.0.0.1:9465,
	// or unix:/run/mpdetour/agent-metrics.sock: mode 0600).
	MetricsListen string
	// MetricsToken, when set, is the bearer token every scrape must send
	// (metrics.token_file).
	MetricsToken string
	Selectors    []policy.Selector
	// OtherFamily maps a server address to its addresses of the other
	// family (the config's other_family): cross-family detour candidates
	// (policy.Config.OtherFamily).
	OtherFamily map[netip.Addr][]netip.Addr
	// SourceFor looks up the namespace's own address toward an address,
	// the source of cross-family NAT detours (RunLinux wires a RouteSource;
	// nil = none; not in the YAML).
	SourceFor func(netip.Addr) (netip.Addr, error)
	// ConvertStatus, when set, adds the conversion Router's view to the
	// status, as JSON (wired by internal/agentd; not in the YAML).
	ConvertStatus func() any
	// Blackhole, when set, adds the kernel's MPTCP blackhole fallback to
	// the status (wired by RunLinux; not in the YAML).
	Blackhole func() BlackholeStatus
	// RelayStatus, when set, adds each relay's state (RelayHealth) to the
	// status (wired by internal/agentd; not in the YAML).
	RelayStatus func() []RelayStatus
	// PMType, when set, adds the pm_type guard's view to the status
	// (wired by RunLinux).
	PMType func() PMTypeStatus
	// OnMeasured, when set, gets every round of subflow measurements the
	// policy got, from the agent's loop (internal/agentd: cwnd clamps;
	// not in the YAML). It must not block.
	OnMeasured func(ms []policy.Measurement)
	// CwndClamp, when set, adds the cwnd clamps' state to the status
	// (wired by internal/agentd).
	CwndClamp func() policy.ClampStatus
	// OnSubflows, when set, gets the 4-tuples of a managed (selected)
	// connection's established subflows (the initial subflow's first,
	// while the connection is tracked, then each established join's)
	// whenever they may have changed, and nil once the connection is
	// gone, from the agent's loop (internal/agentd: subflow_lowat; not
	// in the YAML). It must not block. A 4-tuple may repeat.
	OnSubflows func(token uint32, pairs []SubflowPair)
	// SubflowLowat, when set, adds the per-subflow unsent limit's state
	// to the status (wired by internal/agentd).
	SubflowLowat func() LowatStatus
	// SubflowPacing, when set, adds the subflow pacing's state to the
	// status (wired by internal/agentd).
	SubflowPacing func() PacingStatus
	// SubflowCC, when set, prepares each detour subflow's congestion
	// control just before the subflow is created (subflow_congestion,
	// wired by internal/agentd with internal/subflowcc) and adds its state
	// to the status. Subflows toward addresses the server announced are
	// not detour subflows and are left alone.
	SubflowCC SubflowCC
	// BufferSizing: raise the namespace's tcp_rmem/tcp_wmem maximum to
	// what the measured connections need (policy BufferWanted), restored
	// at stop (buffers.go). The agent file turns it on by default
	// (internal/agentd; docs/results/design/mechanisms-realworld); the
	// zero Options leave it off.
	BufferSizing bool
	// StaleLossCnt, when > 0, sets net.mptcp.stale_loss_cnt in the
	// namespace (MPTCP retransmit timer rounds without progress before a
	// subflow is stale and its queue re-sent elsewhere; kernel default 4),
	// restored at stop (stale.go). 0 = leave it.
	StaleLossCnt int
	// Probes is the directory marking doctor's test connections, which
	// the agent leaves alone (probes.go; RunLinux sets ProbeDir; "" =
	// none).
	Probes string

	// SharedBottleneck and SharedWindow: the static policy's
	// shared-bottleneck detection (the `shared_bottleneck:` block;
	// policy.Config.SharedBottleneck; 0 = the default window).
	SharedBottleneck bool
	SharedWindow     time.Duration
}

// SubflowPair is a subflow's local and remote address and port (its
// 4-tuple), IPv4 unmapped.
type SubflowPair struct{ Local, Remote netip.AddrPort }

// LowatStatus is the per-subflow unsent limit (subflow_lowat) in the
// status: active with the limit and the subflows that have it (Pairs:
// their 4-tuples, the map entries; the JSON name is kept), or
// failed with the reason (the agent runs without it). Refused says the
// kernel refused the program's TCP_NOTSENT_LOWAT; Sets counts the
// program's settings (one per subflow, more when the kernel reset one).
type LowatStatus struct {
	State   string `json:"state"`
	Bytes   uint32 `json:"bytes"`
	Error   string `json:"error,omitempty"`
	Refused string `json:"refused,omitempty"`
	Pairs   int    `json:"pairs"`
	Sets    uint64 `json:"sets"`
	// Scale is "rtt" when the limit is scaled to the subflows' RTTs
	// (subflow_lowat_scale): Bytes is then its floor, Ceil its ceiling,
	// Rewrites how often the agent wrote a connection's new largest RTT
	// into a subflow's entry.
	Scale    string `json:"scale,omitempty"`
	Ceil     uint32 `json:"ceil,omitempty"`
	Rewrites uint64 `json:"rewrites,omitempty"`
	// Default: the config does not set subflow_lowat (the limit is the
	// agent's default; subflow_lowat: 0 turns it off).
	Default bool `json:"default,omitempty"`
	// Cgroup is where the program attaches (or failed to): bpf_cgroup's
	// directory or "cgroup v2 root".
	Cgroup string `json:"cgroup,omitempty"`
}

// Where says, for status and doctor, where the program is attached and
// whether the limit is the default: ", program at CGROUP (the default)".
func (l *LowatStatus) Where() string {
	s := ""
	if l.Cgroup != "" {
		s = ", program at " + l.Cgroup
	}
	if l.Default {
		s += " (the default)"
	}
	return s
}

// PacingStatus is subflow pacing (subflow_pacing) in the status: active
// with the maximum pacing rate given (bytes/s; it caps nothing, it turns
// TCP's internal pacing on) and the address pairs that have it, refused
// (the kernel refused the program's SO_MAX_PACING_RATE) or failed with
// the reason (the agent runs without it).
type PacingStatus struct {
	State   string `json:"state"`
	MaxRate uint64 `json:"max_pacing_rate"`
	Error   string `json:"error,omitempty"`
	Refused string `json:"refused,omitempty"`
	Pairs   int    `json:"pairs"`
}

// SubflowCC gives detour subflows their own congestion control
// (subflowcc.Routes). Prepare must not fail the subflow: what it cannot
// do, it says itself, and the subflow runs the host's algorithm.
type SubflowCC interface {
	Prepare(local, remote netip.Addr)
	Status() subflowcc.Status
}

// DefaultOptions are the defaults of the agent file's core fields
// (docs/agent.md): the static policy keeping 2 detour subflows. Four
// command workers: SUBFLOW_CREATE does the connect in the caller's
// syscall, and with one or two sockets bursts queue up (docs/agent.md,
// benchmark).
func DefaultOptions() Options {
	return Options{
		Socket: DefaultSocket, Subflows: 2, MaxConnections: 65536, CommandWorkers: 4, EventBuffer: 8 << 20,
		Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: time.Second, StallRetransmits: 3, Policy: policy.Static,
	}
}
