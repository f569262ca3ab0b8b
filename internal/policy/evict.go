package policy

import (
	"net/netip"
	"time"
)

// evict destroys subflow s (sk) of k because a strategy's rule took it
// out (SUBFLOW_DESTROY: the kernel re-sends its queue on the others at
// once) and, for a detour, avoids that detour for this server until
// until; fill then looks for a replacement and wakes the connection when
// the detour may join again. decision is the subflow's status decision
// (also the connection's).
func (p *Engine) evict(k *kconn, sk subKey, s *ksub, until time.Time, decision string) []Intent {
	s.stale, s.role, s.decision = true, RoleEvicted, decision
	k.decision = s.path() + ": " + decision
	if s.d != nil {
		p.avoid[avoidKey(k.c.Remote, Key(*s.d))] = until
	}
	out := []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
		Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Detour: s.d}}
	return append(out, p.fill(k)...)
}
