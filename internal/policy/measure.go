package policy

import (
	"cmp"
	"container/heap"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"time"
)

// Measured applies the kernel's per-subflow measurements. Both policies
// close a detour subflow whose path went silent; the adaptive one also runs
// the watchdog on every path (the default one included) and tests, one
// subflow at a time, what the connection delivers without it.
func (p *Manager) Measured(now time.Time, ms []Measurement) []Intent {
	touched := map[*kconn]bool{}
	var out []Intent
	for _, m := range ms {
		k := p.conns[m.Token]
		if k == nil || !k.established {
			continue
		}
		_, s := k.find(m.Local, m.Remote)
		if s == nil || !s.up || s.stale {
			continue
		}
		if s.redial && m.Local.Port() != s.port {
			continue // an older redial attempt: not tracked
		}
		touched[k] = true
		p.observe(k, s, m, now)
		if !p.adaptive() && s.d != nil && int(m.Retransmits) >= p.cfg.StallRetransmits {
			out = append(out, p.stalled(k, s, m, fmt.Sprintf("subflow stalled: %d retransmission timeouts", m.Retransmits))...)
		}
	}
	if !p.adaptive() {
		return out
	}
	for k := range touched {
		k.hist = append(k.hist, sample{at: now, delivered: k.delivered})
		if cut := now.Add(-4 * p.cfg.Window); len(k.hist) > 2 && k.hist[0].at.Before(cut) {
			i := 0
			for i < len(k.hist)-2 && k.hist[i].at.Before(cut) {
				i++
			}
			k.hist = append(k.hist[:0], k.hist[i:]...)
		}
		out = append(out, p.watchdog(k, now)...)
		out = append(out, p.evaluate(k, now)...)
	}
	return out
}

// observe updates a subflow's smoothed rate, loss and RTT from one sample.
func (p *Manager) observe(k *kconn, s *ksub, m Measurement, now time.Time) {
	if !s.seen {
		s.seen, s.m, s.lastProgress = true, m, now
		if m.RTT > 0 {
			s.rtt = m.RTT
		}
		if m.MinRTT > 0 {
			s.minRTT = m.MinRTT
		}
		return
	}
	prev := s.m
	s.m = m
	dt := now.Sub(s.lastSample())
	acked := sub64(m.BytesAcked, prev.BytesAcked)
	rcvd := sub64(m.BytesReceived, prev.BytesReceived)
	if acked+rcvd > 0 {
		s.lastProgress = now
		s.retrying = false // a retried path that delivers works again
		k.delivered += acked + rcvd
		if !s.proven && now.Sub(s.upSince) >= p.cfg.MinLifetime {
			s.proven = true
			p.healthy(k, s)
		}
	}
	if rcvd > 0 {
		s.recvd = true
		k.lastRecv = now
	}
	if dt > 0 {
		// Exponential moving averages with a one-second time constant.
		a := 1 - math.Exp(-dt.Seconds())
		s.rate += a * (float64(acked+rcvd)/dt.Seconds() - s.rate)
		if segs := m.SegsOut - prev.SegsOut; segs > 0 && segs < 1<<30 {
			re := float64(m.TotalRetrans-prev.TotalRetrans) / float64(segs)
			s.loss += a * (min(max(re, 0), 1) - s.loss)
		}
	}
	// The smoothed RTT freezes while a path is dead; keep the last good one.
	if m.RTT > 0 && m.Retransmits == 0 {
		s.rtt = m.RTT
	}
	if m.MinRTT > 0 {
		s.minRTT = m.MinRTT
	}
	s.sampledAt = now
}

func (s *ksub) lastSample() time.Time { return s.sampledAt }

func sub64(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// stalled closes a detour subflow whose path went silent and replaces it.
func (p *Manager) stalled(k *kconn, s *ksub, m Measurement, reason string) []Intent {
	s.stale, s.role, s.decision = true, RoleFailed, reason
	p.penalise(*s.d, reason)
	p.cfg.Log.Info("detour subflow failed", "token", fmt.Sprintf("%08x", k.c.Token), "path", PathName(s.d, ""), "reason", reason)
	out := []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID, Local: m.Local, Remote: m.Remote, Detour: s.d}}
	if k.trial != nil && k.trial.sub == key(m.Local.Addr(), m.Remote) {
		k.trial = nil
	}
	return append(out, p.fill(k)...)
}

