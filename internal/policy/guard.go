package policy

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// guard is static (every detour subflow active from the start, stalled
// ones replaced) plus one rule against the harm a poor path does
// (issue 26, docs/results/design/harm): it sheds a subflow that is
// slower than the connection's main carrier and delivers little.
//
// The mechanism, measured in the lab (docs/results/design/harm): the
// kernel's scheduler puts data on the slow, lossy subflow, which then
// holds it for seconds (its queue drains at its collapsed congestion
// window; the kernel re-sends it elsewhere only after stale_loss_cnt RTOs,
// and never opportunistically). Until that data arrives the connection's
// data-level ack (snd_una) stands still, the MPTCP send buffer fills with
// data the fast path already delivered, and the fast subflow runs idle
// (nothing in flight, nothing queued), then bursts a whole congestion
// window into its bottleneck queue when the buffer frees (its own losses
// rise 5-10 x). The MPTCP-level receive window was never the limit
// (several MB open). What the sender sees: the slow subflow delivers a
// small share of the connection's bytes (0.03-0.18 at the harmed points,
// 0.39-0.86 for the slower subflow where the detour helped).
//
// The rule: every probe computes each active subflow's share of the
// bytes the connection delivered over its judging window, Window or 4 of
// its base RTTs if longer (at most 8 s), once it has been up for twice
// that; a subflow whose share is below Share while its base RTT is more
// than GuardRTT times that of the subflow delivering the most is
// destroyed (SUBFLOW_DESTROY: the kernel re-sends its queue on the
// others at once, so nothing stays stranded). Only when the connection is
// busy (at least 64 KB/s) and another subflow delivers, and (Starve, after
// docs/results/design/guard2) only while that subflow starves: its
// smoothed share of probes limited by its congestion window or pacing is
// below Starve. At p114 and p047 of the design the rule without that
// condition shed a slow detour that still added goodput while the fast
// subflow stayed window-limited (0.98-1.0 at every such shed). Where the
// agent's host receives, its subflows are never window-limited here, so
// the condition holds and the rule is the one before. A shed detour is
// avoided for this server for Hold, then joins again (active) and is
// judged again; the default path's subflow is shed the same way and
// rejoins the same way (a fresh subflow on it, as failover's redial) after
// Hold, or at once when no other subflow is left up: the connection goes
// on through its detours, the watchdog of static replaces those that
// stall, and a connection whose detours all stalled or were withdrawn is
// not left without a path.
type guard struct {
	e  *Engine
	st static
	// shedDefault: the connections (tokens) whose default path the rule
	// shed, and when it rejoins (Hold later); checked at every Tick.
	shedDefault map[uint32]time.Time
}

const (
	// defaultGuardRTT: a subflow is "slower" than the main carrier when
	// its base RTT exceeds the carrier's by this factor (GuardRTT).
	defaultGuardRTT = 1.25
	// guardRTTs: a subflow is judged over at least this many of its base
	// RTTs, and only after twice that time up (slow start of a long path
	// is not a verdict); guardKeep bounds the window (and the history).
	guardRTTs = 4
	guardKeep = MaxGuardWindow
	// MaxGuardWindow is the longest judging window (GuardWindow above it
	// would be cut to it).
	MaxGuardWindow = 8 * time.Second
	// Defaults of GuardShare and GuardWindow (docs/agent.md).
	defaultGuardShare  = 0.25
	defaultGuardWindow = time.Second
	defaultGuardStarve = 0.5
	defaultGuardOutage = 1
)

// gConn keeps each subflow's delivered bytes per probe over the last
// Window (and a little more).
type gConn struct {
	hist []gSample
	// rejoin: when the detour shed last stops being avoided (Hold).
	rejoin time.Time
	// retry: a shed the kernel refused is tried again from here (one
	// judging window later, not at every probe).
	retry time.Time
	// outage: when each subflow was last seen with GuardOutage
	// consecutive retransmission timeouts.
	outage map[subKey]time.Time
}

type gSample struct {
	at    time.Time
	bytes map[subKey]uint64
}

func (*guard) name() string                                     { return Guard.String() }
func (*guard) prefer(*kconn, detour.Detour, detour.Detour) bool { return false }
func (*guard) joinAsBackup(*kconn, detour.Detour) bool          { return false }
func (*guard) gone(*kconn, subKey)                              {}

func (g *guard) conn(k *kconn) *gConn { return connState(k, func() *gConn { return &gConn{} }) }

