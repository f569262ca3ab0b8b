package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// TunnelAllocator serves the control protocol's tunnel request (tunnel
// detours, internal/tunnel). The relay calls it from its event loop with the
// authenticated member key, which is also the member's WireGuard public key,
// the client's address as seen by the relay, and the relay address the
// request arrived at (the natural WireGuard endpoint address to return).
// Allocate must be idempotent
// per member (a repeat returns the same address and extends the lease).
// Errors wrapping a *proto.Error send that reason; others send "internal".
type TunnelAllocator interface {
	Allocate(member proto.Key, client, relay netip.Addr) (proto.TunnelGrant, time.Duration, error)
	// Release drops a member's tunnel (member removed from the config).
	Release(member proto.Key)
	Close() error
}

// TunnelFactory builds an allocator from the relay config's `tunnel:` section.
type TunnelFactory func(cfg *yaml.Node, relayKey proto.Key, log *slog.Logger) (TunnelAllocator, error)

var (
	tunnelMu      sync.Mutex
	tunnelFactory TunnelFactory
)

// RegisterTunnel installs the factory used when a relay config has a
// `tunnel:` section. internal/tunnel calls it (e.g. from an init function in
// the binary); without one, such a config is refused.
func RegisterTunnel(f TunnelFactory) {
	tunnelMu.Lock()
	defer tunnelMu.Unlock()
	tunnelFactory = f
}

func newTunnelAllocator(cfg *yaml.Node, key proto.Key, log *slog.Logger) (TunnelAllocator, error) {
	if cfg == nil {
		return nil, nil
	}
	tunnelMu.Lock()
	f := tunnelFactory
	tunnelMu.Unlock()
	if f == nil {
		return nil, errors.New("tunnel: this binary has no tunnel support registered")
	}
	return f(cfg, key, log)
}

// TunnelPeers is what an address pool needs from a WireGuard device.
type TunnelPeers interface {
	// SetPeer adds or updates the peer with this key and allowed address.
	SetPeer(key proto.Key, addr netip.Prefix) error
	RemovePeer(key proto.Key) error
	Endpoint() netip.AddrPort
	PublicKey() proto.Key
}

// Pool hands out one address per member from a prefix (the relay keeps the
// first address) and keeps a WireGuard device's peers in step. It is a
// ready-made TunnelAllocator for internal/tunnel to wrap.
type Pool struct {
	Prefix netip.Prefix
	Lease  time.Duration
	Peers  TunnelPeers

	mu    sync.Mutex
	addrs map[proto.Key]netip.Addr
	used  map[netip.Addr]bool
}

// Allocate implements TunnelAllocator.
func (p *Pool) Allocate(member proto.Key, _, _ netip.Addr) (proto.TunnelGrant, time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.addrs == nil {
		p.addrs, p.used = map[proto.Key]netip.Addr{}, map[netip.Addr]bool{}
	}
	a, ok := p.addrs[member]
	if !ok {
		// The network address and the relay's own (first) address are skipped.
		for c := p.Prefix.Masked().Addr().Next().Next(); p.Prefix.Contains(c); c = c.Next() {
			if !p.used[c] && (!c.Is4() || c.Next().IsValid() && p.Prefix.Contains(c.Next())) {
				a, ok = c, true
				break
			}
		}
		if !ok {
			return proto.TunnelGrant{}, 0, fmt.Errorf("tunnel pool %v exhausted: %w", p.Prefix, &proto.Error{Op: proto.OpTunnel, Reason: proto.ReasonNoPorts})
		}
	}
	pf := netip.PrefixFrom(a, p.Prefix.Bits())
	if err := p.Peers.SetPeer(member, netip.PrefixFrom(a, a.BitLen())); err != nil {
		return proto.TunnelGrant{}, 0, err
	}
	p.addrs[member], p.used[a] = a, true
	return proto.TunnelGrant{ClientPrefix: pf, Endpoint: p.Peers.Endpoint(), PublicKey: p.Peers.PublicKey()}, p.Lease, nil
}

// Release implements TunnelAllocator.
func (p *Pool) Release(member proto.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.addrs[member]; ok {
		_ = p.Peers.RemovePeer(member)
		delete(p.addrs, member)
		delete(p.used, a)
	}
}

// Close implements TunnelAllocator.
func (p *Pool) Close() error { return nil }