// watchdog declares dead a path that stopped delivering while data is
// outstanding: no progress for max(3 x RTT, Watchdog) with segments
// unacknowledged after a retransmission timeout (upload), or while other
// subflows of the connection keep receiving (download). A dead detour
// subflow is closed (the kernel reinjects its data) and replaced; a dead
// default or announced path is set aside as backup, another backup is
// promoted if nothing active is left, and it is revived once it delivers.
func (p *Manager) watchdog(k *kconn, now time.Time) []Intent {
	var out []Intent
	for sk, s := range k.subs {
		if !s.up || s.stale || !s.seen || s.sampledAt != now {
			continue
		}
		limit := max(3*s.rtt, p.cfg.Watchdog)
		quiet := now.Sub(s.lastProgress)
		if s.dead {
			switch {
			case quiet == 0:
				s.dead, s.role = false, RoleActive
				s.decision = "revived: delivering again"
				p.cfg.Log.Info("path revived", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path())
				if s.setAside {
					s.setAside = false
					out = append(out, p.setBackup(k, sk, s, false))
				}
			case s.setAside && !now.Before(s.retryAt):
				// Retry: active again, judged afresh by the watchdog; if
				// the path is still dead it is set aside again, later.
				s.dead, s.setAside, s.retrying = false, false, true
				s.lastProgress = now
				s.decision = "retrying a dead path"
				s.retryGap = min(2*s.retryGap, p.cfg.Hold)
				out = append(out, p.setBackup(k, sk, s, false))
				s.role = RoleProbing
				if s.initial {
					out = append(out, p.redial(k, now)...)
				}
			}
			continue
		}
		if s.backup {
			continue // the kernel sends nothing new on a backup subflow
		}
		sendStuck := s.m.Unacked > 0 && s.m.Retransmits > 0 && quiet > limit
		recvStuck := s.recvd && k.lastRecv.After(s.lastProgress) && quiet > limit && s.m.SinceDataRecv > limit
		if !sendStuck && !recvStuck {
			continue
		}
		dir := "upload"
		if !sendStuck {
			dir = "download"
		}
		reason := fmt.Sprintf("watchdog: no progress for %s (limit %s, %s)", quiet.Round(time.Millisecond), limit.Round(time.Millisecond), dir)
		if s.d != nil {
			out = append(out, p.stalled(k, s, s.m, reason)...)
			continue
		}
		if s.redial {
			// A redial that stopped delivering: close it (its close event
			// then finds no record); the default path's retries redial.
			delete(k.subs, sk)
			out = append(out, Intent{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
				Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote})
			continue
		}
		s.dead, s.role, s.decision = true, RoleFailed, reason
		if s.retryGap == 0 || now.Sub(s.retryAt) > p.cfg.Hold {
			s.retryGap = time.Second // first failure, or the last one long ago
		}
		s.retryAt = now.Add(s.retryGap)
		p.cfg.Log.Info("path failed", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "reason", reason)
		if !s.backup {
			s.setAside = true
			out = append(out, p.setBackup(k, sk, s, true))
		}
		if k.trial != nil && k.trial.sub == sk {
			k.trial = nil
		}
	}
	out = append(out, p.redialed(k, now)...)
	// Nothing active left that works: promote backups. Promoted ones do
	// not count as active paths, so that once a path of its own works
	// again they go back to backup (a configured backup must not stay a
	// primary path: its share while the primary is healthy is the point).
	// Promotion needs a path that died: at a connection's start the
	// default path may not be measured yet, which is no reason to use a
	// backup.
	active, died := false, false
	for _, s := range k.subs {
		// A dead path being retried (probing) is not a working path yet:
		// demoting the backup for it would stall until the watchdog
		// kills the retry; it counts once it delivered (revived: active).
		if s.up && !s.stale && !s.dead && !s.backup && !s.promoted && !s.configuredBackup() && !s.retrying {
			active = true
		}
		if s.dead {
			died = true
		}
	}
	for sk, s := range k.subs {
		switch {
		case !active && died && s.up && !s.stale && !s.dead && s.backup:
			s.decision = "promoted: no active path left"
			s.setAside, s.promoted = false, true
			out = append(out, p.setBackup(k, sk, s, false))
		case active && s.promoted && s.up && !s.stale:
			s.promoted = false
			s.decision = "back to backup: an active path works again"
			out = append(out, p.setBackup(k, sk, s, true))
		}
	}
	return out
}

