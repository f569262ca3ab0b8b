package agent

import (
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// StaticSource serves the detours written in the config.
type StaticSource struct{ ds []StaticDetour }

// NewStaticSource returns a source for ds.
func NewStaticSource(ds []StaticDetour) *StaticSource { return &StaticSource{ds: ds} }

// Prepare has nothing to ask for: static detours are always ready.
func (s *StaticSource) Prepare(netip.AddrPort) {}

// Detours returns the NAT detours leading to server and the tunnels that
// reach it (a tunnel subflow connects to the server itself).
func (s *StaticSource) Detours(server netip.AddrPort) []detour.Detour {
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
func (s *StaticSource) All() []detour.Detour {
	out := make([]detour.Detour, 0, len(s.ds))
	for _, sd := range s.ds {
		out = append(out, sd.Detour)
	}
	return out
}
