package agentd

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/legacyclient"
	"github.com/mpdetour/mpdetour/internal/metricsrv"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/serverrole"
)

// Config is the validated agent file (docs/agent.md): the core's Options
// and the detour kinds' settings, from which Run builds the sources.
type Config struct {
	// Agent are the core's settings (agent.Options).
	Agent agent.Options
	// Detours are the static detours (`detours:`), the first source.
	Detours []static.Entry
	// LegacyV1 are original-prototype daemons asked for detours (v1,
	// unauthenticated; legacyclient).
	LegacyV1 []legacyclient.Relay
	// LegacyLease is how long a v1 grant is assumed to last for daemons
	// without their own legacy_v1[].lease (each LegacyV1 entry carries its
	// own).
	LegacyLease time.Duration
	// Relays, when set, are asked for NAT detours (relayclient.NATSource).
	Relays *relayclient.SourceConfig
	// RelayPing: a relay silent this long is pinged (RelayHealth; 0 =
	// the default 30 s).
	RelayPing time.Duration
	// Tunnels: also ask every relay for a WireGuard tunnel detour.
	Tunnels bool
	// TunnelKind is "wireguard" (default) or "vxlan": the unencrypted
	// kernel encapsulation, opt-in for trusted networks (docs/tunnel.md).
	TunnelKind string
	// PathCheck: probe every NAT detour a relay grants (pathcheck.Filter)
	// and do not use those that strip MPTCP options.
	PathCheck bool
	// Convert, when set, serves conversion decisions to "mpdetour run"
	// (convclient; docs/convert.md).
	Convert *convclient.Settings
	// Server, when set, runs the server role beside the client one
	// (internal/serverrole: ADD_ADDR of detours, C flag).
	Server *serverrole.Config
	// CwndClamp, when set, clamps the cwnd of tunnel detour subflows
	// (policy.Clamps, internal/bpfclamp; docs/agent.md).
	CwndClamp *ClampSettings
	// SubflowCongestion, when set, is the congestion control of detour
	// subflows (internal/subflowcc; docs/agent.md).
	SubflowCongestion string
	// SubflowLowat, when > 0, bounds the unsent bytes of every subflow of
	// every managed connection (TCP_NOTSENT_LOWAT through the BPF program;
	// lowat.go, docs/agent.md). A config file that does not set it gets
	// DefaultSubflowLowat (0 on a server-role-only agent, which manages
	// no connection); subflow_lowat: 0 turns it off.
	SubflowLowat uint32
	// SubflowLowatDefault: the file does not set subflow_lowat
	// (SubflowLowat is the default; `agent --check` says so, and a
	// program that cannot be loaded or attached is then one warning
	// that names the default and how to turn it off).
	SubflowLowatDefault bool
	// SubflowLowatScale is LowatScaleNone (the default: every subflow
	// gets SubflowLowat) or LowatScaleRTT (SubflowLowat is the floor of a
	// limit scaled to the subflows' RTTs; lowat.go, docs/agent.md).
	SubflowLowatScale string
	// SubflowPacing: the subflows of managed connections pace
	// themselves at TCP's own rate (subflow_pacing: SO_MAX_PACING_RATE
	// through the BPF program; pacing.go, docs/agent.md). Off unless set.
	SubflowPacing bool
	// BPFCgroup is the cgroup v2 directory the agent's one BPF program
	// (cwnd_clamp, subflow_lowat and subflow_pacing) attaches to: bpf_cgroup, or
	// cwnd_clamp.cgroup; "" = the cgroup v2 mount's root.
	BPFCgroup string
}

// ClampSettings are the cwnd_clamp section's.
// (The section's cgroup becomes Config.BPFCgroup: the one program of
// both mechanisms attaches to one cgroup.)
type ClampSettings struct {
	// Mode is what the clamps limit: the cwnd (default), the pacing
	// rate, or both.
	Mode policy.ClampMode
}

