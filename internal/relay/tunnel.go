package relay

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Tunnels is the relay's whole contract with tunnel detours
// (internal/tunnel/tunnelctl implements it; FakeTunnels is the fake). The
// relay calls it from its event loop with the authenticated member key,
// which is also the member's WireGuard public key, the client's address as
// seen by the relay, and the relay address the request arrived at (the
// natural endpoint address to return). Errors wrapping a *proto.Error send
// that reason; others send "internal". A kind the section does not enable
// answers with proto.ReasonUnsupported.
type Tunnels interface {
	// Allocate serves the tunnel request (WireGuard). It must be idempotent
	// per member (a repeat returns the same address and extends the lease).
	Allocate(member proto.Key, client, relay netip.Addr) (proto.TunnelGrant, time.Duration, error)
	// Encap serves the encap request: an unencrypted VXLAN tunnel for
	// members in a trusted network (opt-in, docs/tunnel.md). client is the
	// only address encapsulated packets are then accepted from.
	Encap(member proto.Key, client, relay netip.Addr) (proto.EncapGrant, time.Duration, error)
	// EncapRelease drops a member's VXLAN tunnel (its request).
	EncapRelease(member proto.Key) error
	// Release drops every tunnel of a member (no longer a member).
	Release(member proto.Key)
	// Rekey moves a member's WireGuard tunnel to its successor key, keeping
	// its address (member key rotation); had: there was one to move.
	Rekey(old, successor proto.Key) (had bool, err error)
	// Readmit re-admits allocations saved before a restart of the keys
	// member accepts; it returns how many.
	Readmit(member func(proto.Key) bool) (int, error)
	// Status reports the WireGuard device (an empty one when only VXLAN
	// is offered), for relay status and the ledger.
	Status() (*wgtypes.Device, error)
	// WireGuardOffered says whether tunnel requests can succeed (the
	// roster's kinds).
	WireGuardOffered() bool
	Close() error
}

// TunnelFactory builds the tunnels from the relay config's `tunnel:`
// section (errors positioned in the whole file through section). top is the
// relay's top-level destination policy (allow_destinations,
// deny_destinations, deny_ports), which the section inherits unless it sets
// its own lists. The relay command passes tunnelctl's; a relay built
// without one refuses a config with a tunnel section.
type TunnelFactory func(section *config.Doc, relayKey proto.Key, top destination.Policy, log *slog.Logger) (Tunnels, error)

// NewTunnels runs f on the section (nil section: no tunnels, nil result).
func NewTunnels(f TunnelFactory, section *config.Doc, key proto.Key, top destination.Policy, log *slog.Logger) (Tunnels, error) {
	if section == nil {
		return nil, nil
	}
	if f == nil {
		return nil, errors.New("tunnel: this relay was built without tunnel support")
	}
	return f(section, key, top, log)
}
