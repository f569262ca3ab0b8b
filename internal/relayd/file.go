package relayd

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
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/metricsrv"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// The relay's configuration file: File is its YAML form (strict, errors
// file:line:column and the field), relay.Config the validated form the
// relay core takes (relay.Static applies at start only, relay.Reloadable
// on SIGHUP too).

// File is the relay's configuration file (YAML, documented in docs/relay.md).
type File struct {
	Listen         string `yaml:"listen"`           // UDP address of the control protocol (IPv4)
	Listen6        string `yaml:"listen6"`          // IPv6 UDP address of the control protocol; empty = none (no IPv6 detours)
	PrivateKey     string `yaml:"private_key"`      // base64; or:
	PrivateKeyFile string `yaml:"private_key_file"` // file holding the base64 key
	// Key rotation: the key replaced, still accepted for handshakes
	// addressed to it (members that know only the old public key) until it
	// is removed from the configuration.
	PreviousPrivateKey     string          `yaml:"previous_private_key"`
	PreviousPrivateKeyFile string          `yaml:"previous_private_key_file"`
	DetourAddress          string          `yaml:"detour_address"`  // address clients connect to; default: where the request arrived
	DetourAddress6         string          `yaml:"detour_address6"` // the same for sessions over IPv6
	Ports                  string          `yaml:"ports"`           // detour port range "lo-hi"
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
		Listen    string `yaml:"listen"`     // e.g. 127.0.0.1:9464, or unix:/PATH (mode 0600); empty = off
		TokenFile string `yaml:"token_file"` // bearer token every scrape must send (metricsrv)
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
		Listen6      string          `yaml:"listen6"`       // IPv6 TCP address; default none (sessions over IPv6 get no tickets)
		MaxConns     int             `yaml:"max_conns"`     // conversions at once; default 1024
		StallTimeout config.Duration `yaml:"stall_timeout"` // end a conversion whose peer stops reading; default 2m, 0s = never
	} `yaml:"convert"`

	// FastPath offloads established detour connections to a software
	// flowtable (default false; docs/relay.md).
	FastPath bool `yaml:"fast_path"`

	// ReceiveBuffer: the control sockets' receive buffer in bytes
	// (default relay.DefaultReceiveBuffer, 0: the kernel's default).
	ReceiveBuffer *int `yaml:"receive_buffer"`

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
	// PreviousPublicKey is the member's key before a rotation under way
	// (docs/collective.md, "Static member lists"): both keys are the
	// member's until the operator removes this line.
	PreviousPublicKey string `yaml:"previous_public_key"`
}

// GossipFile is the `collective.gossip` section.
type GossipFile struct {
	Bind          string          `yaml:"bind"`           // gossip UDP+TCP address; default 0.0.0.0:45675
	Advertise     string          `yaml:"advertise"`      // what other relays dial; default bind (must then be specific)
	Join          []string        `yaml:"join"`           // gossip addresses of relays in the cluster
	Announce      []string        `yaml:"announce"`       // control addresses agents use; default listen, or advertise's address with listen's port
	Region        string          `yaml:"region"`         // label, 0-32 bytes
	Capacity      int             `yaml:"capacity"`       // detours offered at once; default quota.global
	SecretFile    string          `yaml:"secret_file"`    // required: base64 32-byte key authenticating and encrypting gossip
	ProbeInterval config.Duration `yaml:"probe_interval"` // default 500ms
	ProbeTimeout  config.Duration `yaml:"probe_timeout"`  // default 250ms
	// Tuning of memberlist at scale (docs/collective.md, "Scale"; 0 or
	// absent: the defaults).
	SuspicionMult    int             `yaml:"suspicion_mult"`     // default 2
	SuspicionMaxMult int             `yaml:"suspicion_max_mult"` // default 2
	GossipNodes      int             `yaml:"gossip_nodes"`       // default 3
	GossipInterval   config.Duration `yaml:"gossip_interval"`    // default 200ms
	PushPullInterval config.Duration `yaml:"push_pull_interval"` // default 90s (memberlist scales it with log2(N/32))
	RetransmitMult   int             `yaml:"retransmit_mult"`    // default 6
}

