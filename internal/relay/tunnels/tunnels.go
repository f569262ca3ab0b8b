// Package tunnels is the relay half of tunnel detours: the relay file's
// `tunnel:` section (File, the YAML form, validated into Config) and the
// relay's tunnel allocator (Factory builds it; it serves the "tunnel" and
// "encap" requests as the relay core's relay.Tunnels, without importing
// the relay). The WireGuard and VXLAN devices are internal/tunnel's; the
// client half (asking a relay, the agent's sources) is
// internal/tunnel/tunnelctl.
package tunnels

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// File is the relay file's `tunnel:` section, its YAML form (docs/tunnel.md).
type File struct {
	Subnet     string `yaml:"subnet"`      // default 100.80.0.0/16
	Subnet6    string `yaml:"subnet6"`     // IPv6 tunnel addresses too (e.g. fd64:1::/64); default none
	ListenPort int    `yaml:"listen_port"` // default 51820
	// Endpoint is what clients are told to send WireGuard to; default: the
	// address their control request arrived at, with listen_port (set it
	// when the relay is behind a port-forwarding NAT).
	Endpoint  string `yaml:"endpoint"`
	MTU       int    `yaml:"mtu"`        // default 1420
	StateFile string `yaml:"state_file"` // keeps allocations across restarts
	Backend   string `yaml:"backend"`    // kernel, embedded; default: kernel if available
	// Destination policy for tunnel traffic: the ranges the NAT-detour
	// policy treats as special (destination.Special) plus the relay's
	// own networks are refused unless allowed; deny is absolute. Absent,
	// each list is the relay's top-level one (Factory's top); present,
	// even empty ([]), it replaces it.
	AllowDestinations []string `yaml:"allow_destinations"`
	DenyDestinations  []string `yaml:"deny_destinations"`
	// Kinds the relay offers: wireguard (default) and/or vxlan. vxlan is
	// unencrypted and unauthenticated on the wire: trusted networks only
	// (docs/tunnel.md).
	Kinds []string   `yaml:"kinds"`
	VXLAN *VXLANFile `yaml:"vxlan"`
}

// VXLANFile is the `tunnel.vxlan:` subsection (only with kinds: [..., vxlan]).
type VXLANFile struct {
	Subnet string `yaml:"subnet"` // default 100.81.0.0/16
	// Subnet6 gives members an inner IPv6 address too (e.g. fd64:81::/64,
	// as many host bits as subnet); default none: IPv4 inside only.
	Subnet6 string          `yaml:"subnet6"`
	Port    int             `yaml:"port"`  // default 4789
	MTU     int             `yaml:"mtu"`   // default 1450
	Lease   config.Duration `yaml:"lease"` // default 5m; members renew at a third
}

// Kind names (the `kinds:` list).
const (
	KindWireGuard = "wireguard"
	KindVXLAN     = "vxlan"
)

// Config is the validated `tunnel:` section.
type Config struct {
	WireGuard bool
	Server    tunnel.ServerConfig
	Endpoint  netip.AddrPort
	VXLAN     bool
	Encap     tunnel.EncapServerConfig
}

// ParseConfig decodes and checks the whole `tunnel:` section, the kinds
// and the vxlan subsection included; errors carry file:line:column.
func ParseConfig(section *config.Doc) (Config, error) {
	var c File
	if section != nil {
		if err := section.Decode(&c); err != nil {
			return Config{}, err
		}
	} else {
		section = config.NewDoc("config", "tunnel", nil)
	}
	st, err := buildConfig(c)
	if err != nil {
		return st, section.Locate(err)
	}
	return st, nil
}

