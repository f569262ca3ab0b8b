package policy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
)

// The shared-bottleneck rule of the static policy (Config.SharedBottleneck;
// docs/agent.md, "Shared-bottleneck detection"). Measured (issue 26 item 3,
// docs/results/tunnel-shared/backup-first): a tunnel detour that crosses
// the client's access link with the default path adds no capacity, only
// a second flow into the same queue, and the connection ends below the
// better path alone. The rule: every probe records each active subflow's
// queueing delay (smoothed RTT minus the kernel's minimum RTT); once two
// subflows have a window of samples in common, SharedTest judges the
// pair. Shared: the one with the lower delivery rate stops carrying data
// for Hold, then both are judged again:
//   - a detour subflow is destroyed (SUBFLOW_DESTROY: the kernel re-sends
//     its queue on the other subflow at once, nothing stays stranded), its
//     detour avoided for this server for Hold, then it joins again;
//   - the default path's (or an announced) subflow is set backup (MP_PRIO:
//     the agent does not reopen the default path once destroyed); what it
//     holds already it still delivers itself. After Hold it is set active.
//
// The verdict must hold at every probe for half a window before the rule
// acts (over 2 s, two disjoint sawtooth queues line up by chance; tested
// in shared_rule_test.go). Samples are taken only while a subflow
// delivers (data acked or received within max(RTT, 200 ms): a long
// path's acks come in bursts, not at every probe), and only after it has
// delivered for max(1s, 4 base RTTs) (slow start on two disjoint paths
// fills both queues at the same time, which is not a shared queue).
// Only where this host sends: a subflow that only receives keeps the RTT
// of its handshake in the kernel (its smoothed RTT is updated only when
// its own data is acked), so it gives no samples and downloads are never
// judged.

// Defaults and bounds of SharedWindow (docs/agent.md); MinSharedProbes is
// the fewest probes a window must hold: a verdict needs MinSharedSamples
// aligned ones, and a late probe, or one at which either subflow made no
// progress, gives none (with exactly 10 the pair was never judged).
const (
	DefaultSharedWindow = 3 * time.Second
	MinSharedWindow     = 2 * time.Second
	MaxSharedWindow     = 10 * time.Second
	MinSharedProbes     = MinSharedSamples * 3 / 2
	sharedRamp          = time.Second
)

type sbdConn struct {
	hist []sbdProbe
	// busy: when each subflow started delivering (its ramp is skipped).
	busy map[subKey]time.Time
	// retest: when the subflow taken out comes back (zero: none is out);
	// benched is the default-path subflow set backup (zero: a detour was
	// destroyed instead, it rejoins through fill).
	retest  time.Time
	benched *subKey
	// kept, keptSub: the subflow kept carrying data while the default
	// path is benched; if it goes (closed, stalled and replaced, set
	// backup) the default path comes back at once.
	kept    subKey
	keptSub *ksub
	// since: when the pair's verdict turned "shared" (it must hold for
	// half a window, probe after probe, before anything is done: two
	// disjoint queues can fill in step for a window by chance).
	since map[[2]subKey]time.Time
	// logged: when the verdicts were last logged (debug, once a second).
	logged time.Time
}

type sbdProbe struct {
	at time.Time
	q  map[subKey]time.Duration
}

func (k *kconn) sbdState() *sbdConn {
	if k.sbd == nil {
		k.sbd = &sbdConn{busy: map[subKey]time.Time{}, since: map[[2]subKey]time.Time{}}
	}
	return k.sbd
}

