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
	gap   time.Duration // how long it held when last learned
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

// DefaultMinLifetime is Config.MinLifetime's default: a join closed
// sooner after it came up was refused (by the server's limit or because
// the connection was closing), not closed cleanly.
const DefaultMinLifetime = 2 * time.Second

// capCheck is how long a learned server limit first holds before a new
// connection tries more joins again (re-checks it); each confirmation
// doubles it, up to 10 x Hold.
const capCheck = 10 * time.Second

// learnCap records that k's server accepts at most n extra subflows, for a
// while: the next connection after that re-checks it by asking for N
// again. (It used to hold for 10 x Hold, 5 minutes, whatever the evidence;
// a wrongly learned limit then cost every connection its detours.)
func (p *Engine) learnCap(k *kconn, n int, now time.Time) {
	c, had := p.caps[k.c.Remote]
	gap := capCheck
	if had {
		if now.Before(c.until) && c.n <= n {
			n = c.n
		}
		if now.Sub(c.until) < c.gap {
			// Confirmed soon after a re-check: hold it longer.
			gap = min(2*c.gap, 10*p.cfg.Hold)
		}
		if now.Before(c.until) {
			gap = max(gap, c.gap)
		}
	}
	p.caps[k.c.Remote] = serverCap{n: n, until: now.Add(gap), gap: gap}
	reason := fmt.Sprintf("server accepts at most %d extra subflows (joins beyond are reset)", n)
	p.refused(k, reason, false)
	if !had || c.n != n || !now.Before(c.until) {
		p.cfg.Log.Info("server subflow limit learned", "server", k.c.Remote, "extra_subflows", n, "recheck_after", gap)
	}
}

// capFor is the number of detour subflows to keep toward server.
func (p *Engine) capFor(server netip.AddrPort, now time.Time) int {
	n := p.cfg.Subflows
	if c, ok := p.caps[server]; ok {
		switch {
		case now.Before(c.until):
			n = min(n, c.n)
		case now.Sub(c.until) > 10*p.cfg.Hold:
			delete(p.caps, server) // long past: forget it (bounded map)
		}
	}
	return n
}

// capDisproved forgets a learned limit once a connection to the server
// keeps more extra subflows than it for MinLifetime.
func (p *Engine) capDisproved(k *kconn) {
	if c, ok := p.caps[k.c.Remote]; ok && k.joined() > c.n {
		delete(p.caps, k.c.Remote)
		p.cfg.Log.Info("server subflow limit no longer holds", "server", k.c.Remote, "extra_subflows", k.joined())
	}
}

// maxNotConnRounds bounds the retries of a connection found by inet_diag
// whose SUBFLOW_CREATE the kernel refuses with ENOTCONN.
const maxNotConnRounds = 4

// finish ends all work for a connection the kernel refused in a way that
// is final for it: no subflow is opened, retried or redialled any more.
func (p *Engine) finish(k *kconn, why string) {
	k.finished, k.retryAt, k.decision = why, time.Time{}, "no more subflows: "+why
	p.cfg.Log.Debug("connection finished", "token", fmt.Sprintf("%08x", k.c.Token), "server", k.c.Remote, "why", why)
}

// spend takes one SUBFLOW_CREATE from the connection's budget, a token
// bucket: twice its slots (N detour subflows plus its configured backups)
// to start with, refilled by one per Backoff (and by two when a subflow
// lived: replacing it later is fair). An empty budget holds the connection
// until the next token. Refusal holds and final errors end the retry
// loops; this bounds whatever is left (target: creates <= 2 x the
// subflows that can exist).
func (p *Engine) spend(k *kconn, now time.Time) bool {
	full := float64(2 * p.slots(k))
	if !k.budgetSet {
		k.budgetSet, k.budget, k.budgetAt = true, full, now
	}
	k.budget = min(full, k.budget+float64(now.Sub(k.budgetAt))/float64(p.cfg.Backoff))
	k.budgetAt = now
	if k.budget >= 1 {
		k.budget--
		return true
	}
	if now.Before(k.holdUntil) {
		return false
	}
	k.holdUntil = now.Add(time.Duration((1 - k.budget) * float64(p.cfg.Backoff)))
	p.refused(k, "subflow budget used up (creates limited to one per backoff)", false)
	heap.Push(&p.wake, wakeup{at: k.holdUntil, token: k.c.Token})
	return false
}

// slots is how many detour subflows k may have at once.
func (p *Engine) slots(k *kconn) int {
	n := max(p.cfg.Subflows, 1)
	for _, d := range p.detours(k.c.Remote) {
		if d.Backup && n < 64 {
			n++
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

// localShortage: the kernel refused for want of a local resource
// (ephemeral ports under churn: docs/agent.md, "Benchmark: connection
// rate"), not because of the detour.
func localShortage(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS)
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
	if k.budgetSet {
		k.budget = min(k.budget+2, float64(2*p.slots(k)))
	}
	if !s.initial {
		p.capDisproved(k)
	}
	if s.d != nil {
		if h := p.health[Key(*s.d)]; h != nil {
			h.fails = 0
		}
	}
}
