package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// adaptive measures every subflow, fails over within a second when a path
// stops delivering (the engine's watchdog, failover.go), and tests one
// subflow at a time: set aside as backup for a window, it is kept when the
// connection delivers less without it and set aside or evicted when it
// does as well (docs/agent.md, "The adaptive policy").
type adaptive struct{ e *Engine }

// adaptiveConn is the adaptive strategy's state for one connection.
type adaptiveConn struct {
	trial    *trial
	nextEval time.Time
}

func (a *adaptive) conn(k *kconn) *adaptiveConn {
	return connState(k, func() *adaptiveConn { return &adaptiveConn{} })
}

func (*adaptive) name() string { return Adaptive.String() }

// prefer tries detours this connection has not used before ones it has.
func (*adaptive) prefer(k *kconn, x, y detour.Detour) bool {
	return !k.tried[Key(x)] && k.tried[Key(y)]
}

func (*adaptive) joinAsBackup(*kconn, detour.Detour) bool { return false }

func (a *adaptive) gone(k *kconn, sk subKey) {
	if ac, _ := k.st.(*adaptiveConn); ac != nil && ac.trial != nil && ac.trial.sub == sk {
		ac.trial = nil
	}
}

func (a *adaptive) measured(k *kconn, now time.Time) []Intent {
	out := a.e.watchdog(k, now)
	return append(out, a.evaluate(k, now)...)
}

// minTrialRate: below this (bytes/s) a connection is too idle to judge.
const minTrialRate = 64 << 10

// evaluate ends a trial that ran its window, or starts one: it sets one
// subflow aside (backup) for a window and compares what the connection
// delivers without it with what it delivered before. Harmful-looking
// subflows (loss, then a base RTT far above the best path's) are tested
// first; then, while untried detours remain, the detour subflow delivering
// least.
func (a *adaptive) evaluate(k *kconn, now time.Time) []Intent {
	p := a.e
	w := p.cfg.Window
	ac := a.conn(k)
	if t := ac.trial; t != nil {
		if now.Before(t.until) && !a.clearlyUseful(k, t, now) {
			return nil
		}
		ac.trial = nil
		s := k.subs[t.sub]
		if s == nil || !s.up || s.stale || s.dead {
			return nil
		}
		// Skip the first quarter of the window: the kernel's scheduler
		// takes a few RTTs to move the traffic.
		from := t.start.Add(w / 4)
		after, ok := k.rate(from, now)
		if !ok {
			return nil
		}
		// The next trial measures the configuration that stands now over
		// a window of its own (a baseline taken from this trial's window
		// would include the transient while the other paths take over the
		// freed capacity, and make the next path look dispensable).
		ac.nextEval = now.Add(w)
		return a.conclude(k, t, s, after, now)
	}
	if now.Before(ac.nextEval) || !k.selected {
		return nil
	}
	ac.nextEval = now.Add(w / 2)
	before, ok := k.rate(now.Add(-w), now)
	if !ok || before < minTrialRate || len(k.hist) == 0 || now.Sub(k.hist[0].at) < w {
		return nil
	}
	sk, why, revive := a.pick(k, now)
	if why == "" {
		return nil
	}
	s := k.subs[sk]
	paths, settle := 0, 500*time.Millisecond
	for _, o := range k.subs {
		if o.up && !o.stale && !o.dead && !o.backup && !o.configuredBackup() {
			paths++
			settle = max(settle, 3*o.baseRTT())
		}
	}
	ac.trial = &trial{sub: sk, revive: revive, start: now, until: now.Add(w), before: before, why: why, paths: paths, settle: settle}
	p.cfg.Log.Debug("subflow on trial", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "revive", revive, "why", why)
	if revive {
		s.decision = "probing: " + why
		s.role = RoleProbing
		in := p.setBackup(k, sk, s, false)
		s.role = RoleProbing
		return []Intent{in}
	}
	s.setAside = true
	in := p.setBackup(k, sk, s, true)
	s.role, s.decision = RoleProbing, "probing: "+why
	return []Intent{in}
}