// tuning checks the section's tuning settings.
func (gc *GossipFile) tuning() (relay.GossipTuning, error) {
	t := relay.GossipTuning{SuspicionMult: gc.SuspicionMult, SuspicionMaxMult: gc.SuspicionMaxMult, GossipNodes: gc.GossipNodes, RetransmitMult: gc.RetransmitMult,
		GossipInterval: time.Duration(gc.GossipInterval), PushPullInterval: time.Duration(gc.PushPullInterval)}
	for _, c := range []struct {
		name   string
		v, max int
	}{{"suspicion_mult", t.SuspicionMult, 20}, {"suspicion_max_mult", t.SuspicionMaxMult, 20}, {"gossip_nodes", t.GossipNodes, 20}, {"retransmit_mult", t.RetransmitMult, 30}} {
		if c.v < 0 || c.v > c.max {
			return t, fmt.Errorf("collective.gossip.%s: %d is outside 1..%d", c.name, c.v, c.max)
		}
	}
	if t.GossipInterval != 0 && (t.GossipInterval < 10*time.Millisecond || t.GossipInterval > 10*time.Second) {
		return t, fmt.Errorf("collective.gossip.gossip_interval: %v is outside 10ms..10s", t.GossipInterval)
	}
	if t.PushPullInterval != 0 && (t.PushPullInterval < time.Second || t.PushPullInterval > time.Hour) {
		return t, fmt.Errorf("collective.gossip.push_pull_interval: %v is outside 1s..1h", t.PushPullInterval)
	}
	return t, nil
}

// FairShareFile is the `fair_share:` section of the relay's file.
type FairShareFile struct {
	// Capacity: NAT mappings at once before credit decides who is served
	// (0 = no such limit; quota.global still applies).
	Capacity int `yaml:"capacity"`
	// LedgerFile: where the ledger is kept; default: state_file + ".ledger"
	// when state_file is set, else the ledger lives in memory only.
	LedgerFile string `yaml:"ledger_file"`
	// ReceiptsFile: this relay appends the usage receipts it signs here,
	// one line each, for its operator to present to other relays
	// (`mpdetour collective present`); "" = issue none.
	ReceiptsFile string `yaml:"receipts_file"`
	// ReceiptEvery: how often receipts are issued (default 10m, 1s..24h;
	// checked at every attribution_flush, with the ledger's save).
	ReceiptEvery config.Duration `yaml:"receipt_every"`
}

// LoadConfig reads and validates a configuration file; errors name
// file:line:column and the field.
func LoadConfig(path string) (*relay.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("relay config: %w", err)
	}
	return parseConfig(path, b)
}

// ParseConfig validates a configuration (errors positioned in "config").
func ParseConfig(b []byte) (*relay.Config, error) { return parseConfig("config", b) }

