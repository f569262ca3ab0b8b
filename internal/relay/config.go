package relay

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// DefaultPort is the v2 control port.
const DefaultPort = 45673

// File is the relay's configuration file (YAML, documented in docs/relay.md).
type File struct {
	Listen         string `yaml:"listen"`           // UDP address of the control protocol
	PrivateKey     string `yaml:"private_key"`      // base64; or:
	PrivateKeyFile string `yaml:"private_key_file"` // file holding the base64 key
	// Key rotation: the key replaced, still accepted for handshakes
	// addressed to it (members that know only the old public key) until it
	// is removed from the configuration.
	PreviousPrivateKey     string          `yaml:"previous_private_key"`
	PreviousPrivateKeyFile string          `yaml:"previous_private_key_file"`
	DetourAddress          string          `yaml:"detour_address"` // address clients connect to; default: where the request arrived
	Ports                  string          `yaml:"ports"`          // detour port range "lo-hi"
	Lease                  config.Duration `yaml:"lease"`
	Members                []Member        `yaml:"members"`

	AllowDestinations []string `yaml:"allow_destinations"` // prefixes allowed although special (private, own networks...)
	DenyDestinations  []string `yaml:"deny_destinations"`  // extra prefixes always refused
	DenyPorts         []uint16 `yaml:"deny_ports"`         // destination ports refused; default [25]

	Quota struct {
		PerMember int `yaml:"per_member"`
		Global    int `yaml:"global"`
	} `yaml:"quota"`
	Rate struct {
		PerMember float64 `yaml:"per_member"` // requests per second
		Burst     int     `yaml:"burst"`
	} `yaml:"rate"`

	AttributionLog   string          `yaml:"attribution_log"`   // file path, "-" for stdout, "" for none
	AttributionFlush config.Duration `yaml:"attribution_flush"` // running counts of active mappings written this often
	StateFile        string          `yaml:"state_file"`        // replay protection across restarts; "" = none
	Metrics          struct {
		Listen string `yaml:"listen"` // e.g. 127.0.0.1:9464; empty = off
	} `yaml:"metrics"`

	LegacyV1 struct {
		Enabled   bool            `yaml:"enabled"`
		Listen    string          `yaml:"listen"`
		Lease     config.Duration `yaml:"lease"`
		PerClient int             `yaml:"per_client"` // mapping quota per client address
	} `yaml:"legacy_v1"`

	// Collective: accept members certified by this authority besides the
	// static list (docs/collective.md).
	Collective struct {
		Authority string `yaml:"authority"` // the authority's public key (mpdetour collective show)
		CRLFile   string `yaml:"crl_file"`  // signed revocation list, re-read when it changes
		// CertificateFile is this relay's own certificate (role relay),
		// needed by gossip; Gossip joins the roster cluster (gossip.go).
		CertificateFile string      `yaml:"certificate_file"`
		Gossip          *GossipFile `yaml:"gossip"`
	} `yaml:"collective"`

	// Convert is the RFC 8803 converter role (docs/convert.md); off unless
	// enabled.
	Convert struct {
		Enabled      bool            `yaml:"enabled"`
		Listen       string          `yaml:"listen"`        // TCP address; default 0.0.0.0:45674
		MaxConns     int             `yaml:"max_conns"`     // conversions at once; default 1024
		StallTimeout config.Duration `yaml:"stall_timeout"` // end a conversion whose peer stops reading; default 2m, 0s = never
	} `yaml:"convert"`

	// FastPath offloads established detour connections to a software
	// flowtable (default false; docs/relay.md).
	FastPath bool `yaml:"fast_path"`

	// FairShare: ledger, receipts and capacity (docs/collective.md).
	FairShare FairShareFile `yaml:"fair_share"`

	// Tunnel is handed to the tunnel factory (TunnelFactory) as a section
	// of the file; absent = no tunnel detours.
	Tunnel config.Node `yaml:"tunnel"`
}

// Member is one client identity allowed to use the relay.
type Member struct {
	Name      string `yaml:"name"`
	PublicKey string `yaml:"public_key"`
}

// Config is a validated configuration: what applies at start only
// (Static) and what a reload changes at once (Reloadable).
type Config struct {
	Static
	Reloadable
}