// clearlyUseful ends a trial early when the connection already delivers
// far less without the subflow (below 80% of before, measured from the
// first quarter of the window over at least 0.5 s and 3 base RTTs of the
// longest path: a rate over fewer RTTs is noise): it is useful, and every
// further moment without it costs. Measured in the candidates scenario:
// setting a 300 ms path aside for a whole window dropped the aggregate
// from 40 to 14 Mbit/s (its data in flight blocks the others' in-order
// delivery), a trial that cost more than the path could ever harm.
func (a *adaptive) clearlyUseful(k *kconn, t *trial, now time.Time) bool {
	p := a.e
	if t.revive {
		return false
	}
	from := t.start.Add(p.cfg.Window / 4)
	if now.Sub(from) < t.settle {
		return false
	}
	r, ok := k.rate(from, now)
	t.cut = ok && r < 0.8*t.before
	return t.cut
}

// pick chooses the subflow to test next, or why == "" for none.
func (a *adaptive) pick(k *kconn, now time.Time) (sk subKey, why string, revive bool) {
	p := a.e
	type cand struct {
		sk    subKey
		s     *ksub
		score float64
		why   string
	}
	var active []cand
	best := time.Duration(0)
	for sk, s := range k.subs {
		if !s.up || s.stale || s.dead || !s.seen || s.promoted || s.configuredBackup() {
			continue
		}
		if s.backup {
			if s.setAside && now.After(s.keepUntil) {
				return sk, "set aside for " + p.cfg.Hold.String() + "; testing it again", true
			}
			continue
		}
		active = append(active, cand{sk: sk, s: s})
		if r := s.baseRTT(); r > 0 && (best == 0 || r < best) {
			best = r
		}
	}
	if len(active) < 2 {
		return sk, "", false // never set aside the only active path
	}
	var total float64
	for _, c := range active {
		total += c.s.rate
	}
	fair := total / float64(len(active))
	var harmful []cand
	for _, c := range active {
		s := c.s
		if now.Before(s.keepUntil) || now.Sub(s.upSince) < a.rampUp(s) {
			continue
		}
		// Loss first (scores above 1000), then base RTT: a lossy path
		// stalls the connection's in-order delivery more than a long one.
		// A long path is suspect only while it delivers less than half a
		// fair share: one that carries its share adds more than reordering
		// (brennan2017 core-limited with 100 ms on the default path: the
		// trial of that path, carrying half the aggregate, cost 7%).
		switch r := s.baseRTT(); {
		case s.loss > p.cfg.HarmLoss && s.randomLoss():
			harmful = append(harmful, cand{c.sk, s, 1000 + s.loss*100, fmt.Sprintf("loss %.1f%%", 100*s.loss)})
		case best > 0 && float64(r) > p.cfg.HarmRTT*float64(best)+float64(20*time.Millisecond) && s.rate < fair/2:
			harmful = append(harmful, cand{c.sk, s, float64(r) / float64(best), fmt.Sprintf("base RTT %s vs best %s", r.Round(time.Millisecond), best.Round(time.Millisecond))})
		}
	}
	if len(harmful) > 0 {
		slices.SortFunc(harmful, func(a, b cand) int { return cmp.Compare(b.score, a.score) })
		return harmful[0].sk, harmful[0].why, false
	}
	// Explore: while untried detours remain, test the detour subflow that
	// delivers least; one that adds nothing makes room for a candidate.
	if !p.untried(k, now) {
		return sk, "", false
	}
	var weakest *cand
	for i := range active {
		c := &active[i]
		if c.s.d == nil || now.Before(c.s.keepUntil) || now.Sub(c.s.upSince) < a.rampUp(c.s) {
			continue
		}
		if weakest == nil || c.s.rate < weakest.s.rate {
			weakest = c
		}
	}
	if weakest == nil {
		return sk, "", false
	}
	return weakest.sk, fmt.Sprintf("least delivering detour (%.1f Mbit/s) while untried candidates remain", weakest.s.rate*8/1e6), false
}

// randomLoss says whether a path's losses are its own (random loss on the
// path) rather than its queue overflowing under its own traffic: its
// smoothed RTT stays under twice its base RTT (a path that loses to a full
// queue first fills it). Every cubic flow loses a little to its bottleneck
// queue; measured in the candidates scenario: clean 10 Mbit/s paths showed
// 8-15% retransmissions at 130-160 ms smoothed on 40 ms, the 2% and 5%
// lossy ones 41-46 ms. Judging the former harmful set good paths aside.
func (s *ksub) randomLoss() bool {
	return s.minRTT == 0 || s.rtt < 2*s.minRTT
}