// File is the agent file's YAML form (docs/agent.md); LoadConfig and
// ParseConfig validate it into a Config.
type File struct {
	NetNS             string           `yaml:"netns"`
	Socket            string           `yaml:"socket"`
	Subflows          *int             `yaml:"subflows"`
	AnnouncedSubflows *int             `yaml:"announced_subflows"`
	MaxConnections    int              `yaml:"max_connections"`
	Backoff           *config.Duration `yaml:"backoff"`
	MaxBackoff        *config.Duration `yaml:"max_backoff"`
	ConnectTimeout    *config.Duration `yaml:"connect_timeout"`
	ProbeInterval     *config.Duration `yaml:"probe_interval"`
	StallRetransmits  *int             `yaml:"stall_retransmits"`
	Policy            string           `yaml:"policy"`
	Watchdog          *config.Duration `yaml:"watchdog"`
	Window            *config.Duration `yaml:"window"`
	Hold              *config.Duration `yaml:"hold"`
	CommandWorkers    int              `yaml:"command_workers"`
	Nice              int              `yaml:"nice"`
	EventBuffer       int              `yaml:"event_buffer"`
	LogLevel          config.LogLevel  `yaml:"log_level"`
	Metrics           struct {
		Listen    string `yaml:"listen"`
		TokenFile string `yaml:"token_file"`
	} `yaml:"metrics"`
	Selectors []fileSel `yaml:"selectors"`
	// OtherFamily: the server addresses of the other family, for
	// cross-family detours (docs/agent.md, Dual stack).
	OtherFamily []fileOther  `yaml:"other_family"`
	Detours     []fileDetour `yaml:"detours"`
	// Relays is documented in docs/relay.md (relayclient.File).
	Relays       *relayclient.File `yaml:"relays"`
	Tunnels      bool              `yaml:"tunnels"`
	PathCheck    bool              `yaml:"path_check"`
	BufferSizing *bool             `yaml:"buffer_sizing"`
	StaleLossCnt *int              `yaml:"stale_loss_cnt"`
	// TunnelKind: wireguard (default) or vxlan (unencrypted, opt-in).
	TunnelKind string           `yaml:"tunnel_kind"`
	LegacyV1   []fileLegacy     `yaml:"legacy_v1"`
	RelayPing  *config.Duration `yaml:"relay_ping"`
	// Convert is documented in docs/convert.md (convclient.File).
	Convert *convclient.File `yaml:"convert"`
	// Server is documented in docs/agent.md (serverrole.File).
	Server *serverrole.File `yaml:"server"`
	// CwndClamp is documented in docs/agent.md.
	CwndClamp *fileClamp `yaml:"cwnd_clamp"`
	// SubflowLowat and BPFCgroup are documented in docs/agent.md
	// ("Per-subflow unsent limit").
	SubflowLowat      *int64  `yaml:"subflow_lowat"`
	SubflowLowatScale *string `yaml:"subflow_lowat_scale"`
	BPFCgroup         string  `yaml:"bpf_cgroup"`
	// SubflowPacing is documented in docs/agent.md ("Subflow pacing").
	SubflowPacing *bool `yaml:"subflow_pacing"`
	// SubflowCongestion is documented in docs/agent.md (subflowcc.go).
	SubflowCongestion *fileSubflowCC `yaml:"subflow_congestion"`
	// Guard tunes the guard policy (docs/agent.md, "The guard policy").
	Guard *fileGuard `yaml:"guard"`
	// SharedBottleneck turns on the static policy's shared-bottleneck
	// detection (docs/agent.md, "Shared-bottleneck detection").
	SharedBottleneck *fileShared `yaml:"shared_bottleneck"`
}

type fileShared struct {
	Enabled bool             `yaml:"enabled"`
	Window  *config.Duration `yaml:"window"`
}

type fileGuard struct {
	Share  *float64         `yaml:"share"`
	Window *config.Duration `yaml:"window"`
	Starve *float64         `yaml:"starve"`
	RTT    *float64         `yaml:"rtt"`
	Outage *int             `yaml:"outage"`
}

type fileClamp struct {
	Enabled bool   `yaml:"enabled"`
	Cgroup  string `yaml:"cgroup"`
	Mode    string `yaml:"mode"`
}

// fileLegacy is one v1 daemon (unauthenticated, opt-in; docs/agent.md).
type fileLegacy struct {
	Name    string           `yaml:"name"`
	Address string           `yaml:"address"`
	Lease   *config.Duration `yaml:"lease"`
}

// fileOther maps one server address to its addresses of the other family.
type fileOther struct {
	Server    string   `yaml:"server"`
	Addresses []string `yaml:"addresses"`
}

type fileSel struct {
	Prefixes []string `yaml:"prefixes"`
	Ports    []string `yaml:"ports"`
}

type fileDetour struct {
	Kind    string   `yaml:"kind"`
	Relay   string   `yaml:"relay"`
	Address string   `yaml:"address"` // NAT: relay address:port
	Server  string   `yaml:"server"`  // NAT: where the relay forwards (addr:port)
	Local   string   `yaml:"local"`   // tunnel: the tunnel's address
	Backup  bool     `yaml:"backup"`  // subflows through it carry the B flag
	Servers []string `yaml:"servers"` // tunnel: reachable prefixes
}

// LoadConfig reads and validates an agent file; errors name
// file:line:column and the field.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return parseConfig(path, b)
}

// ParseConfig parses YAML (errors are positioned in "config").
func ParseConfig(b []byte) (Config, error) { return parseConfig("config", b) }

// fragmentFill are the keys every agent file must give, with placeholder
// values: what ParseFragment adds after a fragment.
const fragmentFill = "socket: /tmp/x.sock\nsubflows: 1\n"