func (g *guard) measured(k *kconn, now time.Time) []Intent {
	out := g.st.measured(k, now)
	if !k.selected {
		return out
	}
	gc := g.conn(k)
	// If another connection to the server shed the detour since (the
	// avoid is the server's), fill wakes the connection when that Hold
	// ends.
	out = append(out, g.e.rejoin(k, &gc.rejoin, now)...)
	snap := gSample{at: now, bytes: map[subKey]uint64{}}
	for sk, s := range k.subs {
		if activePath(s) {
			snap.bytes[sk] = s.m.BytesAcked + s.m.BytesReceived
			if n := g.e.cfg.GuardOutage; n > 0 && s.probedAt == now && int(s.m.Retransmits) >= n {
				if gc.outage == nil {
					gc.outage = map[subKey]time.Time{}
				}
				gc.outage[sk] = now
			}
		}
	}
	gc.hist = append(gc.hist, snap)
	if g.e.cfg.Log.Enabled(context.Background(), slog.LevelDebug) {
		g.trace(k, now)
	}
	// Keep the newest sample at least guardKeep old and everything after.
	i := 0
	for i+1 < len(gc.hist) && !gc.hist[i+1].at.After(now.Add(-guardKeep)) {
		i++
	}
	gc.hist = append(gc.hist[:0], gc.hist[i:]...)
	if now.Before(gc.retry) {
		return out
	}
	sk, s, top, why := g.harmful(k, gc, snap, now)
	if s == nil {
		return out
	}
	return append(out, g.shed(k, gc, sk, s, top, now, why)...)
}

// judgeWindow is the window a subflow is judged over: Window, at least
// guardRTTs of its base RTT (a long path needs that many round trips to
// show its rate), at most guardKeep.
func (g *guard) judgeWindow(s *ksub) time.Duration {
	return min(max(g.e.cfg.GuardWindow, guardRTTs*s.baseRTT()), guardKeep)
}

// harmful finds the subflow the rule sheds, if any: it has been up for
// twice its judging window; over that window it delivered below Share of
// the connection's bytes and its base RTT is above GuardRTT x that of the
// subflow that delivered the most (which still delivers and, unless
// Starve is 1 or more, starves); the connection is busy.
func (g *guard) harmful(k *kconn, gc *gConn, cur gSample, now time.Time) (subKey, *ksub, *ksub, string) {
	cfg := g.e.cfg
	for sk, s := range k.subs {
		if _, ok := cur.bytes[sk]; !ok || s.baseRTT() == 0 {
			continue
		}
		w := g.judgeWindow(s)
		if now.Sub(s.upSince) < 2*w {
			continue
		}
		if at, ok := gc.outage[sk]; ok && now.Sub(at) < 2*w {
			// In an outage (a black-holed path), or just back from one:
			// its share over the window says nothing about its speed.
			continue
		}
		// The newest sample at least w old.
		var old *gSample
		for i := range gc.hist {
			if now.Sub(gc.hist[i].at) < w {
				break
			}
			old = &gc.hist[i]
		}
		if old == nil {
			continue
		}
		var total, topD float64
		var top subKey
		var topS *ksub
		for osk, b := range cur.bytes {
			a, ok := old.bytes[osk]
			if !ok {
				continue
			}
			d := float64(sub64(b, a))
			total += d
			if os := k.subs[osk]; os != nil && d > topD {
				top, topS, topD = osk, os, d
			}
		}
		a, ok := old.bytes[sk]
		if !ok || topS == nil || top == sk || total/now.Sub(old.at).Seconds() < minTrialRate || topS.baseRTT() == 0 || !g.othersCarry(k, top, now) {
			continue
		}
		share := float64(sub64(cur.bytes[sk], a)) / total
		if share >= cfg.GuardShare || cfg.GuardRTT > 0 && float64(s.baseRTT()) <= cfg.GuardRTT*float64(topS.baseRTT()) {
			continue
		}
		why := fmt.Sprintf("delivered %.0f%% of the connection's bytes over %s (below %.0f%%) with a base RTT of %s vs %s on %s",
			100*share, w.Round(time.Millisecond), 100*cfg.GuardShare, s.baseRTT().Round(time.Millisecond), topS.baseRTT().Round(time.Millisecond), topS.path())
		if cfg.GuardStarve < 1 {
			// A slow subflow that delivers little while the fast one
			// stays limited by its own congestion window does not hold
			// it back: it adds what it carries (docs/results/design/guard2).
			if topS.sendLimited >= cfg.GuardStarve {
				continue
			}
			why += fmt.Sprintf(", which starves (window-limited at %.0f%% of probes, below %.0f%%)", 100*topS.sendLimited, 100*cfg.GuardStarve)
		}
		return sk, s, topS, why
	}
	return subKey{}, nil, nil, ""
}