// rampUp is how long a new subflow is left alone before it is judged: a
// window, or 10 base RTTs where that is longer (slow start and cubic's
// growth take RTTs, not seconds: a 300 ms path needs ~3 s to carry its
// share, and judged after 2 s it looked like the least useful one).
func (a *adaptive) rampUp(s *ksub) time.Duration {
	p := a.e
	return max(p.cfg.Window, 10*s.baseRTT())
}

// conclude decides after a trial window.
func (a *adaptive) conclude(k *kconn, t *trial, s *ksub, after float64, now time.Time) []Intent {
	p := a.e
	mbit := func(r float64) string { return fmt.Sprintf("%.2f Mbit/s", r*8/1e6) }
	s.keepUntil = now.Add(p.cfg.Hold)
	if t.revive {
		if after >= 1.03*t.before {
			s.setAside = false
			s.role = RoleActive
			s.decision = fmt.Sprintf("active again: aggregate %s with it vs %s without", mbit(after), mbit(t.before))
			k.decision = s.path() + ": " + s.decision
			return nil
		}
		s.setAside = true
		s.decision = fmt.Sprintf("backup: aggregate %s with it vs %s without", mbit(after), mbit(t.before))
		k.decision = s.path() + ": " + s.decision
		sk := t.sub
		return []Intent{p.setBackup(k, sk, s, true)}
	}
	sk := t.sub
	// Explore: while this connection has untried detours, a detour that
	// adds less than half a fair share (1/paths of the aggregate) makes room
	// for one: a disjoint candidate is expected to add about a fair share.
	// Otherwise a path goes only if the connection does as well without it.
	// Found in the candidates scenario with K=2: two lossy detours, each
	// adding 6%, were "kept" and no good candidate was ever tried.
	keep := 0.97
	explore := s.d != nil && p.untried(k, now)
	if explore && t.paths > 1 {
		keep = min(keep, 1-0.5/float64(t.paths))
	}
	if !t.cut && after >= keep*t.before {
		// The connection does as well without it (or it adds too little
		// while candidates remain).
		verdict := fmt.Sprintf("aggregate %s without it vs %s with it (%s)", mbit(after), mbit(t.before), t.why)
		k.decision = s.path() + ": set aside, " + verdict
		p.cfg.Log.Info("subflow set aside", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "verdict", verdict)
		if explore {
			// Make room for an untried candidate.
			out := p.evict(k, sk, s, now.Add(p.cfg.Hold), "evicted: "+verdict)
			k.decision = s.path() + ": set aside, " + verdict
			return out
		}
		s.role, s.decision = RoleBackup, "backup: "+verdict
		return nil
	}
	s.setAside = false
	s.decision = fmt.Sprintf("kept: aggregate %s without it vs %s with it", mbit(after), mbit(t.before))
	k.decision = s.path() + ": " + s.decision
	p.cfg.Log.Debug("subflow kept", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "verdict", s.decision)
	return []Intent{p.setBackup(k, sk, s, false)}
}

type trial struct {
	sub    subKey
	revive bool // testing a backup subflow as active again
	start  time.Time
	until  time.Time
	before float64 // connection rate (bytes/s) over the window before
	why    string
	paths  int // active paths when the trial started, the subflow included
	// settle: the least time the rate without it is measured before the
	// trial may end early (3 base RTTs of the longest active path).
	settle time.Duration
	cut    bool // ended early: the connection clearly needs the subflow
}

func avoidKey(server netip.AddrPort, detourKey string) string {
	return server.String() + "|" + detourKey
}

// untried reports whether a detour this connection has not used is ready.
func (p *Engine) untried(k *kconn, now time.Time) bool {
	for _, d := range p.detours(k.c.Remote) {
		dk := Key(d)
		if k.tried[dk] || !d.Expires.IsZero() && !d.Expires.After(now) {
			continue
		}
		if h := p.health[dk]; h != nil && h.until.After(now) {
			continue
		}
		if until, ok := p.avoid[avoidKey(k.c.Remote, dk)]; ok && until.After(now) {
			continue
		}
		return true
	}
	return false
}