// ParseFragment parses text, part of an agent file that a tool completes
// with its own keys (the lab's procedures and mechanisms, the bench's
// --agent-config): the keys every file must have (socket, subflows) are
// added after it with placeholder values, so that an error names text's
// own line and a key text gives that the tool also writes is "given
// twice". It checks that this build's agent accepts text; the returned
// Config is text's settings over the agent's defaults.
func ParseFragment(text string) (Config, error) {
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return ParseConfig([]byte(text + fragmentFill))
}

func parseConfig(name string, b []byte) (Config, error) {
	var f File
	doc, err := config.Parse(name, b, &f)
	if err != nil {
		return Config{}, err
	}
	if f.Guard == nil && doc.Sub("guard") != nil {
		// "guard:" without a value is the block too (empty): it tunes
		// nothing under another policy, which build says.
		f.Guard = &fileGuard{}
	}
	if f.SubflowLowat == nil && doc.Sub("subflow_lowat") != nil {
		// "subflow_lowat:" or "~": not unset, which means the default
		// (on); an operator blanking the value meant something else.
		return Config{}, doc.Errorf("subflow_lowat", "want 0 (off) or %d-%d bytes, got null (leave the key out for the default, %d)", MinSubflowLowat, math.MaxInt32, DefaultSubflowLowat)
	}
	if f.SubflowLowatScale == nil && doc.Sub("subflow_lowat_scale") != nil {
		return Config{}, doc.Errorf("subflow_lowat_scale", "want %s or %s, got null (leave the key out: %s)", LowatScaleNone, LowatScaleRTT, LowatScaleNone)
	}
	if f.SubflowPacing == nil && doc.Sub("subflow_pacing") != nil {
		return Config{}, doc.Errorf("subflow_pacing", "want true or false, got null (leave the key out: off)")
	}
	c, err := build(f)
	if err != nil {
		return Config{}, doc.Locate(err)
	}
	return c, nil
}

// build validates the decoded file; every error starts with the field path.
func build(f File) (Config, error) {
	out := Config{LegacyLease: 10 * time.Minute}
	c := agent.DefaultOptions()
	c.NetNS, c.LogLevel, c.MetricsListen = f.NetNS, f.LogLevel.Level, f.Metrics.Listen
	if f.Socket != "" {
		c.Socket = f.Socket
	}
	core, err := buildCore(f, c)
	out.Agent = core
	if err != nil {
		return out, err
	}
	if out.CwndClamp, err = buildClamp(f.CwndClamp); err != nil {
		return out, err
	}
	if out.SubflowCongestion, err = buildSubflowCC(f.SubflowCongestion); err != nil {
		return out, err
	}
	out.SubflowLowatDefault = f.SubflowLowat == nil
	// subflow_pacing: its own bpf_cgroup check (pacing.go).
	var pacingCgroup string
	var lf File
	if out.SubflowPacing, pacingCgroup, lf, err = buildPacing(f, out.CwndClamp != nil); err != nil {
		return out, err
	}
	if out.SubflowLowat, out.BPFCgroup, err = buildLowat(lf, out.CwndClamp != nil); err != nil {
		return out, err
	}
	if out.SubflowPacing {
		out.BPFCgroup = pacingCgroup
	}
	if out.SubflowLowatScale, err = buildLowatScale(f, out.SubflowLowat); err != nil {
		return out, err
	}
	return buildKinds(f, out)
}