// Static is the part of the configuration a reload does not change: a
// reload with other values is applied only at the next start (the relay
// says so in its log).
type Static struct {
	Listen        netip.AddrPort
	StateFile     string
	MetricsListen string

	Legacy       bool
	LegacyListen netip.AddrPort

	// Convert: the converter role (Convert.Enabled false: off).
	Convert ConvertConfig

	// FastPath: flowtable offload of established detour connections,
	// attribution through conntrack accounting.
	FastPath bool

	// Tunnel is the `tunnel:` section (nil: none), for the TunnelFactory.
	Tunnel *config.Doc
}

// Reloadable is the part of the configuration a reload (SIGHUP) applies
// at once.
type Reloadable struct {
	PrivateKey proto.Key
	// PreviousKey (zero: none) is a replaced key whose handshakes are still
	// answered (key rotation, docs/relay.md).
	PreviousKey   proto.Key
	DetourAddress netip.Addr // zero = the request's destination address
	PortLo        uint16
	PortHi        uint16
	Lease         time.Duration
	Members       map[proto.Key]string // public key -> name

	Allow     []netip.Prefix
	Deny      []netip.Prefix
	DenyPorts map[uint16]bool

	QuotaPerMember int
	QuotaGlobal    int
	Rate           float64
	Burst          int

	AttributionLog   string
	AttributionFlush time.Duration

	LegacyLease     time.Duration
	LegacyPerClient int

	// Trust is the collective's authority and the revocation list of
	// CRLFile as read from the file (nil: static members only). The
	// running relay's live trust is its trust part's (trust.go), which
	// keeps the newest list seen across reloads; CRLFile is re-read when
	// it changes.
	Trust   *collective.Trust
	CRLFile string
	// Gossip: relay discovery (nil: off; gossip.go). Applied at start, and
	// again when the relay key changes.
	Gossip *GossipConfig

	// Fair is the validated `fair_share:` section (its ledger_file applies
	// at start only).
	Fair FairConfig
}

// ConvertConfig are the validated `convert:` section.
type ConvertConfig struct {
	Enabled      bool
	Listen       netip.AddrPort
	MaxConns     int
	StallTimeout time.Duration
}

// LoadConfig reads and validates a configuration file; errors name
// file:line:column and the field.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	return parseConfig(path, b)
}

// ParseConfig validates a configuration (errors positioned in "config").
func ParseConfig(b []byte) (*Config, error) { return parseConfig("config", b) }

func parseConfig(name string, b []byte) (*Config, error) {
	var c File
	doc, err := config.Parse(name, b, &c)
	if err != nil {
		return nil, err
	}
	if doc.Empty() {
		return nil, &config.Error{File: name, Msg: "empty configuration"}
	}
	s, err := build(&c)
	if err != nil {
		return nil, doc.Locate(err)
	}
	if c.Tunnel.Kind != 0 {
		n := c.Tunnel
		s.Tunnel = config.NewDoc(name, "tunnel", &n)
	}
	return s, nil
}