func buildConfig(c File) (Config, error) {
	var st Config
	var err error
	if st.Server, st.Endpoint, err = buildServer(c); err != nil {
		return st, err
	}
	if len(c.Kinds) == 0 {
		c.Kinds = []string{KindWireGuard}
	}
	for i, k := range c.Kinds {
		dup := (k == KindWireGuard && st.WireGuard) || (k == KindVXLAN && st.VXLAN)
		switch {
		case dup:
			return st, fmt.Errorf("kinds[%d]: %q listed twice", i, k)
		case k == KindWireGuard:
			st.WireGuard = true
		case k == KindVXLAN:
			st.VXLAN = true
		default:
			return st, fmt.Errorf("kinds[%d]: %q is not wireguard or vxlan", i, k)
		}
	}
	if c.VXLAN != nil && !st.VXLAN {
		return st, errors.New("vxlan: set, but kinds does not list vxlan (the unencrypted kind is opt-in)")
	}
	if !st.VXLAN {
		return st, nil
	}
	v := VXLANFile{}
	if c.VXLAN != nil {
		v = *c.VXLAN
	}
	if v.Subnet == "" {
		v.Subnet = "100.81.0.0/16"
	}
	st.Encap = tunnel.EncapServerConfig{Port: v.Port, MTU: v.MTU, Lease: time.Duration(v.Lease), Destinations: st.Server.Destinations}
	if st.Encap.Subnet, err = netip.ParsePrefix(v.Subnet); err != nil {
		return st, fmt.Errorf("vxlan.subnet: %q: %w", v.Subnet, err)
	}
	if v.Subnet6 != "" {
		if st.Encap.Subnet6, err = netip.ParsePrefix(v.Subnet6); err != nil || !st.Encap.Subnet6.Addr().Is6() || st.Encap.Subnet6.Addr().Is4In6() {
			return st, fmt.Errorf("vxlan.subnet6: %q is not an IPv6 prefix", v.Subnet6)
		}
		if err := tunnel.CheckSubnet6(st.Encap.Subnet6, st.Encap.Subnet); err != nil {
			return st, fmt.Errorf("vxlan.subnet6: %w", err)
		}
		if st.WireGuard && st.Server.Subnet6.IsValid() && st.Encap.Subnet6.Overlaps(st.Server.Subnet6) {
			return st, fmt.Errorf("vxlan.subnet6: %s overlaps the WireGuard subnet6 %s", st.Encap.Subnet6, st.Server.Subnet6)
		}
	}
	switch {
	case v.Port < 0 || v.Port > 65535:
		return st, fmt.Errorf("vxlan.port: %d out of range 1-65535", v.Port)
	case v.MTU != 0 && (v.MTU < 576 || v.MTU > 9000):
		return st, fmt.Errorf("vxlan.mtu: %d out of range 576-9000", v.MTU)
	case st.Encap.Subnet6.IsValid() && v.MTU != 0 && v.MTU < 1280:
		// No member could get the IPv6 inside (tunnel.EncapServer.inside6).
		return st, fmt.Errorf("vxlan.mtu: %d is below IPv6's minimum 1280: subnet6 needs mtu 1280 or more (1300 for members over an IPv6 underlay)", v.MTU)
	case v.Lease != 0 && time.Duration(v.Lease) < 10*time.Second:
		return st, fmt.Errorf("vxlan.lease: %s is shorter than 10s", time.Duration(v.Lease))
	case st.WireGuard && st.Encap.Subnet.Overlaps(st.Server.Subnet):
		return st, fmt.Errorf("vxlan.subnet: %s overlaps the WireGuard subnet %s", st.Encap.Subnet, st.Server.Subnet)
	}
	return st, nil
}

// buildServer validates the decoded section's WireGuard part; errors start with the field path.
func buildServer(c File) (tunnel.ServerConfig, netip.AddrPort, error) {
	sc := tunnel.ServerConfig{ListenPort: c.ListenPort, MTU: c.MTU, StateFile: c.StateFile, Backend: tunnel.Backend(c.Backend)}
	if c.Subnet == "" {
		c.Subnet = "100.80.0.0/16"
	}
	var err error
	if sc.Subnet, err = netip.ParsePrefix(c.Subnet); err != nil {
		return sc, netip.AddrPort{}, fmt.Errorf("subnet: %q: %w", c.Subnet, err)
	}
	if c.Subnet6 != "" {
		if sc.Subnet6, err = netip.ParsePrefix(c.Subnet6); err != nil || !sc.Subnet6.Addr().Is6() || sc.Subnet6.Addr().Is4In6() {
			return sc, netip.AddrPort{}, fmt.Errorf("subnet6: %q is not an IPv6 prefix", c.Subnet6)
		}
		if err := tunnel.CheckSubnet6(sc.Subnet6, sc.Subnet); err != nil {
			return sc, netip.AddrPort{}, fmt.Errorf("subnet6: %w", err)
		}
	}
	if sc.ListenPort == 0 {
		sc.ListenPort = 51820
	}
	switch sc.Backend {
	case tunnel.Auto, tunnel.Kernel, tunnel.Embedded:
	default:
		return sc, netip.AddrPort{}, fmt.Errorf("backend: %q is not kernel or embedded", c.Backend)
	}
	var ep netip.AddrPort
	if c.Endpoint != "" {
		if ep, err = netip.ParseAddrPort(c.Endpoint); err != nil {
			return sc, ep, fmt.Errorf("endpoint: %q: %w", c.Endpoint, err)
		}
	}
	for _, l := range []struct {
		name string
		in   []string
		out  *[]netip.Prefix
	}{{"allow_destinations", c.AllowDestinations, &sc.Destinations.Allow}, {"deny_destinations", c.DenyDestinations, &sc.Destinations.Deny}} {
		if l.in != nil {
			*l.out = []netip.Prefix{} // set, even empty: not inherited
		}
		for i, s := range l.in {
			p, err := destination.ParsePrefix(s)
			if err != nil {
				return sc, ep, fmt.Errorf("%s[%d]: %w", l.name, i, err)
			}
			*l.out = append(*l.out, p)
		}
	}
	sc.Destinations.Restricted = destination.Special()
	return sc, ep, nil
}