// redial opens a fresh subflow on the default path (same addresses, a new
// local port) when a dead default path is retried. The old subflow's
// retransmission timer has backed off exponentially during the outage (in a
// download it is the server's, which the client cannot hurry): after a 4 s
// outage the kernel alone took 6 s and more to use the path again
// (docs/results/failover-download). A fresh subflow has no backoff: its
// SYN, retransmitted 1 s and 3 s later, gets through as soon as the path
// is back, and the peer's scheduler sends on it at once. A redial still
// pending (SYN_SENT) is not repeated; one given up on (ConnectTimeout)
// stays in the kernel until its SYN retries end, and is adopted if it
// comes up.
func (p *Manager) redial(k *kconn, now time.Time) []Intent {
	rk := key(k.c.Local.Addr(), k.c.Remote)
	rk.redial = true
	r := k.subs[rk]
	if r != nil && !r.stale {
		return nil
	}
	if r == nil {
		r = &ksub{redial: true}
		k.subs[rk] = r
	}
	// Earlier attempts given up on may still come up (attempts counts
	// them): the record serves them all.
	r.stale, r.created, r.role, r.decision = false, now, RoleConnecting, "redialling the dead default path"
	r.attempts++
	heap.Push(&p.wake, wakeup{at: now.Add(p.cfg.ConnectTimeout), token: k.c.Token, check: true})
	return []Intent{{Action: CreateSubflow, Token: k.c.Token, Local: netip.AddrPortFrom(k.c.Local.Addr(), 0), Remote: k.c.Remote}}
}

// redialed settles a redial against the subflow it replaces: once the
// redial delivers while the old default subflow is still dead (or being
// retried), the old one is closed and the redial becomes the default path;
// once the old one delivers again, the redial is closed.
func (p *Manager) redialed(k *kconn, now time.Time) []Intent {
	bk := key(k.c.Local.Addr(), k.c.Remote)
	rk := bk
	rk.redial = true
	r, b := k.subs[rk], k.subs[bk]
	if r == nil || !r.up || r.stale {
		return nil
	}
	switch {
	case b == nil:
		// The old subflow is gone (closed by the kernel): the redial is
		// the default path now.
	case !b.dead && !b.retrying && !b.setAside:
		// The old subflow came back by itself: one default subflow is
		// enough.
		r.stale = true
		delete(k.subs, rk)
		return []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: r.localID,
			Local: netip.AddrPortFrom(rk.local, r.port), Remote: rk.remote}}
	case r.lastProgress.Before(now) || !r.seen || r.sampledAt != now:
		return nil // not delivering yet
	}
	var out []Intent
	if b != nil {
		b.stale = true
		out = append(out, Intent{Action: DestroySubflow, Token: k.c.Token, LocalID: b.localID,
			Local: netip.AddrPortFrom(bk.local, b.port), Remote: bk.remote})
		if k.trial != nil && k.trial.sub == bk {
			k.trial = nil
		}
	}
	delete(k.subs, rk)
	r.redial, r.initial, r.role = false, true, RoleActive
	r.decision = "redialled: the default path delivers again on a fresh subflow"
	if b != nil {
		r.retryGap, r.retryAt = b.retryGap, b.retryAt
	}
	k.subs[bk] = r
	k.decision = "default: " + r.decision
	p.cfg.Log.Info("path revived", "token", fmt.Sprintf("%08x", k.c.Token), "path", "default", "how", "redial", "port", r.port)
	return out
}

// configuredBackup: a subflow through a detour the configuration marks
// backup. It is never a primary path: not counted as one, never tested
// (set aside or revived) by trials, used only while no primary works.
func (s *ksub) configuredBackup() bool { return s.d != nil && s.d.Backup }

func (s *ksub) path() string {
	switch {
	case s.initial:
		return "default"
	case s.redial:
		return "default (redial)"
	}
	return PathName(s.d, "announced")
}

// setBackup asks the kernel to change a subflow's backup flag.
func (p *Manager) setBackup(k *kconn, sk subKey, s *ksub, on bool) Intent {
	s.backup = on
	switch {
	case s.dead:
	case on:
		s.role = RoleBackup
	default:
		s.role = RoleActive
	}
	return Intent{Action: SetBackup, Token: k.c.Token, LocalID: s.localID,
		Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Backup: on, Detour: s.d}
}

// rate is the connection's delivery rate (bytes/s) over [from, to].
func (k *kconn) rate(from, to time.Time) (float64, bool) {
	var a, b *sample
	for i := range k.hist {
		h := &k.hist[i]
		if a == nil && !h.at.Before(from) {
			a = h
		}
		if !h.at.After(to) {
			b = h
		}
	}
	if a == nil || b == nil || !b.at.After(a.at) {
		return 0, false
	}
	return float64(b.delivered-a.delivered) / b.at.Sub(a.at).Seconds(), true
}

// minTrialRate: below this (bytes/s) a connection is too idle to judge.
const minTrialRate = 64 << 10