// buildCore validates the core's fields onto the defaults c.
func buildCore(f File, c agent.Options) (agent.Options, error) {
	if f.Subflows != nil {
		if *f.Subflows < 0 || *f.Subflows > 8 {
			return c, fmt.Errorf("subflows: %d out of range 0-8", *f.Subflows)
		}
		c.Subflows = *f.Subflows
	}
	if f.AnnouncedSubflows != nil {
		if *f.AnnouncedSubflows < 0 || *f.AnnouncedSubflows > 8 {
			return c, fmt.Errorf("announced_subflows: %d out of range 0-8", *f.AnnouncedSubflows)
		}
		c.AnnouncedSubflows = *f.AnnouncedSubflows
	}
	if f.MaxConnections < 0 {
		return c, fmt.Errorf("max_connections: must not be negative")
	}
	if f.MaxConnections != 0 {
		c.MaxConnections = f.MaxConnections
	}
	if f.CommandWorkers < 0 || f.CommandWorkers > 64 {
		return c, fmt.Errorf("command_workers: %d out of range 1-64", f.CommandWorkers)
	}
	if f.CommandWorkers != 0 {
		c.CommandWorkers = f.CommandWorkers
	}
	if f.Nice < -20 || f.Nice > 19 {
		return c, fmt.Errorf("nice: %d out of range -20..19", f.Nice)
	}
	c.Nice = f.Nice
	if f.EventBuffer < 0 || f.EventBuffer > 1<<30 {
		return c, fmt.Errorf("event_buffer: %d bytes out of range 1-1073741824", f.EventBuffer)
	}
	if f.EventBuffer != 0 {
		c.EventBuffer = f.EventBuffer
	}
	for _, d := range []struct {
		name   string
		v      *config.Duration
		to     *time.Duration
		zeroOK bool
	}{
		{"backoff", f.Backoff, &c.Backoff, false}, {"max_backoff", f.MaxBackoff, &c.MaxBackoff, false},
		{"connect_timeout", f.ConnectTimeout, &c.ConnectTimeout, false}, {"probe_interval", f.ProbeInterval, &c.ProbeInterval, true},
		{"watchdog", f.Watchdog, &c.Watchdog, false}, {"window", f.Window, &c.Window, false}, {"hold", f.Hold, &c.Hold, false},
	} {
		if d.v == nil {
			continue
		}
		if v := d.v.D(); v < 0 || v == 0 && !d.zeroOK || v > 24*time.Hour {
			return c, fmt.Errorf("%s: %s is not a positive duration up to 24h (e.g. 1s)", d.name, v)
		}
		*d.to = d.v.D()
	}
	if f.Policy != "" {
		m, err := policy.ParseMode(f.Policy)
		if err != nil {
			return c, fmt.Errorf("policy: %v", err)
		}
		c.Policy = m
	}
	if c.Policy == policy.Adaptive && f.Subflows == nil {
		// The adaptive policy's default, measured (docs/results, candidates):
		// it chooses among the detours it has, so it keeps all of them (up
		// to the kernel's 8) unless told otherwise: with K=2 or 4 of 8
		// candidates, exploring one at a time did not reach the good ones
		// within a 15 s transfer (13.8 and 22.0 Mbit/s vs 31.3 with all).
		c.Subflows = 8
	}
	if c.Policy.Measures() {
		// adaptive, backup-first and guard judge paths from measurements.
		if !needProbes(f, &c) {
			return c, fmt.Errorf("probe_interval: 0s turns off the measurements the %s policy decides by; set one (e.g. 100ms) or use policy: static", c.Policy)
		}
	}
	if f.Guard != nil {
		if c.Policy != policy.Guard {
			return c, fmt.Errorf("guard: set, but the policy is %s (the block tunes policy: guard)", c.Policy)
		}
		if v := f.Guard.Share; v != nil {
			if !(*v > 0 && *v < 1) {
				return c, fmt.Errorf("guard.share: %g out of range (a share of the connection's bytes, above 0 and below 1, e.g. 0.25)", *v)
			}
			c.GuardShare = *v
		}
		if v := f.Guard.Window; v != nil {
			if d := v.D(); d < 200*time.Millisecond || d > policy.MaxGuardWindow {
				return c, fmt.Errorf("guard.window: %s out of range 200ms-%s (e.g. 1s)", d, policy.MaxGuardWindow)
			}
			c.GuardWindow = v.D()
		}
		if v := f.Guard.Starve; v != nil {
			if !(*v > 0 && *v <= 1) {
				return c, fmt.Errorf("guard.starve: %g out of range (the share of probes at which the fastest subflow is limited by its congestion window, above 0 and at most 1; 1 turns the condition off; e.g. 0.5)", *v)
			}
			c.GuardStarve = *v
		}
		if v := f.Guard.RTT; v != nil {
			switch {
			case *v == 0:
				c.GuardRTT = -1 // no RTT condition
			case *v >= 1 && *v <= 10:
				c.GuardRTT = *v
			default:
				return c, fmt.Errorf("guard.rtt: %g out of range (a subflow is shed only when its base RTT exceeds this many times the top subflow's: 1-10, e.g. 1.25; 0 sheds whatever its RTT)", *v)
			}
		}
		if v := f.Guard.Outage; v != nil {
			switch {
			case *v == 0:
				c.GuardOutage = -1 // judged through outages too
			case *v >= 1 && *v <= 15:
				c.GuardOutage = *v
			default:
				return c, fmt.Errorf("guard.outage: %d out of range (a subflow that had this many consecutive retransmission timeouts is in an outage and not judged until two judging windows later: 1-15, e.g. 1; 0 judges it anyway)", *v)
			}
		}
	}
	if err := buildShared(f, &c); err != nil {
		return c, err
	}
	if f.StallRetransmits != nil {
		if *f.StallRetransmits < 1 || *f.StallRetransmits > 15 {
			return c, fmt.Errorf("stall_retransmits: %d out of range 1-15", *f.StallRetransmits)
		}
		c.StallRetransmits = *f.StallRetransmits
	}
	if c.MaxBackoff < c.Backoff {
		return c, fmt.Errorf("max_backoff: %s is below backoff %s", c.MaxBackoff, c.Backoff)
	}
	if c.MetricsListen != "" {
		if err := metricsrv.Check(c.MetricsListen); err != nil {
			return c, fmt.Errorf("metrics.listen: %w", err)
		}
	}
	if f.Metrics.TokenFile != "" {
		if c.MetricsListen == "" {
			return c, fmt.Errorf("metrics.token_file: set without metrics.listen")
		}
		tok, err := metricsrv.ReadToken(f.Metrics.TokenFile)
		if err != nil {
			return c, fmt.Errorf("metrics.token_file: %w", err)
		}
		c.MetricsToken = tok
	}
	for i, s := range f.Selectors {
		var sel policy.Selector
		for j, p := range s.Prefixes {
			pf, err := parsePrefix(p)
			if err != nil {
				return c, fmt.Errorf("selectors[%d].prefixes[%d]: %v", i, j, err)
			}
			sel.Prefixes = append(sel.Prefixes, pf)
		}
		for j, p := range s.Ports {
			r, err := policy.ParsePortRange(p)
			if err != nil {
				return c, fmt.Errorf("selectors[%d].ports[%d]: %v", i, j, err)
			}
			sel.Ports = append(sel.Ports, r)
		}
		c.Selectors = append(c.Selectors, sel)
	}
	other, err := parseOtherFamily(f.OtherFamily)
	if err != nil {
		return c, err
	}
	c.OtherFamily = other
	// buffer_sizing is on by default (docs/agent.md, "Host buffer
	// sizing"); it follows the measurements, so probe_interval: 0 turns
	// the default off, and an explicit true without them is refused.
	c.BufferSizing = c.ProbeInterval > 0
	if f.BufferSizing != nil {
		c.BufferSizing = *f.BufferSizing
		if c.BufferSizing && c.ProbeInterval == 0 {
			return c, fmt.Errorf("buffer_sizing: needs measurements; set probe_interval (e.g. 100ms) or leave buffer_sizing out")
		}
	}
	if f.StaleLossCnt != nil {
		if n := *f.StaleLossCnt; n < 1 || n > 255 {
			return c, fmt.Errorf("stale_loss_cnt: %d is not 1-255 (net.mptcp.stale_loss_cnt; the kernel's default is 4; leave it out to keep the namespace's)", n)
		}
		c.StaleLossCnt = *f.StaleLossCnt
	}
	if f.CwndClamp != nil && f.CwndClamp.Enabled {
		// Clamps follow the tunnel subflows' measurements.
		if !needProbes(f, &c) {
			return c, fmt.Errorf("cwnd_clamp: needs measurements; set probe_interval (e.g. 100ms)")
		}
	}
	if f.SubflowLowatScale != nil && *f.SubflowLowatScale == LowatScaleRTT {
		// The scaled limit follows the subflows' measured RTTs.
		if !needProbes(f, &c) {
			return c, fmt.Errorf("probe_interval: 0s turns off the measurements subflow_lowat_scale: %s scales by; set one (e.g. 100ms) or leave subflow_lowat_scale out", LowatScaleRTT)
		}
	}
	return c, nil
}