// Factory builds the relay's tunnel allocator from its `tunnel:` section:
// the WireGuard device and its destination policy. The result satisfies
// relay.Tunnels (this package does not import the relay). top is the
// relay's top-level destination policy, used where the section sets no
// list of its own (Inherit).
func Factory(section *config.Doc, relayKey proto.Key, top destination.Policy, log *slog.Logger) (_ *Allocator, err error) {
	st, err := ParseConfig(section)
	if err != nil {
		return nil, err
	}
	st.Server.Destinations = Inherit(st.Server.Destinations, top)
	if log == nil {
		log = slog.Default()
	}
	sc := st.Server
	sc.PrivateKey = wgtypes.Key(relayKey)
	sc.Logger = log
	own, err := tunnel.ConnectedNetworks(sc.Netns)
	if err != nil {
		return nil, err
	}
	sc.Destinations.Restricted = append(sc.Destinations.Restricted, own...)
	a := &Allocator{endpoint: st.Endpoint}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if st.WireGuard {
		if a.srv, err = tunnel.NewServer(sc); err != nil {
			return nil, err
		}
	}
	if st.VXLAN {
		ec := st.Encap
		ec.Netns, ec.Logger, ec.Seed = sc.Netns, log, sc.PrivateKey.PublicKey()
		ec.Destinations = sc.Destinations
		if a.encap, err = tunnel.NewEncapServer(ec); err != nil {
			return nil, err
		}
		a.lease = ec.Lease
		if a.lease == 0 {
			a.lease = tunnel.DefaultEncapLease
		}
		log.Warn("tunnel: the vxlan kind is enabled: tunnels of this kind are neither encrypted nor authenticated on the wire, use it only inside a trusted network")
	}
	return a, nil
}

// Allocator hands out tunnel addresses and keeps the WireGuard peers and
// the VXLAN members (each kind only when the section enables it).
type Allocator struct {
	srv      *tunnel.Server // nil: wireguard not offered
	endpoint netip.AddrPort
	encap    *tunnel.EncapServer // nil: vxlan not offered
	lease    time.Duration
}

// Allocate implements relay.Tunnels. The tunnel has no lease: the
// peer stays until the member is removed from the relay (Release).
func (a *Allocator) Allocate(member proto.Key, _, relayAddr netip.Addr) (proto.TunnelGrant, time.Duration, error) {
	if a.srv == nil {
		return proto.TunnelGrant{}, 0, fmt.Errorf("wireguard tunnels not offered (tunnel.kinds): %w", &proto.Error{Op: proto.OpTunnel, Reason: proto.ReasonUnsupported})
	}
	p, err := a.srv.AddPeer(wgtypes.Key(member))
	if err != nil {
		if errors.Is(err, tunnel.ErrSubnetFull) {
			err = fmt.Errorf("%w: %w", err, &proto.Error{Op: proto.OpTunnel, Reason: proto.ReasonNoPorts})
		}
		return proto.TunnelGrant{}, 0, err
	}
	ep := a.endpoint
	if !ep.IsValid() {
		ep = netip.AddrPortFrom(relayAddr, uint16(a.srv.ListenPort()))
	}
	// ClientPrefix6 (with subnet6) goes on the wire only to requests that
	// ask for it (the relay's handler strips it otherwise).
	return proto.TunnelGrant{ClientPrefix: p, ClientPrefix6: a.srv.Address6(p), Endpoint: ep, PublicKey: proto.Key(a.srv.PublicKey())}, 0, nil
}

// Release implements relay.Tunnels (member removed from the
// config): both kinds.
func (a *Allocator) Release(member proto.Key) {
	if a.srv != nil {
		_ = a.srv.RemovePeer(wgtypes.Key(member))
	}
	if a.encap != nil {
		_ = a.encap.Remove(wgtypes.Key(member))
	}
}