// evaluate ends a trial that ran its window, or starts one: it sets one
// subflow aside (backup) for a window and compares what the connection
// delivers without it with what it delivered before. Harmful-looking
// subflows (loss, then a base RTT far above the best path's) are tested
// first; then, while untried detours remain, the detour subflow delivering
// least.
func (p *Manager) evaluate(k *kconn, now time.Time) []Intent {
	w := p.cfg.Window
	if t := k.trial; t != nil {
		if now.Before(t.until) && !p.clearlyUseful(k, t, now) {
			return nil
		}
		k.trial = nil
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
		k.nextEval = now.Add(w)
		return p.conclude(k, t, s, after, now)
	}
	if now.Before(k.nextEval) || !k.selected {
		return nil
	}
	k.nextEval = now.Add(w / 2)
	before, ok := k.rate(now.Add(-w), now)
	if !ok || before < minTrialRate || len(k.hist) == 0 || now.Sub(k.hist[0].at) < w {
		return nil
	}
	sk, why, revive := p.pick(k, now)
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
	k.trial = &trial{sub: sk, revive: revive, start: now, until: now.Add(w), before: before, why: why, paths: paths, settle: settle}
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
func (p *Manager) clearlyUseful(k *kconn, t *trial, now time.Time) bool {
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
func (p *Manager) pick(k *kconn, now time.Time) (sk subKey, why string, revive bool) {
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
		if now.Before(s.keepUntil) || now.Sub(s.upSince) < p.rampUp(s) {
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
		if c.s.d == nil || now.Before(c.s.keepUntil) || now.Sub(c.s.upSince) < p.rampUp(c.s) {
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
func (p *Manager) rampUp(s *ksub) time.Duration {
	return max(p.cfg.Window, 10*s.baseRTT())
}

// baseRTT is the path's RTT without queueing: the kernel's minimum RTT,
// else the smoothed one. Judging by the smoothed RTT would call every path
// whose queue a bulk transfer fills "long" (measured in the candidates
// scenario: 120-160 ms smoothed on 30-40 ms paths), and test them first.
func (s *ksub) baseRTT() time.Duration {
	if s.minRTT > 0 {
		return s.minRTT
	}
	return s.rtt
}

// conclude decides after a trial window.
func (p *Manager) conclude(k *kconn, t *trial, s *ksub, after float64, now time.Time) []Intent {
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
			s.stale, s.role, s.decision = true, RoleEvicted, "evicted: "+verdict
			p.avoid[avoidKey(k.c.Remote, Key(*s.d))] = now.Add(p.cfg.Hold)
			out := []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
				Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Detour: s.d}}
			return append(out, p.fill(k)...)
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

// Report describes every tracked connection and detour.
func (p *Manager) Report() Report {
	var r Report
	now := p.cfg.Now()
	for _, k := range p.conns {
		cr := ConnReport{Token: k.c.Token, Selected: k.selected, Decision: k.decision}
		if now.Before(k.holdUntil) {
			cr.HoldUntil = k.holdUntil
		}
		if len(k.refusals) > 0 {
			cr.Refusals = make(map[string]int, len(k.refusals))
			maps.Copy(cr.Refusals, k.refusals)
		}
		for sk, s := range k.subs {
			role := s.role
			if role == "" {
				role = RoleActive
			}
			cr.Subflows = append(cr.Subflows, SubflowReport{Local: sk.local, Port: s.port, Remote: sk.remote, Path: s.path(),
				Role: role, RTT: s.rtt, Rate: s.rate, Loss: s.loss, Decision: s.decision})
		}
		slices.SortFunc(cr.Subflows, func(a, b SubflowReport) int {
			if c := a.Local.Compare(b.Local); c != 0 {
				return c
			}
			return a.Remote.Compare(b.Remote)
		})
		r.Conns = append(r.Conns, cr)
	}
	slices.SortFunc(r.Conns, func(a, b ConnReport) int { return cmp.Compare(a.Token, b.Token) })
	seen := map[string]bool{}
	for server := range p.servers {
		for _, d := range p.detours(server) {
			dk := Key(d)
			if seen[dk] {
				continue
			}
			seen[dk] = true
			dr := DetourReport{Detour: d}
			if h := p.health[dk]; h != nil {
				dr.Fails, dr.Total, dr.LastError = h.fails, h.total, h.lastErr
				if h.until.After(now) {
					dr.BackoffUntil = h.until
				}
			}
			r.Detours = append(r.Detours, dr)
		}
	}
	slices.SortFunc(r.Detours, func(a, b DetourReport) int {
		if c := cmp.Compare(a.Detour.Relay, b.Detour.Relay); c != 0 {
			return c
		}
		return a.Detour.Remote.Compare(b.Detour.Remote)
	})
	return r
}
