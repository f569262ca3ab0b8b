package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/relayclient"
)

// DefaultSocket is where the agent serves its status.
const DefaultSocket = "/run/mpdetour/agent.sock"

// Config is the validated agent configuration (docs/agent.md).
type Config struct {
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
	// Policy chooses subflows: static (keep N) or adaptive (measure, keep
	// the best, back up, fail over); Watchdog, Window and Hold tune the
	// adaptive one (policy.Config).
	Policy                 policy.Mode
	Watchdog, Window, Hold time.Duration
	CommandWorkers         int
	// Nice, when non-zero, is applied to the agent's threads at start.
	Nice int
	// EventBuffer is the event socket's receive buffer in bytes.
	EventBuffer int
	LogLevel    string
	Selectors   []policy.Selector
	Detours     []StaticDetour
	// Relays, when set, are asked for NAT detours (relayclient.Source).
	Relays *relayclient.SourceConfig
	// Tunnels: also ask every relay for a WireGuard tunnel detour.
	Tunnels bool
}

// StaticDetour is a detour written in the config (until relays hand them out).
type StaticDetour struct {
	Detour detour.Detour
	// Servers are the destinations the detour reaches: for a NAT detour the
	// one server:port its DNAT leads to; for a tunnel, prefixes (any if empty).
	Servers []netip.Prefix
	Port    uint16 // NAT detours: the server port
}

type fileConfig struct {
	NetNS             string       `yaml:"netns"`
	Socket            string       `yaml:"socket"`
	Subflows          *int         `yaml:"subflows"`
	AnnouncedSubflows *int         `yaml:"announced_subflows"`
	MaxConnections    int          `yaml:"max_connections"`
	Backoff           string       `yaml:"backoff"`
	MaxBackoff        string       `yaml:"max_backoff"`
	ConnectTimeout    string       `yaml:"connect_timeout"`
	ProbeInterval     string       `yaml:"probe_interval"`
	StallRetransmits  *int         `yaml:"stall_retransmits"`
	CommandWorkers    int          `yaml:"command_workers"`
	Nice              int          `yaml:"nice"`
	EventBuffer       int          `yaml:"event_buffer"`
	LogLevel          string       `yaml:"log_level"`
	Selectors         []fileSel    `yaml:"selectors"`
	Detours           []fileDetour `yaml:"detours"`
	// Relays is documented in docs/relay.md (relayclient.FileConfig).
	Relays  *relayclient.FileConfig `yaml:"relays"`
	Tunnels bool                    `yaml:"tunnels"`
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
	Servers []string `yaml:"servers"` // tunnel: reachable prefixes
}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses YAML; errors name the offending field.
func ParseConfig(b []byte) (Config, error) {
	var f fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, yamlError(b, err)
	}
	c := Config{
		NetNS: f.NetNS, Socket: f.Socket, Subflows: 2, AnnouncedSubflows: 2,
		MaxConnections: f.MaxConnections, CommandWorkers: f.CommandWorkers, LogLevel: f.LogLevel,
		Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, ProbeInterval: time.Second, StallRetransmits: 3,
	}
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
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
	if c.MaxConnections < 0 {
		return c, fmt.Errorf("max_connections: must not be negative")
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 65536
	}
	if c.CommandWorkers < 0 || c.CommandWorkers > 64 {
		return c, fmt.Errorf("command_workers: %d out of range 1-64", c.CommandWorkers)
	}
	if c.CommandWorkers == 0 {
		// SUBFLOW_CREATE does the connect in the caller's syscall; with
		// one or two sockets bursts queue up (docs/agent.md, benchmark).
		c.CommandWorkers = 4
	}
	if f.Nice < -20 || f.Nice > 19 {
		return c, fmt.Errorf("nice: %d out of range -20..19", f.Nice)
	}
	c.Nice = f.Nice
	c.EventBuffer = f.EventBuffer
	if c.EventBuffer < 0 || c.EventBuffer > 1<<30 {
		return c, fmt.Errorf("event_buffer: %d bytes out of range 1-1073741824", c.EventBuffer)
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = 8 << 20
	}
	switch strings.ToLower(c.LogLevel) {
	case "", "debug", "info", "warn", "error":
	default:
		return c, fmt.Errorf("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	for name, pair := range map[string]struct {
		s string
		d *time.Duration
	}{"backoff": {f.Backoff, &c.Backoff}, "max_backoff": {f.MaxBackoff, &c.MaxBackoff},
		"connect_timeout": {f.ConnectTimeout, &c.ConnectTimeout}, "probe_interval": {f.ProbeInterval, &c.ProbeInterval}} {
		if pair.s == "" || name == "probe_interval" && (pair.s == "0" || pair.s == "0s") {
			continue
		}
		d, err := time.ParseDuration(pair.s)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("%s: %q is not a positive duration (e.g. 1s)", name, pair.s)
		}
		*pair.d = d
	}
	if f.ProbeInterval == "0" || f.ProbeInterval == "0s" {
		c.ProbeInterval = 0
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

func usable(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() && !a.IsLinkLocalUnicast()
}

// parseDetour's errors start with the field name (the caller adds detours[i].).
func parseDetour(d fileDetour) (StaticDetour, error) {
	var sd StaticDetour
	if d.Relay == "" {
		return sd, fmt.Errorf("relay: missing (a name for logs and status)")
	}
	sd.Detour.Relay = d.Relay
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

// yamlError rewrites yaml.v3's "line N: cannot unmarshal ..." so that it
// names the field at that line (yaml.v3 only names unknown fields).
func yamlError(src []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var root yaml.Node
	_ = yaml.Unmarshal(src, &root)
	var msgs []string
	for _, m := range te.Errors {
		var line int
		if _, serr := fmt.Sscanf(m, "line %d:", &line); serr == nil {
			if f := fieldAtLine(&root, line, ""); f != "" && !strings.Contains(m, "field "+f) {
				m = f + ": " + m
			}
		}
		msgs = append(msgs, m)
	}
	return errors.New(strings.Join(msgs, "; "))
}

func fieldAtLine(n *yaml.Node, line int, path string) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if f := fieldAtLine(c, line, path); f != "" {
				return f
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if f := fieldAtLine(v, line, p); f != "" {
				return f
			}
			if k.Line == line || v.Line == line && v.Kind == yaml.ScalarNode {
				return p
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if f := fieldAtLine(c, line, p); f != "" {
				return f
			}
			if c.Kind == yaml.ScalarNode && c.Line == line {
				return p
			}
		}
	}
	return ""
}