// build validates the decoded file; every error starts with the field path.
func build(c *File) (*Config, error) {
	s := &Config{
		Static: Static{
			MetricsListen: c.Metrics.Listen,
			StateFile:     c.StateFile,
			Legacy:        c.LegacyV1.Enabled,
			FastPath:      c.FastPath,
		},
		Reloadable: Reloadable{
			Lease:            2 * time.Minute,
			PortLo:           20000,
			PortHi:           59999,
			Members:          map[proto.Key]string{},
			DenyPorts:        map[uint16]bool{25: true},
			QuotaPerMember:   256,
			QuotaGlobal:      100000,
			Rate:             50,
			Burst:            100,
			AttributionLog:   c.AttributionLog,
			AttributionFlush: time.Minute,
			LegacyLease:      10 * time.Minute,
			LegacyPerClient:  16,
		},
	}
	var err error
	listen := c.Listen
	if listen == "" {
		listen = "0.0.0.0:" + strconv.Itoa(DefaultPort)
	}
	if s.Listen, err = netip.ParseAddrPort(listen); err != nil {
		return nil, fmt.Errorf("listen: %q is not address:port: %w", listen, err)
	}
	if !s.Listen.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("listen: %v: only IPv4 is supported (the NAT data plane is IPv4)", s.Listen)
	}
	switch {
	case c.PrivateKey != "" && c.PrivateKeyFile != "":
		return nil, errors.New("private_key_file: private_key and private_key_file are exclusive")
	case c.PrivateKeyFile != "":
		if s.PrivateKey, err = config.ReadKeyFile(c.PrivateKeyFile, proto.ParseKey); err != nil {
			return nil, fmt.Errorf("private_key_file: %w", err)
		}
	case c.PrivateKey == "":
		return nil, errors.New("private_key (or private_key_file) is required; create one with `mpdetour relay genkey`")
	default:
		if s.PrivateKey, err = proto.ParseKey(c.PrivateKey); err != nil {
			return nil, fmt.Errorf("private_key: %w", err)
		}
	}
	switch {
	case c.PreviousPrivateKey != "" && c.PreviousPrivateKeyFile != "":
		return nil, errors.New("previous_private_key_file: previous_private_key and previous_private_key_file are exclusive")
	case c.PreviousPrivateKeyFile != "":
		if s.PreviousKey, err = config.ReadKeyFile(c.PreviousPrivateKeyFile, proto.ParseKey); err != nil {
			return nil, fmt.Errorf("previous_private_key_file: %w", err)
		}
	case c.PreviousPrivateKey != "":
		if s.PreviousKey, err = proto.ParseKey(c.PreviousPrivateKey); err != nil {
			return nil, fmt.Errorf("previous_private_key: %w", err)
		}
	}
	if !s.PreviousKey.IsZero() {
		if s.PreviousKey == s.PrivateKey {
			return nil, errors.New("previous_private_key: the same key as private_key")
		}
	}
	if c.DetourAddress != "" {
		if s.DetourAddress, err = netip.ParseAddr(c.DetourAddress); err != nil || !s.DetourAddress.Is4() {
			return nil, fmt.Errorf("detour_address: %q is not an IPv4 address", c.DetourAddress)
		}
	}
	if c.Ports != "" {
		lo, hi, ok := strings.Cut(c.Ports, "-")
		l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
		h, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
		if !ok || err1 != nil || err2 != nil || l == 0 || l > h {
			return nil, fmt.Errorf("ports: %q is not a range lo-hi within 1-65535", c.Ports)
		}
		s.PortLo, s.PortHi = uint16(l), uint16(h)
	}
	if c.AttributionFlush != 0 {
		s.AttributionFlush = time.Duration(c.AttributionFlush)
		if s.AttributionFlush < time.Second || s.AttributionFlush > time.Hour {
			return nil, fmt.Errorf("attribution_flush: %v is outside 1s..1h", s.AttributionFlush)
		}
	}
	if c.Lease != 0 {
		s.Lease = time.Duration(c.Lease)
		if s.Lease < 2*time.Second || s.Lease > 24*time.Hour {
			return nil, fmt.Errorf("lease: %v is outside 2s..24h", s.Lease)
		}
	}
	if c.Collective.Authority != "" {
		ak, err := collective.ParseAuthorityKey(c.Collective.Authority)
		if err != nil {
			return nil, fmt.Errorf("collective.authority: %w", err)
		}
		s.Trust = collective.NewTrust(ak)
		if f := c.Collective.CRLFile; f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("collective.crl_file: %w", err)
			}
			if err := s.Trust.UpdateCRL(string(b)); err != nil {
				return nil, fmt.Errorf("collective.crl_file: %s: %w", f, err)
			}
			s.CRLFile = f
		}
	} else if c.Collective.CRLFile != "" {
		return nil, errors.New("collective.crl_file: needs collective.authority")
	}
	if s.Gossip, err = buildGossip(c, s); err != nil {
		return nil, err
	}
	if len(c.Members) == 0 && !c.LegacyV1.Enabled && s.Trust == nil {
		return nil, errors.New("members: no member keys, nobody could use the relay")
	}
	names := map[string]bool{}
	for i, m := range c.Members {
		if m.Name == "" {
			return nil, fmt.Errorf("members[%d].name: required", i)
		}
		if names[m.Name] {
			return nil, fmt.Errorf("members[%d]: duplicate name %q", i, m.Name)
		}
		names[m.Name] = true
		k, err := proto.ParseKey(m.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("members[%d].public_key: %s: %w", i, m.Name, err)
		}
		if prev, dup := s.Members[k]; dup {
			return nil, fmt.Errorf("members[%d] (%s): same key as %s", i, m.Name, prev)
		}
		s.Members[k] = m.Name
	}
	for i, p := range c.AllowDestinations {
		pf, err := parsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("allow_destinations[%d]: %w", i, err)
		}
		s.Allow = append(s.Allow, pf)
	}
	for i, p := range c.DenyDestinations {
		pf, err := parsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("deny_destinations[%d]: %w", i, err)
		}
		s.Deny = append(s.Deny, pf)
	}
	if c.DenyPorts != nil {
		s.DenyPorts = map[uint16]bool{}
		for _, p := range c.DenyPorts {
			s.DenyPorts[p] = true
		}
	}
	if c.Quota.PerMember < 0 || c.Quota.Global < 0 {
		return nil, errors.New("quota: values must be positive")
	}
	if c.Quota.PerMember > 0 {
		s.QuotaPerMember = c.Quota.PerMember
	}
	if c.Quota.Global > 0 {
		s.QuotaGlobal = c.Quota.Global
	}
	if c.Rate.PerMember < 0 || c.Rate.Burst < 0 {
		return nil, errors.New("rate: values must be positive")
	}
	if c.Rate.PerMember > 0 {
		s.Rate = c.Rate.PerMember
	}
	if c.Rate.Burst > 0 {
		s.Burst = c.Rate.Burst
	}
	if s.Legacy {
		ll := c.LegacyV1.Listen
		if ll == "" {
			ll = "0.0.0.0:" + strconv.Itoa(proto.LegacyPort)
		}
		if s.LegacyListen, err = netip.ParseAddrPort(ll); err != nil || !s.LegacyListen.Addr().Is4() {
			return nil, fmt.Errorf("legacy_v1.listen: %q is not an IPv4 address:port", ll)
		}
		if c.LegacyV1.Lease != 0 {
			s.LegacyLease = time.Duration(c.LegacyV1.Lease)
			if s.LegacyLease < 10*time.Second {
				return nil, fmt.Errorf("legacy_v1.lease: %v is shorter than 10s", s.LegacyLease)
			}
		}
		if c.LegacyV1.PerClient < 0 {
			return nil, errors.New("legacy_v1.per_client: must be positive")
		}
		if c.LegacyV1.PerClient > 0 {
			s.LegacyPerClient = c.LegacyV1.PerClient
		}
	}
	if cv := c.Convert; cv.Enabled {
		s.Convert = ConvertConfig{Enabled: true, MaxConns: 1024, StallTimeout: 2 * time.Minute}
		l := cv.Listen
		if l == "" {
			l = "0.0.0.0:" + strconv.Itoa(DefaultConvertPort)
		}
		if s.Convert.Listen, err = netip.ParseAddrPort(l); err != nil || !s.Convert.Listen.Addr().Is4() || s.Convert.Listen.Port() == 0 {
			return nil, fmt.Errorf("convert.listen: %q is not an IPv4 address:port", l)
		}
		if cv.MaxConns < 0 {
			return nil, errors.New("convert.max_conns: must be positive")
		}
		if cv.MaxConns > 0 {
			s.Convert.MaxConns = cv.MaxConns
		}
		if cv.StallTimeout < 0 {
			return nil, errors.New("convert.stall_timeout: must not be negative")
		}
		if cv.StallTimeout != 0 {
			s.Convert.StallTimeout = time.Duration(cv.StallTimeout)
		}
	}
	if s.Fair, err = buildFair(&c.FairShare, s.StateFile); err != nil {
		return nil, err
	}
	if g := s.Gossip; g != nil && c.Collective.Gossip != nil && c.Collective.Gossip.Capacity == 0 && s.Fair.Capacity > 0 && uint32(s.Fair.Capacity) < g.Capacity {
		// The roster's default capacity is what the relay serves before
		// credit decides: agents rank relays by load / capacity.
		g.Capacity = uint32(s.Fair.Capacity)
	}
	if c.Metrics.Listen != "" {
		if _, err := netip.ParseAddrPort(c.Metrics.Listen); err != nil {
			return nil, fmt.Errorf("metrics.listen: %q is not address:port", c.Metrics.Listen)
		}
	}
	return s, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Masked() != p {
			return p, fmt.Errorf("%q has host bits set (did you mean %v?)", s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a prefix nor an address", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