// buildShared validates the shared_bottleneck block onto c.
func buildShared(f File, c *agent.Options) error {
	s := f.SharedBottleneck
	if s == nil {
		return nil
	}
	if !s.Enabled {
		if s.Window != nil {
			return fmt.Errorf("shared_bottleneck.window: set without shared_bottleneck.enabled: true")
		}
		return nil
	}
	if c.Policy != policy.Static {
		return fmt.Errorf("shared_bottleneck: enabled, but the policy is %s (the rule is part of policy: static)", c.Policy)
	}
	if v := s.Window; v != nil {
		if d := v.D(); d < policy.MinSharedWindow || d > policy.MaxSharedWindow {
			return fmt.Errorf("shared_bottleneck.window: %s out of range %s-%s (e.g. 3s)", d, policy.MinSharedWindow, policy.MaxSharedWindow)
		}
		c.SharedWindow = v.D()
	}
	// The rule compares queueing delays sampled every probe.
	needProbes(f, c)
	w := cmp.Or(c.SharedWindow, policy.DefaultSharedWindow)
	if c.ProbeInterval == 0 || w/c.ProbeInterval < policy.MinSharedProbes {
		if f.ProbeInterval != nil {
			// The user's probe_interval is what to change: point there.
			return fmt.Errorf("probe_interval: %s gives %d probes per shared_bottleneck window (%s), the rule needs %d (e.g. 100ms)",
				c.ProbeInterval, probesIn(w, c.ProbeInterval), w, policy.MinSharedProbes)
		}
		return fmt.Errorf("shared_bottleneck: needs %d probes per window (%s), probe_interval is %s (e.g. 100ms)", policy.MinSharedProbes, w, c.ProbeInterval)
	}
	c.SharedBottleneck = true
	return nil
}

