package policy

import (
	"fmt"
	"net/netip"
	"time"
)

// eviction is what evict changed, for undoing it when the kernel refuses
// the destroy.
type eviction struct {
	role  Role      // the subflow's role before
	avoid string    // the avoid entry written ("" for no detour)
	until time.Time // the end written there
	prev  time.Time // the end it had before (zero: none)
}

// evict destroys subflow s (sk) of k because a strategy's rule took it
// out (SUBFLOW_DESTROY: the kernel re-sends its queue on the others at
// once) and, for a detour, avoids that detour for this server until
// until; fill then looks for a replacement and wakes the connection when
// the detour may join again. decision is the subflow's status decision
// (also the connection's).
func (p *Engine) evict(k *kconn, sk subKey, s *ksub, until time.Time, decision string) []Intent {
	ev := &eviction{role: s.role}
	s.stale, s.role, s.decision, s.evicted = true, RoleEvicted, decision, ev
	k.decision = s.path() + ": " + decision
	if s.d != nil {
		ev.avoid, ev.until = avoidKey(k.c.Remote, Key(*s.d)), until
		ev.prev = p.avoid[ev.avoid]
		p.avoid[ev.avoid] = until
	}
	return append([]Intent{destroyOf(k, sk, s)}, p.fill(k)...)
}

// destroyOf is the SUBFLOW_DESTROY of subflow s (sk) of k.
func destroyOf(k *kconn, sk subKey, s *ksub) Intent {
	return Intent{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
		Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Detour: s.d}
}

// destroyFailer is a strategy that acts further when the kernel refuses
// to destroy a subflow it evicted (evictRefused has undone the eviction).
type destroyFailer interface {
	destroyFailed(k *kconn, s *ksub, err error, now time.Time) []Intent
}

// evictRefused undoes an eviction whose SUBFLOW_DESTROY the kernel
// refused (EINVAL: the 6.18 userspace PM refuses a destroy only for a
// request it cannot parse or match; "not found" and a gone connection are
// not refusals, Engine.Failed lets those stand): the subflow counts as it
// did before, and its detour's avoid entry is restored unless someone
// wrote a newer one since (another eviction of the detour for this
// server, possibly another connection's, stands).
func (p *Engine) evictRefused(k *kconn, in Intent, err error) []Intent {
	_, s := k.find(in.Local, in.Remote)
	if s == nil || s.evicted == nil || !s.stale || !s.up || in.Local.Port() != 0 && s.port != 0 && in.Local.Port() != s.port {
		return nil // not an eviction (a stall, a withdrawn detour), or closed meanwhile
	}
	now := p.cfg.Now()
	ev := s.evicted
	s.evicted, s.stale, s.role = nil, false, ev.role
	if ev.avoid != "" && p.avoid[ev.avoid].Equal(ev.until) {
		if ev.prev.After(now) {
			p.avoid[ev.avoid] = ev.prev
		} else {
			delete(p.avoid, ev.avoid)
		}
	}
	s.decision = fmt.Sprintf("destroy refused by the kernel (%s): kept", errnoName(err))
	p.cfg.Log.Warn("subflow destroy refused by the kernel: kept", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "err", err)
	out := p.trim(k, s, now)
	if f, ok := p.strat.(destroyFailer); ok {
		out = append(out, f.destroyFailed(k, s, err, now)...)
	}
	k.decision = s.path() + ": " + s.decision
	return out
}

// trim closes the replacement fill opened for kept (an eviction the
// kernel refused) when the connection now has more detour subflows than
// it may: the newest one goes (one still connecting is closed when it
// comes up, SubflowEstablished).
func (p *Engine) trim(k *kconn, kept *ksub, now time.Time) []Intent {
	have := 0
	var newest *ksub
	var newestKey subKey
	for sk, s := range k.subs {
		if s.d == nil || s.stale || s.d.Backup {
			continue
		}
		have++
		if s != kept && (newest == nil || s.created.After(newest.created)) {
			newest, newestKey = s, sk
		}
	}
	if newest == nil || have <= p.capFor(k.c.Remote, now) {
		return nil
	}
	newest.stale, newest.role = true, RoleEvicted
	newest.decision = fmt.Sprintf("closed: the destroy of %s was refused, which carries on in its place", kept.path())
	if !newest.up || newest.port == 0 {
		return nil
	}
	return []Intent{destroyOf(k, newestKey, newest)}
}