func parseConfig(name string, b []byte) (*relay.Config, error) {
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
func build(c *File) (*relay.Config, error) {
	s := &relay.Config{
		Static: relay.Static{
			MetricsListen: c.Metrics.Listen,
			StateFile:     c.StateFile,
			Legacy:        c.LegacyV1.Enabled,
			FastPath:      c.FastPath,
			ReceiveBuffer: relay.DefaultReceiveBuffer,
		},
		Reloadable: relay.Reloadable{
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
		listen = "0.0.0.0:" + strconv.Itoa(relay.DefaultPort)
	}
	if s.Listen, err = netip.ParseAddrPort(listen); err != nil {
		return nil, fmt.Errorf("listen: %q is not address:port: %w", listen, err)
	}
	if !s.Listen.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("listen: %v: listen is the IPv4 control address; put an IPv6 one in listen6", s.Listen)
	}
	s.Listen = netip.AddrPortFrom(s.Listen.Addr().Unmap(), s.Listen.Port())
	if c.Listen6 != "" {
		if s.Listen6, err = netip.ParseAddrPort(c.Listen6); err != nil {
			return nil, fmt.Errorf("listen6: %q is not [address]:port: %w", c.Listen6, err)
		}
		if a := s.Listen6.Addr(); !a.Is6() || a.Is4In6() || a.Zone() != "" || a.IsMulticast() {
			return nil, fmt.Errorf("listen6: %v is not an IPv6 unicast address without zone (e.g. [::]:%d)", s.Listen6, relay.DefaultPort)
		}
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
			return nil, fmt.Errorf("detour_address: %q is not an IPv4 address (an IPv6 one goes in detour_address6)", c.DetourAddress)
		}
	}
	if c.DetourAddress6 != "" {
		a, err := netip.ParseAddr(c.DetourAddress6)
		if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("detour_address6: %q is not an IPv6 unicast address without zone", c.DetourAddress6)
		}
		if s.Listen6 == (netip.AddrPort{}) {
			return nil, errors.New("detour_address6: needs listen6 (IPv6 detours are granted to sessions over IPv6)")
		}
		s.DetourAddress6 = a
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
	if c.ReceiveBuffer != nil {
		s.ReceiveBuffer = *c.ReceiveBuffer
		if s.ReceiveBuffer != 0 && (s.ReceiveBuffer < minReceiveBuffer || s.ReceiveBuffer > maxReceiveBuffer) {
			return nil, fmt.Errorf("receive_buffer: %d is outside %d..%d bytes (0: the kernel's default)", s.ReceiveBuffer, minReceiveBuffer, maxReceiveBuffer)
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
			return nil, fmt.Errorf("members[%d]: duplicate name %q (to rotate a member's key, give its new key as public_key and the old one as previous_public_key in one entry)", i, m.Name)
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
		if m.PreviousPublicKey == "" {
			continue
		}
		pk, err := proto.ParseKey(m.PreviousPublicKey)
		if err != nil {
			return nil, fmt.Errorf("members[%d].previous_public_key: %s: %w", i, m.Name, err)
		}
		if prev, dup := s.Members[pk]; dup {
			if prev == m.Name {
				return nil, fmt.Errorf("members[%d].previous_public_key (%s): the same key as public_key", i, m.Name)
			}
			return nil, fmt.Errorf("members[%d].previous_public_key (%s): same key as %s", i, m.Name, prev)
		}
		s.Members[pk] = m.Name
	}
	for i, p := range c.AllowDestinations {
		pf, err := destination.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("allow_destinations[%d]: %w", i, err)
		}
		s.Allow = append(s.Allow, pf)
	}
	for i, p := range c.DenyDestinations {
		pf, err := destination.ParsePrefix(p)
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
			return nil, fmt.Errorf("legacy_v1.listen: %q is not an IPv4 address:port (legacy v1 carries only IPv4)", ll)
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
		s.Convert = relay.ConvertConfig{Enabled: true, MaxConns: 1024, StallTimeout: 2 * time.Minute}
		l := cv.Listen
		if l == "" {
			l = "0.0.0.0:" + strconv.Itoa(relay.DefaultConvertPort)
		}
		if s.Convert.Listen, err = netip.ParseAddrPort(l); err != nil || !s.Convert.Listen.Addr().Is4() || s.Convert.Listen.Port() == 0 {
			return nil, fmt.Errorf("convert.listen: %q is not an IPv4 address:port (an IPv6 one goes in convert.listen6)", l)
		}
		if cv.Listen6 != "" {
			if s.Convert.Listen6, err = netip.ParseAddrPort(cv.Listen6); err != nil || !s.Convert.Listen6.Addr().Is6() ||
				s.Convert.Listen6.Addr().Is4In6() || s.Convert.Listen6.Addr().Zone() != "" || s.Convert.Listen6.Port() == 0 {
				return nil, fmt.Errorf("convert.listen6: %q is not an IPv6 [address]:port without zone", cv.Listen6)
			}
			if !s.Listen6.IsValid() {
				return nil, errors.New("convert.listen6: needs listen6 (tickets are issued to sessions over IPv6)")
			}
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
		if err := metricsrv.Check(c.Metrics.Listen); err != nil {
			return nil, fmt.Errorf("metrics.listen: %w", err)
		}
	}
	if c.Metrics.TokenFile != "" {
		if c.Metrics.Listen == "" {
			return nil, errors.New("metrics.token_file: set without metrics.listen")
		}
		if s.MetricsToken, err = metricsrv.ReadToken(c.Metrics.TokenFile); err != nil {
			return nil, fmt.Errorf("metrics.token_file: %w", err)
		}
	}
	return s, nil
}

func buildGossip(c *File, s *relay.Config) (*relay.GossipConfig, error) {
	gc := c.Collective.Gossip
	if gc == nil {
		if c.Collective.CertificateFile != "" && s.Trust == nil {
			return nil, errors.New("collective.certificate_file: needs collective.authority")
		}
		return nil, nil
	}
	if s.Trust == nil {
		return nil, errors.New("collective.gossip: needs collective.authority (entries are verified against it)")
	}
	if c.Collective.CertificateFile == "" {
		return nil, errors.New("collective.certificate_file: required with gossip: this relay's certificate with the role relay (mpdetour collective issue --roles relay)")
	}
	b, err := os.ReadFile(c.Collective.CertificateFile)
	if err != nil {
		return nil, fmt.Errorf("collective.certificate_file: %w", err)
	}
	cert, err := collective.ParseCertificate(string(b))
	if err != nil {
		return nil, fmt.Errorf("collective.certificate_file: %s: %w", c.Collective.CertificateFile, err)
	}
	if cert.Member != s.PrivateKey.Public() {
		return nil, fmt.Errorf("collective.certificate_file: %s is for key %s, not this relay's %s", c.Collective.CertificateFile, cert.Member.ID(), s.PrivateKey.Public().ID())
	}
	if err := cert.Verify(s.Trust.Authority(), time.Now(), nil, collective.RoleRelay); err != nil {
		return nil, fmt.Errorf("collective.certificate_file: %s: %w", c.Collective.CertificateFile, err)
	}
	if s.Trust.Revoked(cert.Serial) {
		return nil, fmt.Errorf("collective.certificate_file: %s: %w", c.Collective.CertificateFile, collective.ErrRevoked)
	}
	g := &relay.GossipConfig{Cert: cert, Region: gc.Region, Join: gc.Join, ProbeInterval: time.Duration(gc.ProbeInterval), ProbeTimeout: time.Duration(gc.ProbeTimeout)}
	bind := gc.Bind
	if bind == "" {
		bind = fmt.Sprintf("0.0.0.0:%d", roster.DefaultPort)
	}
	if g.Bind, err = netip.ParseAddrPort(bind); err != nil || g.Bind.Port() == 0 {
		return nil, fmt.Errorf("collective.gossip.bind: %q is not address:port", bind)
	}
	g.Advertise = g.Bind
	if gc.Advertise != "" {
		if g.Advertise, err = netip.ParseAddrPort(gc.Advertise); err != nil || g.Advertise.Port() == 0 || g.Advertise.Addr().IsUnspecified() {
			return nil, fmt.Errorf("collective.gossip.advertise: %q is not a specific address:port", gc.Advertise)
		}
	} else if g.Bind.Addr().IsUnspecified() {
		return nil, fmt.Errorf("collective.gossip.advertise: required when bind is %v (other relays need an address to reach this one)", g.Bind)
	}
	for i, j := range gc.Join {
		if err := roster.ParseJoin(j); err != nil {
			return nil, fmt.Errorf("collective.gossip.join[%d]: %w", i, err)
		}
	}
	for i, a := range gc.Announce {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() || ap.Addr().IsMulticast() || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			return nil, fmt.Errorf("collective.gossip.announce[%d]: %q is not a specific address:port (IPv4, or IPv6 without zone)", i, a)
		}
		if ap.Addr().Is6() && !s.Listen6.IsValid() {
			return nil, fmt.Errorf("collective.gossip.announce[%d]: %v is IPv6 but listen6 is not set (members would find no control socket there)", i, ap)
		}
		g.Announce = append(g.Announce, ap)
	}
	if len(g.Announce) > roster.MaxAddrs {
		return nil, fmt.Errorf("collective.gossip.announce: %d addresses, at most %d", len(g.Announce), roster.MaxAddrs)
	}
	if len(g.Announce) == 0 {
		// Default: the control addresses of both families that are
		// specific, else the advertise address of that family.
		adv := g.Advertise.Addr().Unmap()
		switch {
		case !s.Listen.Addr().IsUnspecified():
			g.Announce = append(g.Announce, s.Listen)
		case adv.Is4():
			g.Announce = append(g.Announce, netip.AddrPortFrom(adv, s.Listen.Port()))
		}
		switch {
		case !s.Listen6.IsValid():
		case !s.Listen6.Addr().IsUnspecified():
			g.Announce = append(g.Announce, s.Listen6)
		case adv.Is6():
			g.Announce = append(g.Announce, netip.AddrPortFrom(adv, s.Listen6.Port()))
		}
		if len(g.Announce) == 0 {
			return nil, errors.New("collective.gossip.announce: required: listen (and listen6) are unspecified and advertise is not of their family")
		}
	}
	if err := roster.ValidRegion(gc.Region); err != nil {
		return nil, fmt.Errorf("collective.gossip.region: %w", err)
	}
	switch {
	case gc.Capacity < 0:
		return nil, errors.New("collective.gossip.capacity: must be positive")
	case gc.Capacity == 0:
		g.Capacity = uint32(s.QuotaGlobal)
	default:
		g.Capacity = uint32(gc.Capacity)
	}
	if gc.SecretFile == "" {
		// Unauthenticated gossip lets anyone who reaches the port declare
		// a live relay dead (issue 28, break 2; docs/security.md).
		return nil, errors.New("collective.gossip.secret_file: required: the key every relay of the collective shares to authenticate gossip " +
			"(create it once: head -c 32 /dev/urandom | base64 > gossip.key, copy it to every relay, mode 600)")
	}
	{
		b, err := os.ReadFile(gc.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("collective.gossip.secret_file: %w", err)
		}
		k, err := roster.ParseSecret(string(b))
		if err != nil {
			return nil, fmt.Errorf("collective.gossip.secret_file: %s: %w", gc.SecretFile, err)
		}
		g.Secret = k
	}
	if g.ProbeInterval != 0 && (g.ProbeInterval < 100*time.Millisecond || g.ProbeInterval > time.Minute) {
		return nil, fmt.Errorf("collective.gossip.probe_interval: %v is outside 100ms..1m", g.ProbeInterval)
	}
	if g.ProbeTimeout != 0 && (g.ProbeTimeout < 10*time.Millisecond || g.ProbeTimeout > 30*time.Second) {
		return nil, fmt.Errorf("collective.gossip.probe_timeout: %v is outside 10ms..30s", g.ProbeTimeout)
	}
	if g.Tuning, err = gc.tuning(); err != nil {
		return nil, err
	}
	pi, pt := g.ProbeInterval, g.ProbeTimeout
	if pi == 0 {
		pi = roster.DefaultProbeInterval
	}
	if pt == 0 {
		pt = roster.DefaultProbeTimeout
	}
	if pt >= pi {
		return nil, fmt.Errorf("collective.gossip.probe_timeout: %v is not shorter than probe_interval %v", pt, pi)
	}
	return g, nil
}

func buildFair(c *FairShareFile, stateFile string) (relay.FairConfig, error) {
	f := relay.FairConfig{Capacity: c.Capacity, LedgerFile: c.LedgerFile, ReceiptsFile: c.ReceiptsFile, ReceiptEvery: 10 * time.Minute}
	if c.Capacity < 0 {
		return f, fmt.Errorf("fair_share.capacity: %d is negative (0 = no capacity limit)", c.Capacity)
	}
	if f.LedgerFile == "" && stateFile != "" {
		f.LedgerFile = stateFile + ".ledger"
	}
	if c.ReceiptEvery != 0 {
		f.ReceiptEvery = time.Duration(c.ReceiptEvery)
		if f.ReceiptEvery < time.Second || f.ReceiptEvery > 24*time.Hour {
			return f, fmt.Errorf("fair_share.receipt_every: %v is outside 1s..24h", f.ReceiptEvery)
		}
	}
	if f.ReceiptsFile != "" {
		if fi, err := os.Stat(f.ReceiptsFile); err == nil && fi.IsDir() {
			return f, fmt.Errorf("fair_share.receipts_file: %s is a directory", f.ReceiptsFile)
		}
	}
	return f, nil
}
