package policy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Measured applies the kernel's per-subflow measurements to the tables
// (rates, loss, RTTs, the connection's delivery history) and hands every
// measured connection to the strategy, which decides what to do.
func (p *Engine) Measured(now time.Time, ms []Measurement) []Intent {
	var touched []*kconn
	seen := map[*kconn]bool{}
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
		if !seen[k] {
			seen[k] = true
			touched = append(touched, k)
		}
		s.probedAt = now
		p.observe(k, s, m, now)
	}
	var out []Intent
	for _, k := range touched {
		k.hist = append(k.hist, sample{at: now, delivered: k.delivered})
		if cut := now.Add(-4 * p.cfg.Window); len(k.hist) > 2 && k.hist[0].at.Before(cut) {
			i := 0
			for i < len(k.hist)-2 && k.hist[i].at.Before(cut) {
				i++
			}
			k.hist = append(k.hist[:0], k.hist[i:]...)
		}
		if p.conns[k.c.Token] != k {
			continue // closed by an earlier connection's intents? (never today)
		}
		out = append(out, p.strat.measured(k, now)...)
	}
	return out
}

// observe updates a subflow's smoothed rate, loss and RTT from one sample.
func (p *Engine) observe(k *kconn, s *ksub, m Measurement, now time.Time) {
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
	if acked > 0 {
		s.lastAcked = now
	}
	if rcvd > 0 {
		s.recvd = true
		k.lastRecv = now
	}
	if dt > 0 {
		// Exponential moving averages with a one-second time constant.
		a := 1 - math.Exp(-dt.Seconds())
		s.rate += a * (float64(acked+rcvd)/dt.Seconds() - s.rate)
		limited := 0.0
		if m.SndCwnd > 0 && !m.AppLimited && (m.Unacked+1 >= m.SndCwnd || m.NotsentBytes > 0) {
			limited = 1
		}
		s.sendLimited += a * (limited - s.sendLimited)
		busy := 0.0
		if rcvd > 0 {
			busy = 1
		}
		s.recvBusy += a * (busy - s.recvBusy)
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
func (p *Engine) stalled(k *kconn, s *ksub, m Measurement, reason string) []Intent {
	k.lostAt = p.cfg.Now()
	s.stale, s.role, s.decision = true, RoleFailed, reason
	p.penalise(*s.d, reason)
	p.cfg.Log.Info("detour subflow failed", "token", fmt.Sprintf("%08x", k.c.Token), "path", PathName(s.d, ""), "reason", reason)
	out := []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID, Local: m.Local, Remote: m.Remote, Detour: s.d}}
	p.strat.gone(k, key(m.Local.Addr(), m.Remote))
	return append(out, p.fill(k)...)
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

// Report describes every tracked connection and detour.
func (p *Engine) Report() Report {
	var r Report
	now := p.cfg.Now()
	for _, k := range p.conns {
		cr := ConnReport{Token: k.c.Token, Selected: k.selected, Decision: k.decision, Cross: k.cross}
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
