package policy

import (
	"container/heap"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// serverCap is a learned limit of a server's extra subflows.
type serverCap struct {
	n     int
	until time.Time
}

type health struct {
	fails   int // consecutive failures (backoff)
	total   int
	until   time.Time
	last    time.Time
	lastErr string
}

func closeReason(errno uint8, wasUp, short bool, min time.Duration) string {
	switch {
	case errno != 0:
		return "subflow closed: " + syscall.Errno(errno).Error()
	case !wasUp:
		return "subflow closed before it was established"
	case short:
		return fmt.Sprintf("subflow closed within %s of joining (server refusing subflows?)", min)
	}
	return "subflow closed"
}

// joined counts the connection's extra subflows that are up (detours,
// announced addresses, a redial): what its server accepted.
func (k *kconn) joined() int {
	n := 0
	for _, s := range k.subs {
		if !s.initial && s.up && !s.stale {
			n++
		}
	}
	return n
}

// learnCap records that k's server accepts at most n extra subflows.
func (p *Engine) learnCap(k *kconn, n int, now time.Time) {
	c, had := p.caps[k.c.Remote]
	if had && now.Before(c.until) && c.n <= n {
		n = c.n
	}
	p.caps[k.c.Remote] = serverCap{n: n, until: now.Add(10 * p.cfg.Hold)}
	reason := fmt.Sprintf("server accepts at most %d extra subflows (joins beyond are reset)", n)
	p.refused(k, reason, false)
	if !had || c.n != n {
		p.cfg.Log.Info("server subflow limit learned", "server", k.c.Remote, "extra_subflows", n, "for", 10*p.cfg.Hold)
	}
}

// capFor is the number of detour subflows to keep toward server.
func (p *Engine) capFor(server netip.AddrPort, now time.Time) int {
	n := p.cfg.Subflows
	if c, ok := p.caps[server]; ok {
		if now.Before(c.until) {
			n = min(n, c.n)
		} else {
			delete(p.caps, server)
		}
	}
	return n
}

// refused counts a refusal against the connection; after three in a row the
// connection is held (no new subflow) with exponential backoff and jitter,
// so that a server that refuses every join is not asked thousands of times.
// hold=false only records it (status, log) without counting towards a hold.
func (p *Engine) refused(k *kconn, reason string, hold bool) {
	if k.refusals == nil {
		k.refusals = map[string]int{}
	}
	short := reason
	if len(k.refusals) >= 16 && k.refusals[reason] == 0 {
		short = "other"
	}
	k.refusals[short]++
	if k.refusals[short] == 1 {
		p.cfg.Log.Info("subflow refused", "token", fmt.Sprintf("%08x", k.c.Token), "server", k.c.Remote, "reason", reason)
	}
	if !hold {
		return
	}
	k.fails++
	if k.fails < 3 {
		return
	}
	wait := p.cfg.Backoff << min(k.fails-3, 20)
	if wait > p.cfg.MaxBackoff || wait <= 0 {
		wait = p.cfg.MaxBackoff
	}
	// ±25% jitter, so that many connections to one server spread out.
	wait = time.Duration(float64(wait) * (0.75 + 0.5*p.cfg.Rand()))
	now := p.cfg.Now()
	k.holdUntil = now.Add(wait)
	k.decision = fmt.Sprintf("holding new subflows for %s after %d refusals in a row (last: %s)", wait.Round(time.Millisecond), k.fails, reason)
	if k.fails == 3 || k.fails%10 == 0 {
		p.cfg.Log.Warn("connection keeps refusing subflows; backing off", "token", fmt.Sprintf("%08x", k.c.Token),
			"server", k.c.Remote, "refusals", k.fails, "wait", wait, "last", reason)
	}
	heap.Push(&p.wake, wakeup{at: k.holdUntil, token: k.c.Token})
}

func (p *Engine) penalise(d detour.Detour, reason string) {
	now := p.cfg.Now()
	h := p.health[Key(d)]
	if h == nil {
		h = &health{}
		p.health[Key(d)] = h
	}
	h.fails++
	h.total++
	wait := p.cfg.Backoff << min(h.fails-1, 20)
	if wait > p.cfg.MaxBackoff || wait <= 0 {
		wait = p.cfg.MaxBackoff
	}
	h.until, h.last, h.lastErr = now.Add(wait), now, reason
	p.cfg.Log.Info("detour failed", "detour", d.String(), "fails", h.fails, "retry_after", wait, "reason", reason)
}

func errnoName(err error) string {
	var en syscall.Errno
	if errors.As(err, &en) {
		return en.Error()
	}
	return "error"
}

func (p *Engine) fails(d detour.Detour) int {
	if h := p.health[Key(d)]; h != nil {
		return h.fails
	}
	return 0
}

// detourUpElsewhere says whether another connection than k has a live
// subflow through d.
func (p *Engine) detourUpElsewhere(d detour.Detour, k *kconn) bool {
	dk := Key(d)
	for _, o := range p.conns {
		if o == k {
			continue
		}
		for _, s := range o.subs {
			if s.d != nil && s.up && !s.stale && Key(*s.d) == dk {
				return true
			}
		}
	}
	return false
}

// Backoff reports until when a detour is being avoided (zero if usable).
func (p *Engine) Backoff(d detour.Detour) time.Time {
	if h := p.health[Key(d)]; h != nil && h.until.After(p.cfg.Now()) {
		return h.until
	}
	return time.Time{}
}

// healthy records that a subflow lived: its detour's and its connection's
// consecutive failures are forgotten.
func (p *Engine) healthy(k *kconn, s *ksub) {
	k.fails = 0
	if s.d != nil {
		if h := p.health[Key(*s.d)]; h != nil {
			h.fails = 0
		}
	}
}