// sharedMeasured is the rule's step for k at a probe (static.measured).
func (p *Engine) sharedMeasured(k *kconn, now time.Time) []Intent {
	if !p.cfg.SharedBottleneck || p.cfg.Mode != Static || !k.selected {
		return nil // static's rule only (guard embeds static, and has its own)
	}
	sc := k.sbdState()
	if !sc.retest.IsZero() {
		if sc.benched != nil {
			if ks := k.subs[sc.kept]; ks == nil || ks != sc.keptSub || !activePath(ks) {
				// The partner is gone: a backup default path would carry
				// nothing beside a new detour in slow start (or none).
				return p.sharedRetest(k, sc, now, "active again: "+sc.keptSub.path()+", kept instead, no longer carries data")
			}
		}
		if now.Before(sc.retest) {
			return nil
		}
		return p.sharedRetest(k, sc, now, "active again: shared-bottleneck retest")
	}
	w := p.cfg.SharedWindow
	probe := sbdProbe{at: now, q: map[subKey]time.Duration{}}
	for sk := range sc.busy {
		if k.subs[sk] == nil {
			delete(sc.busy, sk) // closed: a later subflow on its addresses ramps afresh
		}
	}
	var receiving []string
	for sk, s := range k.subs {
		// Delivering: acked or received data within its RTT (a long path's
		// acks come in bursts, not at every probe).
		recent := max(s.rtt, 200*time.Millisecond)
		if !activePath(s) || s.sampledAt != now || now.Sub(s.lastProgress) > recent {
			delete(sc.busy, sk) // idle or gone: its ramp starts again
			continue
		}
		if now.Sub(s.lastAcked) > recent {
			// It only receives: the kernel updates a subflow's smoothed
			// RTT only when data it sent is acked (tcp_ack_update_rtt),
			// so its RTT stays what its handshake measured and says
			// nothing of a queue. Not judged (downloads are not).
			delete(sc.busy, sk)
			receiving = append(receiving, s.path())
			continue
		}
		if _, ok := sc.busy[sk]; !ok {
			sc.busy[sk] = now
		}
		if now.Sub(sc.busy[sk]) < max(sharedRamp, 4*s.baseRTT()) || s.rtt <= 0 || s.minRTT <= 0 {
			continue
		}
		probe.q[sk] = s.rtt - s.minRTT
	}
	sc.hist = append(sc.hist, probe)
	i := 0
	for i < len(sc.hist) && now.Sub(sc.hist[i].at) > w {
		i++
	}
	sc.hist = append(sc.hist[:0], sc.hist[i:]...)
	keys := slices.SortedFunc(maps.Keys(probe.q), func(a, b subKey) int {
		if c := a.local.Compare(b.local); c != 0 {
			return c
		}
		return a.remote.Compare(b.remote)
	})
	// Debug: every pair's verdict (and the subflows not sampled), at
	// most once a second per connection.
	logNow := now.Sub(sc.logged) >= time.Second && p.cfg.Log.Enabled(context.Background(), slog.LevelDebug)
	if logNow {
		sc.logged = now
	}
	if len(receiving) > 0 && logNow {
		slices.Sort(receiving)
		p.cfg.Log.Debug("shared-bottleneck test", "token", fmt.Sprintf("%08x", k.c.Token),
			"paths", strings.Join(receiving, ","), "verdict", "receiving: no RTT samples (the kernel updates a subflow's RTT only when its own data is acked)")
	}
	sharedNow := map[[2]subKey]bool{}
	for i, a := range keys {
		for _, b := range keys[i+1:] {
			out, shared := p.sharedJudge(k, sc, a, b, now, logNow)
			if out != nil {
				return out
			}
			sharedNow[[2]subKey{a, b}] = shared
		}
	}
	// A verdict holds only probe after probe: a pair not judged shared at
	// this probe (not shared, or not judged at all: one of them idle, too
	// few common samples, too idle to matter) starts its half window again.
	for pair := range sc.since {
		if !sharedNow[pair] {
			delete(sc.since, pair)
		}
	}
	return nil
}