// decidingProbeInterval is how often subflows are measured where
// something decides from the measurements (a measuring policy, cwnd_clamp,
// shared_bottleneck, subflow_lowat_scale: rtt) and probe_interval is not
// set.
const decidingProbeInterval = 100 * time.Millisecond

// needProbes gives c the probe interval for something that decides from
// measurements (decidingProbeInterval unless probe_interval is set) and
// reports whether probes run (probe_interval: 0 turns them off: the caller
// refuses that with its own reason).
func needProbes(f File, c *agent.Options) bool {
	if f.ProbeInterval == nil {
		c.ProbeInterval = decidingProbeInterval
	}
	return c.ProbeInterval > 0
}

// probesIn is how many probes every probe fit in w (0 for no probes).
func probesIn(w, probe time.Duration) int64 {
	if probe <= 0 {
		return 0
	}
	return int64(w / probe)
}

// buildClamp validates the cwnd_clamp section.
func buildClamp(f *fileClamp) (*ClampSettings, error) {
	if f == nil {
		return nil, nil
	}
	mode, err := policy.ParseClampMode(f.Mode)
	if err != nil {
		return nil, fmt.Errorf("cwnd_clamp.mode: %w", err)
	}
	if !f.Enabled {
		for _, kv := range [][2]string{{"cgroup", f.Cgroup}, {"mode", f.Mode}} {
			if kv[1] != "" {
				return nil, fmt.Errorf("cwnd_clamp.%s: set without cwnd_clamp.enabled: true", kv[0])
			}
		}
		return nil, nil
	}
	if err := cgroupPath("cwnd_clamp.cgroup", f.Cgroup); err != nil {
		return nil, err
	}
	return &ClampSettings{Mode: mode}, nil
}

// cgroupPath checks a cgroup directory given at key ("" = none): the BPF
// program attaches to exactly that path.
func cgroupPath(key, p string) error {
	if p != "" && (!filepath.IsAbs(p) || filepath.Clean(p) != p) {
		return fmt.Errorf("%s: %q is not a clean absolute path (e.g. /sys/fs/cgroup)", key, p)
	}
	return nil
}

// MinSubflowLowat is the smallest subflow_lowat accepted: below a few
// segments a subflow would wait for the scheduler's next push after every
// burst it sends.
const MinSubflowLowat = 16 << 10

// DefaultSubflowLowat is subflow_lowat when the config does not set it
// (docs/agent.md, "Per-subflow unsent limit (on by default)"): 128 KiB,
// what the bench and OpenMPTCProuter set on their sockets, and what the
// lab's +lowat / -lowat procedures write out.
const DefaultSubflowLowat = 128 << 10

// buildLowat validates subflow_lowat (unset: DefaultSubflowLowat; 0:
// off) and bpf_cgroup, merged with cwnd_clamp's cgroup (clamps:
// cwnd_clamp is on; the program attaches once, to one cgroup).
//
// Unset on a server-role-only agent (a server: section and no detours,
// relays or legacy daemons) is off: its connections are all accepted
// ones, never managed, and the program would still ask for RTT callbacks
// on every MPTCP subflow of its cgroup (docs/agent.md).
func buildLowat(f File, clamps bool) (uint32, string, error) {
	var lowat uint32
	if f.SubflowLowat == nil && !serverRoleOnly(f) {
		lowat = DefaultSubflowLowat
	}
	if f.SubflowLowat != nil {
		switch n := *f.SubflowLowat; {
		case n == 0:
		case n < MinSubflowLowat || n > math.MaxInt32:
			return 0, "", fmt.Errorf("subflow_lowat: %d bytes is not 0 (off) or %d-%d (TCP_NOTSENT_LOWAT of each subflow; 131072 is what OpenMPTCProuter and the bench set on their sockets)", n, MinSubflowLowat, math.MaxInt32)
		default:
			lowat = uint32(n)
		}
	}
	cg := f.BPFCgroup
	if cg != "" {
		if err := cgroupPath("bpf_cgroup", cg); err != nil {
			return 0, "", err
		}
		switch {
		case lowat == 0 && !clamps && f.SubflowLowat == nil:
			return 0, "", fmt.Errorf("bpf_cgroup: set on a server-role-only agent without subflow_lowat or cwnd_clamp (nothing attaches a BPF program: the limit is on by default only with a client role)")
		case lowat == 0 && !clamps:
			return 0, "", fmt.Errorf("bpf_cgroup: set with subflow_lowat: 0 and without cwnd_clamp (nothing attaches a BPF program)")
		}
	}
	if clamps && f.CwndClamp.Cgroup != "" {
		if cg != "" && cg != f.CwndClamp.Cgroup {
			return 0, "", fmt.Errorf("bpf_cgroup: %q differs from cwnd_clamp.cgroup %q: the agent's one BPF program attaches to one cgroup (set one of them)", cg, f.CwndClamp.Cgroup)
		}
		cg = f.CwndClamp.Cgroup
	}
	return lowat, cg, nil
}

