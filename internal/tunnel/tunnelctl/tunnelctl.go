// Package tunnelctl is the client half of tunnel detours over the relay
// control protocol: Open asks a relay over a relayconn.Conn for a
// WireGuard tunnel and brings it up, re-asking through the same channel
// when the tunnel goes stale (OpenEncap: the same for VXLAN).
// TunnelSource and EncapSource wrap them for the agent: a detour.Source
// per relay that keeps retrying until the relay answers. internal/agentd
// calls StartAll (and StartAllEncap) at start, which removes a crashed
// agent's tunnels and returns one source per relay, passes the sources to
// the agent with the others and closes them at exit. The relay half (the
// `tunnel:` section and the allocator) is internal/relay/tunnels.
package tunnelctl

import (
	"context"
	"fmt"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// FromEncapGrant converts a received grant.
func FromEncapGrant(g proto.EncapGrant) tunnel.EncapAllocation {
	return tunnel.EncapAllocation{Address: g.ClientPrefix, Gateway: g.Gateway, Endpoint: g.Endpoint, Member: g.Member, VNI: g.VNI, MTU: int(g.MTU),
		Address6: g.ClientPrefix6, Gateway6: g.Gateway6}
}

// OpenEncap asks the relay behind conn for a VXLAN tunnel and brings it up
// with cfg (Netns, Index; Relay defaults to the relay's name); the client
// renews through conn at a third of the lease.
func OpenEncap(ctx context.Context, conn *relayconn.Conn, cfg tunnel.EncapClientConfig) (*tunnel.EncapClient, error) {
	ask := func(ctx context.Context) (tunnel.EncapAllocation, time.Duration, error) {
		g, lease, err := askEncap(ctx, conn)
		if err != nil {
			return tunnel.EncapAllocation{}, 0, fmt.Errorf("vxlan request to relay %s: %w", conn.Relay().Name, err)
		}
		a := FromEncapGrant(g)
		return a, lease, a.Validate()
	}
	a, lease, err := ask(ctx)
	if err != nil {
		return nil, err
	}
	cfg.Allocation, cfg.Lease, cfg.Refresh = a, lease, ask
	if cfg.Relay == "" {
		cfg.Relay = conn.Relay().Name
	}
	return tunnel.NewEncapClient(cfg)
}

// FromGrant converts a control-protocol grant into a tunnel allocation.
func FromGrant(g proto.TunnelGrant) tunnel.Allocation {
	return tunnel.Allocation{Address: g.ClientPrefix, Address6: g.ClientPrefix6, Endpoint: g.Endpoint, RelayKey: wgtypes.Key(g.PublicKey)}
}

// Open asks the relay behind conn for a tunnel and brings it up with cfg
// (Netns, Index, PrivateKey = the member key; Relay defaults to the relay's
// name). The client's watchdog re-asks through conn when the tunnel has had
// no handshake for cfg.StaleAfter (relay restarted without its state).
func Open(ctx context.Context, conn *relayconn.Conn, cfg tunnel.ClientConfig) (*tunnel.Client, error) {
	ask := func(ctx context.Context) (tunnel.Allocation, error) {
		g, err := askTunnel(ctx, conn)
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
