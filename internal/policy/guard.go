package policy

import (
	"fmt"
	"net/netip"
	"strings"
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
// than guardRTT times that of the subflow delivering the most is
// destroyed (SUBFLOW_DESTROY: the kernel re-sends its queue on the
// others at once, so nothing stays stranded). Only when the connection is
// busy (at least 64 KB/s) and another subflow delivers. A shed detour is
// avoided for this server for Hold, then joins again (active) and is
// judged again; the default path's subflow is shed the same way, but the
// agent does not reopen it (the connection goes on through its detours;
// the watchdog of static replaces those that stall).
type guard struct {
	e  *Engine
	st static
}

const (
	// guardRTT: a subflow is "slower" than the main carrier when its base
	// RTT exceeds the carrier's by this factor.
	guardRTT = 1.25
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
)

// gConn keeps each subflow's delivered bytes per probe over the last
// Window (and a little more).
type gConn struct {
	hist []gSample
	// rejoin: when the detour shed last stops being avoided (Hold).
	rejoin time.Time
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
	if !gc.rejoin.IsZero() && !now.Before(gc.rejoin) {
		out = append(out, g.e.rejoin(k, &gc.rejoin, now)...)
		if gc.rejoin.IsZero() {
			// Another connection to the server may have shed a detour
			// since (the avoid is the server's): wait for that Hold too.
			gc.rejoin = g.e.avoidedUntil(k.c.Remote, now)
		}
	}
	snap := gSample{at: now, bytes: map[subKey]uint64{}}
	for sk, s := range k.subs {
		if activePath(s) {
			snap.bytes[sk] = s.m.BytesAcked + s.m.BytesReceived
		}
	}
	gc.hist = append(gc.hist, snap)
	// Keep the newest sample at least guardKeep old and everything after.
	i := 0
	for i+1 < len(gc.hist) && !gc.hist[i+1].at.After(now.Add(-guardKeep)) {
		i++
	}
	gc.hist = append(gc.hist[:0], gc.hist[i:]...)
	sk, s, why := g.harmful(k, gc, snap, now)
	if s == nil {
		return out
	}
	return append(out, g.shed(k, gc, sk, s, now, why)...)
}

// judgeWindow is the window a subflow is judged over: Window, at least
// guardRTTs of its base RTT (a long path needs that many round trips to
// show its rate), at most guardKeep.
func (g *guard) judgeWindow(s *ksub) time.Duration {
	return min(max(g.e.cfg.GuardWindow, guardRTTs*s.baseRTT()), guardKeep)
}

// harmful finds the subflow the rule sheds, if any: it has been up for
// twice its judging window; over that window it delivered below Share of
// the connection's bytes and its base RTT is above guardRTT x that of the
// subflow that delivered the most (which still delivers); the connection
// is busy.
func (g *guard) harmful(k *kconn, gc *gConn, cur gSample, now time.Time) (subKey, *ksub, string) {
	cfg := g.e.cfg
	for sk, s := range k.subs {
		if _, ok := cur.bytes[sk]; !ok || s.baseRTT() == 0 {
			continue
		}
		w := g.judgeWindow(s)
		if now.Sub(s.upSince) < 2*w {
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
		if share < cfg.GuardShare && float64(s.baseRTT()) > guardRTT*float64(topS.baseRTT()) {
			return sk, s, fmt.Sprintf("delivered %.0f%% of the connection's bytes over %s (below %.0f%%) with a base RTT of %s vs %s on %s",
				100*share, w.Round(time.Millisecond), 100*cfg.GuardShare, s.baseRTT().Round(time.Millisecond), topS.baseRTT().Round(time.Millisecond), topS.path())
		}
	}
	return subKey{}, nil, ""
}

// othersCarry: the top subflow made progress recently and is not in
// RTO backoff (shedding the other would leave the connection on a path
// that does not deliver).
func (g *guard) othersCarry(k *kconn, top subKey, now time.Time) bool {
	s := k.subs[top]
	return s != nil && activePath(s) && s.m.Retransmits == 0 && now.Sub(s.lastProgress) <= max(2*s.rtt, 500*time.Millisecond)
}

// shed destroys s: the kernel re-sends what it holds on the others. Its
// detour is avoided for this server for Hold; the default path is not
// reopened.
func (g *guard) shed(k *kconn, gc *gConn, sk subKey, s *ksub, now time.Time, why string) []Intent {
	p := g.e
	s.stale, s.role = true, RoleEvicted
	if s.d != nil {
		p.avoid[avoidKey(k.c.Remote, Key(*s.d))] = now.Add(p.cfg.Hold)
		// The latest Hold's end: an earlier one would fill (and clear it)
		// while this detour is still avoided.
		gc.rejoin = now.Add(p.cfg.Hold)
		s.decision = fmt.Sprintf("shed: %s (rejoins in %s)", why, p.cfg.Hold)
	} else {
		s.decision = "shed: " + why
	}
	k.decision = s.path() + ": " + s.decision
	p.cfg.Log.Info("subflow shed: slower and delivering little", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "why", why)
	out := []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
		Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Detour: s.d}}
	return append(out, p.fill(k)...)
}

// avoidedUntil is when the first detour still avoided for server stops
// being avoided (zero if none is).
func (p *Engine) avoidedUntil(server netip.AddrPort, now time.Time) time.Time {
	var first time.Time
	prefix := avoidKey(server, "")
	for ak, until := range p.avoid {
		if strings.HasPrefix(ak, prefix) && until.After(now) && (first.IsZero() || until.Before(first)) {
			first = until
		}
	}
	return first
}
