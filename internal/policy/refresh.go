package policy

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Refresh acts on a change of the sources' detours (detour.Notifier: a
// relay grant arrived, a discovered relay left the roster). A NAT detour
// subflow whose detour no source offers any more (its relay was dropped,
// or lost the mapping and granted another port) is closed: nobody renews
// its mapping, and on a relay that died it carries nothing. Then every
// connection short of detour subflows is filled at once, instead of at
// its next poll (which backs off up to 30 s and stops a minute after the
// connection's last attempt).
func (p *Engine) Refresh(now time.Time) []Intent {
	var out []Intent
	offered := map[netip.AddrPort]map[string]bool{}
	for _, k := range p.conns {
		if !k.selected || !k.established {
			continue
		}
		off := offered[k.c.Remote]
		if off == nil {
			off = map[string]bool{}
			for _, d := range p.detours(k.c.Remote) {
				off[Key(d)] = true
			}
			offered[k.c.Remote] = off
		}
		for sk, s := range k.subs {
			if s.d == nil || s.stale || s.d.Kind != detour.NAT || off[Key(*s.d)] {
				continue
			}
			s.stale, s.role = true, RoleEvicted
			s.decision = "withdrawn: no source offers the detour any more (its relay left the roster or lost the mapping)"
			p.cfg.Log.Info("detour withdrawn, subflow closed", "token", fmt.Sprintf("%08x", k.c.Token), "path", PathName(s.d, ""))
			if s.up && s.port != 0 {
				out = append(out, Intent{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
					Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Detour: s.d})
			}
			p.strat.gone(k, sk)
		}
		out = append(out, p.fill(k)...)
	}
	return out
}
