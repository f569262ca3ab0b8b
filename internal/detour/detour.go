// Package detour holds the vocabulary shared by the agent, the relay client
// and the tunnel code: what a detour is and where detours come from. It has
// no dependencies so that each side can grow independently.
package detour

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// Kind says how a detour carries a subflow.
type Kind int

const (
	// NAT: the subflow goes from the client's own address to relay:port,
	// which the relay DNATs to the server and SNATs to itself.
	NAT Kind = iota + 1
	// Tunnel: the subflow leaves from the tunnel's address straight to the
	// server; policy routing by source sends it into the tunnel.
	Tunnel
)

func (k Kind) String() string {
	switch k {
	case NAT:
		return "nat"
	case Tunnel:
		return "tunnel"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Detour is one way to reach a server other than the default path.
type Detour struct {
	Kind  Kind
	Relay string // the relay's name, for logs, status and health accounting
	// Local is the subflow's source address; the zero Addr means the
	// client's own address on the default path (NAT detours).
	Local netip.Addr
	// Remote is where the subflow connects: relay address + granted port for
	// NAT detours, the server itself for tunnel detours.
	Remote netip.AddrPort
	// Expires is when the grant behind the detour lapses; zero = never.
	Expires time.Time
	// Backup: subflows through it are opened as backup (MPTCP's B flag):
	// the kernel sends on them only when no other subflow can send. Backup
	// detours come on top of a policy's N.
	Backup bool
}

func (d Detour) String() string {
	local := "default"
	if d.Local.IsValid() {
		local = d.Local.String()
	}
	return fmt.Sprintf("%s via %s (%s -> %s)", d.Kind, d.Relay, local, d.Remote)
}

// Source provides the detours usable toward a server. Implementations:
// static NAT detours from the agent's config, grants from relays, tunnels.
type Source interface {
	// Prepare is called as soon as a connection toward server is created
	// (SYN sent) so a source can ask its relay in parallel with the
	// handshake. It must not block.
	Prepare(server netip.AddrPort)
	// Detours returns the detours ready for server now; it must not block
	// on the network (a grant still in flight is simply not returned yet).
	Detours(server netip.AddrPort) []Detour
}

// Releaser is implemented by sources holding grants that should be released
// when no connection uses them any more.
type Releaser interface {
	Release(ctx context.Context, server netip.AddrPort) error
}

// Notifier is implemented by sources whose detours change on their own (a
// relay grant arrives, a discovered relay is dropped): the agent then
// asks the policy to refresh its connections at once instead of at their
// next poll. Changed's channel carries one value per burst of changes.
type Notifier interface {
	Changed() <-chan struct{}
}

// Refuser is implemented by sources whose detours can go stale without
// their knowing: a relay restarted without its state no longer has the
// granted port open, and subflows toward it are refused (ECONNREFUSED).
// The agent calls Refused when a subflow through d toward server was
// refused; the source may ask again at once (bounded by itself). It must
// not block.
type Refuser interface {
	Refused(server netip.AddrPort, d Detour)
}
