// Package static is the detour kind written in the agent file
// (`detours:`, docs/agent.md): NAT detours to a relay's address and port
// and tunnel detours from a local tunnel address, always ready, asked
// nothing.
package static

import (
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Entry is a detour written in the config.
type Entry struct {
	Detour detour.Detour
	// Servers are the destinations the detour reaches: for a NAT detour the
	// one server:port its DNAT leads to; for a tunnel, prefixes (any if empty).
	Servers []netip.Prefix
	Port    uint16 // NAT detours: the server port
}

// Set is the detour.Source of the written detours.
type Set struct{ ds []Entry }

// New returns the source of ds.
func New(ds []Entry) *Set { return &Set{ds: ds} }

// Prepare has nothing to ask for: static detours are always ready.
func (s *Set) Prepare(netip.AddrPort) {}

// Detours returns the NAT detours leading to server and the tunnels that
// reach it (a tunnel subflow connects to the server itself).
func (s *Set) Detours(server netip.AddrPort) []detour.Detour {
	a := server.Addr().Unmap()
	var out []detour.Detour
	for _, sd := range s.ds {
		ok := len(sd.Servers) == 0
		for _, p := range sd.Servers {
			if p.Contains(a) {
				ok = true
				break
			}
		}
		if !ok {
			continue
		}
		d := sd.Detour
		switch d.Kind {
		case detour.NAT:
			if sd.Port != server.Port() {
				continue
			}
		case detour.Tunnel:
			if a.Is4() != d.Local.Is4() {
				continue
			}
			d.Remote = netip.AddrPortFrom(a, server.Port())
		}
		out = append(out, d)
	}
	return out
}

// All lists every configured detour (status shows their health).
func (s *Set) All() []detour.Detour {
	out := make([]detour.Detour, 0, len(s.ds))
	for _, sd := range s.ds {
		out = append(out, sd.Detour)
	}
	return out
}
