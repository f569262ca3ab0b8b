// Package tunnelctl connects tunnel detours (internal/tunnel) to the relay
// control protocol: on the relay, Factory builds what serves the "tunnel"
// request (cmd/mpdetour hands it to the relay as its TunnelFactory); on the
// client, Open asks a relay over a relayclient.Conn and brings the tunnel up,
// and re-asks through the same channel when the tunnel goes stale. Source
// wraps Open for the agent: a detour.Source per relay that keeps retrying
// until the relay answers.
//
// Agent wiring (integration point for internal/agent): at start
//
//	srcs, err := tunnelctl.StartAll(netns, relayConns, memberKey, log)
//
// (removes a crashed agent's tunnels, then one Source per relay), pass the
// sources to agent.New with the others, and Close them at exit.
package tunnelctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// Config is the relay config's `tunnel:` section (docs/tunnel.md).
type Config struct {
	Subnet     string `yaml:"subnet"`      // default 100.80.0.0/16
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
	// own networks are refused unless allowed; deny is absolute. The
	// factory is not handed the relay's top-level allow/deny lists, so
	// tunnel traffic has its own (integration point: relay could pass them).
	AllowDestinations []string `yaml:"allow_destinations"`
	DenyDestinations  []string `yaml:"deny_destinations"`
}

// ParseConfig decodes and checks a relay config's `tunnel:` section (nil:
// defaults). Unknown keys and bad values are errors with the
// file:line:column of the whole file.
func ParseConfig(section *config.Doc) (tunnel.ServerConfig, netip.AddrPort, error) {
	var c Config
	if section != nil {
		if err := section.Decode(&c); err != nil {
			return tunnel.ServerConfig{}, netip.AddrPort{}, err
		}
	} else {
		section = config.NewDoc("config", "tunnel", nil)
	}
	sc, ep, err := build(c)
	if err != nil {
		return sc, ep, section.Locate(err)
	}
	return sc, ep, nil
}

// build validates the decoded section; errors start with the field path.
func build(c Config) (tunnel.ServerConfig, netip.AddrPort, error) {
	sc := tunnel.ServerConfig{ListenPort: c.ListenPort, MTU: c.MTU, StateFile: c.StateFile, Backend: tunnel.Backend(c.Backend)}
	if c.Subnet == "" {
		c.Subnet = "100.80.0.0/16"
	}
	var err error
	if sc.Subnet, err = netip.ParsePrefix(c.Subnet); err != nil {
		return sc, netip.AddrPort{}, fmt.Errorf("subnet: %q: %w", c.Subnet, err)
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
		for i, s := range l.in {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return sc, ep, fmt.Errorf("%s[%d]: %q is not a prefix", l.name, i, s)
			}
			*l.out = append(*l.out, p)
		}
	}
	sc.Destinations.Restricted = destination.Special()
	return sc, ep, nil
}

// Factory builds the relay's tunnel allocator from its `tunnel:` section:
// the WireGuard device and its destination policy. The result satisfies
// relay.TunnelAllocator (this package does not import the relay).
func Factory(section *config.Doc, relayKey proto.Key, log *slog.Logger) (*Allocator, error) {
	sc, ep, err := ParseConfig(section)
	if err != nil {
		return nil, err
	}
	sc.PrivateKey = wgtypes.Key(relayKey)
	sc.Logger = log
	own, err := tunnel.ConnectedNetworks(sc.Netns)
	if err != nil {
		return nil, err
	}
	sc.Destinations.Restricted = append(sc.Destinations.Restricted, own...)
	srv, err := tunnel.NewServer(sc)
	if err != nil {
		return nil, err
	}
	return &Allocator{srv: srv, endpoint: ep}, nil
}

// Allocator hands out tunnel addresses and keeps the WireGuard peers.
type Allocator struct {
	srv      *tunnel.Server
	endpoint netip.AddrPort
}

// Allocate implements relay.TunnelAllocator. The tunnel has no lease: the
// peer stays until the member is removed from the relay (Release).
func (a *Allocator) Allocate(member proto.Key, _, relayAddr netip.Addr) (proto.TunnelGrant, time.Duration, error) {
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
	return proto.TunnelGrant{ClientPrefix: p, Endpoint: ep, PublicKey: proto.Key(a.srv.PublicKey())}, 0, nil
}

// Release implements relay.TunnelAllocator.
func (a *Allocator) Release(member proto.Key) { _ = a.srv.RemovePeer(wgtypes.Key(member)) }

// Close implements relay.TunnelAllocator.
func (a *Allocator) Close() error { return a.srv.Close() }

// Readmit re-admits the saved allocations of keys member accepts (the
// relay's current members) after a restart.
func (a *Allocator) Readmit(member func(proto.Key) bool) (int, error) {
	return a.srv.Readmit(func(k wgtypes.Key) bool { return member(proto.Key(k)) })
}

// Status reports the WireGuard device and its peers (for relay status).
func (a *Allocator) Status() (*wgtypes.Device, error) { return a.srv.Status() }

// FromGrant converts a control-protocol grant into a tunnel allocation.
func FromGrant(g proto.TunnelGrant) tunnel.Allocation {
	return tunnel.Allocation{Address: g.ClientPrefix, Endpoint: g.Endpoint, RelayKey: wgtypes.Key(g.PublicKey)}
}

// Open asks the relay behind conn for a tunnel and brings it up with cfg
// (Netns, Index, PrivateKey = the member key; Relay defaults to the relay's
// name). The client's watchdog re-asks through conn when the tunnel has had
// no handshake for cfg.StaleAfter (relay restarted without its state).
func Open(ctx context.Context, conn *relayclient.Conn, cfg tunnel.ClientConfig) (*tunnel.Client, error) {
	ask := func(ctx context.Context) (tunnel.Allocation, error) {
		g, _, err := conn.Tunnel(ctx)
		if err != nil {
			return tunnel.Allocation{}, fmt.Errorf("tunnel request to relay %s: %w", conn.Relay().Name, err)
		}
		a := FromGrant(g)
		return a, a.Validate()
	}
	a, err := ask(ctx)
	if err != nil {
		return nil, err
	}
	cfg.Allocation = a
	cfg.Refresh = ask
	if cfg.Relay == "" {
		cfg.Relay = conn.Relay().Name
	}
	return tunnel.NewClient(cfg)
}
