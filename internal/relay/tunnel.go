package relay

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// TunnelAllocator serves the control protocol's tunnel request (tunnel
// detours, internal/tunnel). The relay calls it from its event loop with the
// authenticated member key, which is also the member's WireGuard public key,
// the client's address as seen by the relay, and the relay address the
// request arrived at (the natural WireGuard endpoint address to return).
// Allocate must be idempotent per member (a repeat returns the same address
// and extends the lease). Errors wrapping a *proto.Error send that reason;
// others send "internal".
type TunnelAllocator interface {
	Allocate(member proto.Key, client, relay netip.Addr) (proto.TunnelGrant, time.Duration, error)
	// Release drops a member's tunnel (member removed from the config).
	Release(member proto.Key)
	Close() error
}

// tunnelReadmitter is implemented by allocators that keep allocations
// across restarts (tunnelctl's, with the tunnel section's state_file): the
// relay re-admits its current members at start.
type tunnelReadmitter interface {
	Readmit(member func(proto.Key) bool) (int, error)
}

// TunnelFactory builds an allocator from the relay config's `tunnel:`
// section (errors positioned in the whole file through section). The relay
// command passes tunnelctl's; a relay built without one refuses a config
// with a tunnel section.
type TunnelFactory func(section *config.Doc, relayKey proto.Key, log *slog.Logger) (TunnelAllocator, error)

func newTunnelAllocator(f TunnelFactory, section *config.Doc, key proto.Key, log *slog.Logger) (TunnelAllocator, error) {
	if section == nil {
		return nil, nil
	}
	if f == nil {
		return nil, errors.New("tunnel: this relay was built without tunnel support")
	}
	return f(section, key, log)
}