// Rekey moves a member's WireGuard tunnel to its successor key, keeping
// its tunnel address (a member's key rotation, relay.Tunnels). The
// VXLAN kind is not carried over: a member's VXLAN tunnel is released
// (its agent opens a new one with the new key).
func (a *Allocator) Rekey(old, successor proto.Key) (bool, error) {
	if a.encap != nil {
		_ = a.encap.Remove(wgtypes.Key(old))
	}
	if a.srv == nil {
		return false, nil
	}
	return a.srv.RekeyPeer(wgtypes.Key(old), wgtypes.Key(successor))
}

// Close implements relay.Tunnels.
func (a *Allocator) Close() error {
	var errs []error
	if a.srv != nil {
		errs = append(errs, a.srv.Close())
	}
	if a.encap != nil {
		errs = append(errs, a.encap.Close())
	}
	return errors.Join(errs...)
}

// Readmit re-admits the saved allocations of keys member accepts (the
// relay's current members) after a restart.
func (a *Allocator) Readmit(member func(proto.Key) bool) (int, error) {
	if a.srv == nil {
		return 0, nil
	}
	return a.srv.Readmit(func(k wgtypes.Key) bool { return member(proto.Key(k)) })
}

// Status reports the WireGuard device and its peers (for relay status).
func (a *Allocator) Status() (*wgtypes.Device, error) {
	if a.srv == nil {
		// Only the VXLAN kind: no WireGuard peers (an empty device, so that
		// the ledger and relay status do not warn on every read).
		return &wgtypes.Device{}, nil
	}
	return a.srv.Status()
}

// WireGuardOffered says whether the relay offers WireGuard tunnels
// (tunnel.kinds), for the roster's kinds.
func (a *Allocator) WireGuardOffered() bool { return a.srv != nil }

// Encap implements relay.Tunnels: the member's VXLAN tunnel from the
// session's address client (the only source the relay accepts its
// encapsulated packets from).
func (a *Allocator) Encap(member proto.Key, client, relayAddr netip.Addr) (proto.EncapGrant, time.Duration, error) {
	if a.encap == nil {
		return proto.EncapGrant{}, 0, fmt.Errorf("vxlan tunnels not offered (tunnel.kinds): %w", &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonUnsupported})
	}
	// The underlay is the control session's family (IPv4 or IPv6); the
	// session's two ends are always of one family, mixed is refused.
	if client.Unmap().Is4() != relayAddr.Unmap().Is4() {
		return proto.EncapGrant{}, 0, fmt.Errorf("vxlan needs control addresses of one family (%s, %s): %w", client, relayAddr, &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonUnsupported})
	}
	e, err := a.encap.Open(wgtypes.Key(member), client, relayAddr)
	if err != nil {
		if errors.Is(err, tunnel.ErrSubnetFull) {
			err = fmt.Errorf("%w: %w", err, &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonNoPorts})
		}
		return proto.EncapGrant{}, 0, err
	}
	// The IPv6 inside (with vxlan.subnet6) goes on the wire only to
	// requests that ask for it (the relay's handler strips it otherwise).
	return ToEncapGrant(e), a.lease, nil
}

// EncapRelease implements relay.Tunnels.
func (a *Allocator) EncapRelease(member proto.Key) error {
	if a.encap == nil {
		return &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonUnsupported}
	}
	return a.encap.Remove(wgtypes.Key(member))
}

// EncapMembers lists the VXLAN tunnels (nil when the kind is off).
func (a *Allocator) EncapMembers() map[wgtypes.Key]tunnel.EncapAllocation {
	if a.encap == nil {
		return nil
	}
	return a.encap.Members()
}

// ToEncapGrant converts an allocation to its wire form (the client half:
// tunnelctl.FromEncapGrant).
func ToEncapGrant(e tunnel.EncapAllocation) proto.EncapGrant {
	return proto.EncapGrant{ClientPrefix: e.Address, Gateway: e.Gateway, Endpoint: e.Endpoint, Member: e.Member, VNI: e.VNI, MTU: uint16(e.MTU),
		ClientPrefix6: e.Address6, Gateway6: e.Gateway6}
}

// Inherit fills the lists the `tunnel:` section did not set (nil) from the
// relay's top-level destination policy: one allow_destinations governs NAT
// and tunnel detours unless the section says otherwise. IPv6 entries are
// kept (the tunnel's rules ignore them). deny_ports has no tunnel
// counterpart yet: tunnel traffic is filtered by address only.
func Inherit(d tunnel.Destinations, top destination.Policy) tunnel.Destinations {
	if d.Allow == nil {
		d.Allow = top.Allow
	}
	if d.Deny == nil {
		d.Deny = top.Deny
	}
	return d
}