// othersCarry: the top subflow made progress recently and is not in
// RTO backoff (shedding the other would leave the connection on a path
// that does not deliver).
func (g *guard) othersCarry(k *kconn, top subKey, now time.Time) bool {
	s := k.subs[top]
	return s != nil && activePath(s) && s.m.Retransmits == 0 && now.Sub(s.lastProgress) <= max(2*s.rtt, 500*time.Millisecond)
}

// shed destroys s: the kernel re-sends what it holds on the others. Its
// detour is avoided for this server for Hold; a shed default path rejoins
// after Hold too (tick).
func (g *guard) shed(k *kconn, gc *gConn, sk subKey, s, top *ksub, now time.Time, why string) []Intent {
	p := g.e
	decision := "shed: " + why
	switch {
	case s.d != nil:
		// The latest Hold's end: an earlier one would fill (and clear it)
		// while this detour is still avoided.
		gc.rejoin = now.Add(p.cfg.Hold)
	case s.initial || s.redial:
		if g.shedDefault == nil {
			g.shedDefault = map[uint32]time.Time{}
		}
		g.shedDefault[k.c.Token] = now.Add(p.cfg.Hold)
	}
	if s.d != nil || s.initial || s.redial {
		decision = fmt.Sprintf("shed: %s (rejoins in %s)", why, p.cfg.Hold)
	}
	p.cfg.Log.Info("subflow shed: slower and delivering little", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "why", why,
		"top", top.path(), "top_send_limited", round3(top.sendLimited), "top_recv_busy", round3(top.recvBusy),
		"top_rate_kBps", round3(top.rate/1e3), "top_loss", round3(top.loss), "top_cwnd", top.m.SndCwnd, "top_unacked", top.m.Unacked, "top_notsent", top.m.NotsentBytes,
		"send_limited", round3(s.sendLimited), "rate_kBps", round3(s.rate/1e3), "up", now.Sub(s.upSince).Round(time.Millisecond))
	return p.evict(k, sk, s, now.Add(p.cfg.Hold), decision)
}

// tick reopens the default path the rule shed from a connection once its
// Hold is over, or at once when the connection has no other subflow up
// (none is measured then, so measured would never see it): Engine.redial,
// which opens one fresh subflow at a time and again after ConnectTimeout
// if it does not come up. Once it is up it is judged like any other
// subflow.
func (g *guard) tick(now time.Time) []Intent {
	var out []Intent
	for tok, at := range g.shedDefault {
		k := g.e.conns[tok]
		if k == nil || k.finished != "" {
			delete(g.shedDefault, tok)
			continue
		}
		other, onDefault := false, false
		for _, s := range k.subs {
			if s.up && !s.stale && !s.dead && !s.backup {
				other = true
				onDefault = onDefault || s.d == nil && (s.initial || s.redial)
			}
		}
		if onDefault {
			// Rejoined (judged from here; a shed sets a new Hold), or the
			// shed was undone (the kernel refused the destroy).
			delete(g.shedDefault, tok)
			continue
		}
		if other && now.Before(at) {
			continue
		}
		why := "hold over"
		if !other {
			why = "no other path left"
		}
		in := g.e.redial(k, now)
		if len(in) > 0 {
			g.e.cfg.Log.Info("shed default path rejoins", "token", fmt.Sprintf("%08x", tok), "path", "default", "why", why)
		}
		out = append(out, in...)
	}
	return out
}

// destroyFailed: the kernel refused to destroy a shed subflow (Engine
// evictRefused undid the shed: it counts as active again, its detour is no
// longer avoided for the shed): the rule judges again after one judging
// window (a refusal is not retried at every probe).
func (g *guard) destroyFailed(k *kconn, s *ksub, err error, now time.Time) []Intent {
	g.conn(k).retry = now.Add(g.judgeWindow(s))
	s.decision = fmt.Sprintf("shed refused by the kernel (%s): kept, judged again in %s", errnoName(err), g.judgeWindow(s).Round(time.Millisecond))
	return nil
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// trace logs, at debug level, what the rule reads of each active subflow
// at this probe (for diagnosing its decisions offline).
func (g *guard) trace(k *kconn, now time.Time) {
	for _, s := range k.subs {
		if activePath(s) {
			g.e.cfg.Log.Debug("guard probe", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "up", now.Sub(s.upSince).Round(time.Millisecond),
				"send_limited", round3(s.sendLimited), "recv_busy", round3(s.recvBusy), "rate_kBps", round3(s.rate/1e3), "loss", round3(s.loss),
				"base_rtt", s.baseRTT(), "cwnd", s.m.SndCwnd, "unacked", s.m.Unacked, "notsent", s.m.NotsentBytes, "bytes", s.m.BytesAcked+s.m.BytesReceived)
		}
	}
}