// sharedJudge tests the pair a, b over the window and, when they share a
// bottleneck, takes the slower one out. shared: the pair was judged shared
// at this probe (its half window runs on).
func (p *Engine) sharedJudge(k *kconn, sc *sbdConn, a, b subKey, now time.Time, logNow bool) (out []Intent, shared bool) {
	var qa, qb []time.Duration
	var first time.Time
	for _, h := range sc.hist {
		x, okA := h.q[a]
		y, okB := h.q[b]
		if okA && okB {
			if first.IsZero() {
				first = h.at
			}
			qa, qb = append(qa, x), append(qb, y)
		}
	}
	// The common samples must span most of the window.
	if first.IsZero() || now.Sub(first) < p.cfg.SharedWindow*3/4 {
		if logNow {
			span := time.Duration(0)
			if !first.IsZero() {
				span = now.Sub(first)
			}
			p.cfg.Log.Debug("shared-bottleneck test", "token", fmt.Sprintf("%08x", k.c.Token),
				"a", k.subs[a].path(), "b", k.subs[b].path(), "shared", false,
				"verdict", fmt.Sprintf("%d common samples over %s, need them to span 3/4 of the %s window", len(qa), span.Round(time.Millisecond), p.cfg.SharedWindow))
		}
		return nil, false
	}
	v := SharedTest{}.Judge(qa, qb)
	if logNow {
		p.cfg.Log.Debug("shared-bottleneck test", "token", fmt.Sprintf("%08x", k.c.Token),
			"a", k.subs[a].path(), "b", k.subs[b].path(), "shared", v.Shared, "verdict", v.Verdict)
	}
	sa, sb := k.subs[a], k.subs[b]
	if !v.Shared || sa.rate+sb.rate < minTrialRate {
		return nil, false // not shared, or too idle to matter
	}
	pair := [2]subKey{a, b}
	if _, ok := sc.since[pair]; !ok {
		sc.since[pair] = now
	}
	if now.Sub(sc.since[pair]) < p.cfg.SharedWindow/2 {
		return nil, true
	}
	kept, keptKey, outKey, gone := sa, a, b, sb
	if sb.rate > sa.rate {
		kept, keptKey, outKey, gone = sb, b, a, sa
	}
	why := fmt.Sprintf("shares a bottleneck with %s (%s) and delivers less (%.2f vs %.2f Mbit/s)",
		kept.path(), v.Verdict, gone.rate*8/1e6, kept.rate*8/1e6)
	sc.hist, sc.retest = nil, now.Add(p.cfg.Hold)
	clear(sc.busy)
	clear(sc.since)
	p.cfg.Log.Info("shared bottleneck: subflow taken out of scheduling", "token", fmt.Sprintf("%08x", k.c.Token),
		"path", gone.path(), "kept", kept.path(), "why", why, "for", p.cfg.Hold)
	if gone.d == nil {
		// The default path (or an announced address): backup, not
		// destroyed (the agent does not reopen the default path).
		gone.decision = fmt.Sprintf("backup: %s (active again in %s)", why, p.cfg.Hold)
		k.decision = gone.path() + ": " + gone.decision
		sc.benched, sc.kept, sc.keptSub = &outKey, keptKey, kept
		return []Intent{p.setBackup(k, outKey, gone, true)}, true
	}
	sc.benched = nil
	return p.evict(k, outKey, gone, sc.retest, fmt.Sprintf("destroyed: %s (rejoins in %s)", why, p.cfg.Hold)), true
}

// sharedRefused forgets the rule's action on k when the kernel refused it
// (a destroy, or the bench: nothing was taken out): the rule judges
// again, from a fresh window (the history went with the action), instead
// of waiting for Hold with nothing out. It reports whether anything was
// pending.
func (p *Engine) sharedRefused(k *kconn) bool {
	sc := k.sbd
	if sc == nil || sc.retest.IsZero() {
		return false
	}
	sc.retest, sc.benched, sc.keptSub = time.Time{}, nil, nil
	return true
}

// sharedFlagsRefused: a SET_FLAGS of the rule failed. A refused bench left
// the subflow active: judged again (sharedRefused). A refused unbench
// leaves it backup in the kernel; the rule has nothing left to undo.
func (p *Engine) sharedFlagsRefused(k *kconn, sk subKey, in Intent) {
	if sc := k.sbd; sc != nil && in.Backup && sc.benched != nil && *sc.benched == sk {
		p.sharedRefused(k)
	}
}

// sharedRetest brings back what the rule took out: the benched default
// path is set active (decision why), a destroyed detour joins again (once
// its close has been seen and fill can open it).
func (p *Engine) sharedRetest(k *kconn, sc *sbdConn, now time.Time, why string) []Intent {
	if sk := sc.benched; sk != nil {
		sc.retest, sc.benched, sc.keptSub = time.Time{}, nil, nil
		s := k.subs[*sk]
		if s == nil || s.stale || !s.up || !s.backup {
			return nil // gone meanwhile, or someone else changed it
		}
		s.decision = why
		return []Intent{p.setBackup(k, *sk, s, false)}
	}
	return p.rejoin(k, &sc.retest, now)
}