// serverRoleOnly says whether f has the server role and no client one
// (no detour source: detours, relays, legacy_v1).
func serverRoleOnly(f File) bool {
	return f.Server != nil && len(f.Detours) == 0 && f.Relays == nil && len(f.LegacyV1) == 0
}

// buildKinds validates the detour kinds' sections into c.
func buildKinds(f File, c Config) (Config, error) {
	names := map[string]bool{}
	for i, d := range f.Detours {
		sd, err := parseDetour(d)
		if err != nil {
			return c, fmt.Errorf("detours[%d].%v", i, err)
		}
		k := policy.Key(sd.Detour)
		if names[k] {
			return c, fmt.Errorf("detours[%d]: duplicate of an earlier detour (%s)", i, sd.Detour)
		}
		names[k] = true
		c.Detours = append(c.Detours, sd)
	}
	if f.Relays != nil {
		sc, err := f.Relays.Build()
		if err != nil {
			return c, fmt.Errorf("relays.%v", err)
		}
		c.Relays = &sc
	}
	if f.Tunnels && c.Relays == nil {
		return c, fmt.Errorf("tunnels: needs a relays section (tunnels are asked from the relays)")
	}
	c.Tunnels = f.Tunnels
	if f.Convert != nil && f.Convert.Enabled {
		var names []string
		if c.Relays != nil {
			for _, r := range c.Relays.Relays {
				names = append(names, r.Name)
				if r.Entry != r.Name && !slices.Contains(names, r.Entry) {
					names = append(names, r.Entry)
				}
			}
		}
		cs, err := f.Convert.Build(names)
		if err != nil {
			return c, fmt.Errorf("convert.%v", err)
		}
		c.Convert = &cs
	}
	if f.Server != nil {
		sc, err := f.Server.Build()
		if err != nil {
			return c, fmt.Errorf("server.%v", err)
		}
		c.Server = &sc
	}
	switch f.TunnelKind {
	case "", "wireguard", "vxlan":
		if f.TunnelKind != "" && !f.Tunnels {
			return c, fmt.Errorf("tunnel_kind: set, but tunnels is not true")
		}
		c.TunnelKind = f.TunnelKind
	default:
		return c, fmt.Errorf("tunnel_kind: %q is not wireguard or vxlan (vxlan: unencrypted, trusted networks only)", f.TunnelKind)
	}
	if f.PathCheck && c.Relays == nil {
		return c, fmt.Errorf("path_check: needs a relays section (it checks the NAT detours relays grant)")
	}
	c.PathCheck = f.PathCheck
	if f.RelayPing != nil {
		if f.Relays == nil {
			return c, fmt.Errorf("relay_ping: set, but there is no relays section")
		}
		if v := f.RelayPing.D(); v < time.Second || v > 10*time.Minute {
			return c, fmt.Errorf("relay_ping: %s out of range 1s-10m", v)
		}
		c.RelayPing = f.RelayPing.D()
	}
	for i, l := range f.LegacyV1 {
		ap, err := netip.ParseAddrPort(l.Address)
		if err != nil || !ap.Addr().Unmap().Is4() || !usable(ap.Addr()) || ap.Port() == 0 {
			return c, fmt.Errorf("legacy_v1[%d].address: %q is not a usable IPv4 ADDRESS:PORT (v1 daemons listen on 45672)", i, l.Address)
		}
		if l.Name == "" {
			return c, fmt.Errorf("legacy_v1[%d].name: missing (a name for logs and status)", i)
		}
		r := legacyclient.Relay{Name: l.Name, Addr: ap, Lease: c.LegacyLease}
		if l.Lease != nil {
			if v := l.Lease.D(); v < 10*time.Second || v > 24*time.Hour {
				return c, fmt.Errorf("legacy_v1[%d].lease: %s out of range 10s-24h (the daemon's lease; v1 cannot renew)", i, v)
			}
			r.Lease = l.Lease.D() // this daemon's alone
		}
		for j, o := range c.LegacyV1 {
			if o.Name == l.Name {
				return c, fmt.Errorf("legacy_v1[%d].name: %q already names legacy_v1[%d]", i, l.Name, j)
			}
		}
		c.LegacyV1 = append(c.LegacyV1, r)
	}
	return c, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("bad prefix %q", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad address or prefix %q", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseOtherFamily checks the mapping: every address usable (no loopback,
// link-local, multicast, IPv4-mapped), the other family than its server's,
// each server once.
func parseOtherFamily(fs []fileOther) (map[netip.Addr][]netip.Addr, error) {
	if len(fs) == 0 {
		return nil, nil
	}
	m := map[netip.Addr][]netip.Addr{}
	parse := func(field, s string) (netip.Addr, error) {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
			return a, fmt.Errorf("%s: bad address %q", field, s)
		case a.Is4In6():
			return a, fmt.Errorf("%s: %s is IPv4-mapped; write the IPv4 address", field, s)
		case a.Zone() != "" || !usable(a):
			return a, fmt.Errorf("%s: %s is not a server address (loopback, link-local, multicast or unspecified)", field, s)
		}
		return a, nil
	}
	for i, o := range fs {
		srv, err := parse(fmt.Sprintf("other_family[%d].server", i), o.Server)
		if err != nil {
			return nil, err
		}
		if _, dup := m[srv]; dup {
			return nil, fmt.Errorf("other_family[%d].server: %s listed twice", i, srv)
		}
		if len(o.Addresses) == 0 {
			return nil, fmt.Errorf("other_family[%d].addresses: missing", i)
		}
		for j, s := range o.Addresses {
			a, err := parse(fmt.Sprintf("other_family[%d].addresses[%d]", i, j), s)
			if err != nil {
				return nil, err
			}
			if a.Is4() == srv.Is4() {
				return nil, fmt.Errorf("other_family[%d].addresses[%d]: %s is of the server's own family; list the server's address of the other one", i, j, a)
			}
			m[srv] = append(m[srv], a)
		}
	}
	return m, nil
}

func usable(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() && !a.IsLinkLocalUnicast()
}

// parseDetour's errors start with the field name (the caller adds detours[i].).
func parseDetour(d fileDetour) (static.Entry, error) {
	var sd static.Entry
	if d.Relay == "" {
		return sd, fmt.Errorf("relay: missing (a name for logs and status)")
	}
	sd.Detour.Relay = d.Relay
	sd.Detour.Backup = d.Backup
	switch d.Kind {
	case "nat":
		sd.Detour.Kind = detour.NAT
		if d.Local != "" || len(d.Servers) > 0 {
			return sd, fmt.Errorf("kind: nat detours take address and server, not local/servers")
		}
		ap, err := netip.ParseAddrPort(d.Address)
		if err != nil || !usable(ap.Addr()) || ap.Port() == 0 {
			return sd, fmt.Errorf("address: %q is not a usable relay ADDRESS:PORT", d.Address)
		}
		sd.Detour.Remote = ap
		srv, err := netip.ParseAddrPort(d.Server)
		if err != nil || !usable(srv.Addr()) || srv.Port() == 0 {
			return sd, fmt.Errorf("server: %q is not a usable SERVER:PORT (where the relay forwards)", d.Server)
		}
		sd.Servers = []netip.Prefix{netip.PrefixFrom(srv.Addr(), srv.Addr().BitLen())}
		sd.Port = srv.Port()
	case "tunnel":
		sd.Detour.Kind = detour.Tunnel
		if d.Address != "" || d.Server != "" {
			return sd, fmt.Errorf("kind: tunnel detours take local and servers, not address/server")
		}
		a, err := netip.ParseAddr(d.Local)
		if err != nil || !usable(a) {
			return sd, fmt.Errorf("local: %q is not a usable tunnel address", d.Local)
		}
		sd.Detour.Local = a
		for j, s := range d.Servers {
			p, err := parsePrefix(s)
			if err != nil {
				return sd, fmt.Errorf("servers[%d]: %v", j, err)
			}
			sd.Servers = append(sd.Servers, p)
		}
	case "":
		return sd, fmt.Errorf("kind: missing (nat or tunnel)")
	default:
		return sd, fmt.Errorf("kind: %q is not nat or tunnel", d.Kind)
	}
	return sd, nil
}

// subflow_lowat_scale's values.
const (
	// LowatScaleNone: every subflow's limit is subflow_lowat (the
	// default).
	LowatScaleNone = "none"
	// LowatScaleRTT: each subflow's limit is the bytes it sends while the
	// connection's slowest subflow makes one round trip, between
	// subflow_lowat and the agent's namespace's tcp_wmem maximum (lowat.go).
	LowatScaleRTT = "rtt"
)

// buildLowatScale validates subflow_lowat_scale (unset: none) against
// subflow_lowat (lowat; 0: off).
func buildLowatScale(f File, lowat uint32) (string, error) {
	if f.SubflowLowatScale == nil {
		return LowatScaleNone, nil
	}
	switch v := *f.SubflowLowatScale; v {
	case LowatScaleNone:
		return v, nil
	case LowatScaleRTT:
		if lowat == 0 {
			return "", fmt.Errorf("subflow_lowat_scale: %s needs subflow_lowat > 0 (the scaled limit's floor, e.g. %d, the default with a client role)", v, DefaultSubflowLowat)
		}
		return v, nil
	default:
		return "", fmt.Errorf("subflow_lowat_scale: %q is not %s (every subflow gets subflow_lowat) or %s (scaled to the subflows' RTTs, subflow_lowat the floor)", v, LowatScaleNone, LowatScaleRTT)
	}
}
