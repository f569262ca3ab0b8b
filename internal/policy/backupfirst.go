package policy

import (
	"fmt"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// backupFirst never lets a detour subflow carry data before the
// measurements say it helps. Every detour subflow joins
// with the B flag: the kernel's scheduler sends on it only when no active
// subflow can, so a slow or lossy detour costs nothing while it waits.
// A waiting subflow is tried (made active) only when
//
//   - the connection is busy (at least 64 KB/s over the last half window)
//     and every active path is full: limited by its congestion window or
//     pacing for at least half of the last second (sender side: in flight
//     fills cwnd, or bytes wait that it cannot send, and the kernel does
//     not call the sample application limited), or, where this host
//     receives, receiving in at least 80 % of the probe intervals;
//   - an ECF-style arrival estimate says a segment sent on it now arrives
//     no later than one that waits for the active paths: its base RTT is
//     at most the fastest active path's smoothed RTT plus the time the
//     active paths need to drain what they hold (bytes in flight and not
//     yet sent, over their delivery rate);
//   - BLEST's condition holds: what the active paths deliver during one of
//     its RTTs, plus its own fair share, fits the receive buffer (RcvBuf),
//     so that its segments do not block the connection's window.
//
// The trial is guarded, but a destroy needs evidence, because the
// paired design (docs/results/design/paired-bf) showed a one-sample test
// destroying detours that helped (25 of 33 destroys at points where the
// detour raised static above MPTCP over the best path alone), most
// followed by seconds without delivered data:
//
//   - The stall check runs from 3 RTTs after the start (of the slowest
//     path involved, at least 300 ms) in windows of one such RTT (at
//     least 150 ms); the trial ends early only when the connection delivers
//     below half of its rate before (measured over Window) in
//     bfStallWindows consecutive windows. A window in which an active
//     path retransmitted (loss recovery) or grew its congestion window by
//     half (slow start) does not count: its dip is the active path's own.
//   - At the end (max(Window/2, 8 of its base RTTs)) the subflow is kept
//     active if the connection delivers at least 5 % more, else demoted
//     to backup (a harmful one and one that adds nothing alike).
//   - A failing trial demotes; it does not destroy: MP_PRIO stops new data
//     at once, the queue drains, and the drained subflow waits as backup
//     (free while the default path works). Only a demoted subflow whose
//     queue has not drained (data in flight) within max(4 RTTs, 500 ms)
//     is destroyed, so that no data stays stranded on it (MP_PRIO does
//     not re-send what is queued; SUBFLOW_DESTROY does).
//   - Every failed trial doubles the wait before the path is tried again:
//     max(Window, 8 base RTTs), doubled per failed trial on this
//     connection, at most Hold. A destroyed detour rejoins as backup
//     after the same back-off.
//   - Nothing is demoted while it is the only path carrying data: when no
//     other active path delivered within max(2 RTTs, 500 ms) or one is in
//     RTO backoff, the trial goes on.
//
// The default path is never set aside by this strategy; the engine's
// watchdog fails over dead paths (backups are promoted when no active
// path is left).
type backupFirst struct{ e *Engine }

type bfConn struct {
	trial *bfTrial
	next  time.Time // no new trial before
	paths map[subKey]*bfPath
	// failed counts the failed trials per detour (Key) on this
	// connection: each doubles the back-off.
	failed map[string]int
	// rejoin: a destroyed detour may join again (as backup) from here.
	rejoin time.Time
}

type bfPhase int

const (
	bfWaiting  bfPhase = iota // backup, waiting for evidence
	bfKept                    // proven useful, active
	bfDraining                // demoted, its queue not drained yet
)

type bfPath struct {
	phase bfPhase
	until time.Time     // waiting: not tried before; draining: destroyed after
	retry time.Duration // draining: the back-off once drained (or destroyed)
}

type bfTrial struct {
	sk     subKey
	start  time.Time
	guard  time.Duration // the stall check runs from start+guard
	end    time.Time
	before float64 // connection rate (bytes/s) before the trial
	why    string
	// The stall check's evidence: windows of win from winAt; bad counts
	// consecutive windows below bfStall x before; retrans and cwnd are
	// the active paths' counters at the window's start.
	win     time.Duration
	winAt   time.Time
	bad     int
	retrans map[subKey]uint32
	cwnd    map[subKey]uint32
}

const (
	// bfGain: a trial keeps the subflow when the connection delivers this
	// much more with it; bfHarm: below this share of before it is harm.
	bfGain = 1.05
	bfHarm = 0.9
	// bfStall: a trial whose connection delivers below this share of
	// before in bfStallWindows consecutive clean windows ends early.
	bfStall        = 0.5
	bfStallWindows = 3
)

func (b *backupFirst) conn(k *kconn) *bfConn {
	return connState(k, func() *bfConn { return &bfConn{paths: map[subKey]*bfPath{}, failed: map[string]int{}} })
}

func (*backupFirst) name() string { return BackupFirst.String() }

// prefer tries detours this connection has not used before ones it has
// (one that was destroyed for harm is avoided anyway).
func (*backupFirst) prefer(k *kconn, x, y detour.Detour) bool {
	return !k.tried[Key(x)] && k.tried[Key(y)]
}

func (*backupFirst) joinAsBackup(*kconn, detour.Detour) bool { return true }

func (b *backupFirst) gone(k *kconn, sk subKey) {
	bc, _ := k.st.(*bfConn)
	if bc == nil {
		return
	}
	delete(bc.paths, sk)
	if bc.trial != nil && bc.trial.sk == sk {
		bc.trial = nil
	}
}

func (b *backupFirst) measured(k *kconn, now time.Time) []Intent {
	out := b.e.watchdog(k, now)
	if !k.selected {
		return out
	}
	bc := b.conn(k)
	out = append(out, b.drain(k, bc, now)...)
	out = append(out, b.reopen(k, bc, now)...)
	if bc.trial != nil {
		return append(out, b.judge(k, bc, now)...)
	}
	if now.Before(bc.next) {
		return out
	}
	return append(out, b.try(k, bc, now)...)
}

// eligible: a detour subflow of ours that waits as backup and may be tried.
func (b *backupFirst) eligible(k *kconn, bc *bfConn, sk subKey, s *ksub, now time.Time) bool {
	if s.d == nil || s.configuredBackup() || !s.up || s.stale || s.dead || s.promoted || !s.backup || !s.seen || s.baseRTT() == 0 {
		return false
	}
	bp := bc.paths[sk]
	return bp == nil || bp.phase == bfWaiting && !now.Before(bp.until)
}

// active reports whether s carries data as a primary path.
func activePath(s *ksub) bool {
	return s.up && !s.stale && !s.dead && !s.backup && !s.promoted && !s.configuredBackup() && s.seen
}

// try starts a trial of the waiting backup subflow the evidence favours.
func (b *backupFirst) try(k *kconn, bc *bfConn, now time.Time) []Intent {
	p := b.e
	w := p.cfg.Window
	bc.next = now.Add(w / 4)
	before, ok := k.rate(now.Add(-w), now)
	if !ok || before < minTrialRate || len(k.hist) == 0 || now.Sub(k.hist[0].at) < w/2 {
		return nil
	}
	var rf, held float64 // the active paths' rate (bytes/s) and the bytes they hold
	var srttF, baseF time.Duration
	n := 0
	for _, s := range k.subs {
		if !activePath(s) {
			continue
		}
		n++
		if s.sendLimited < 0.5 && s.recvBusy < 0.8 {
			return b.wait(k, fmt.Sprintf("an active path (%s) is not full", s.path()))
		}
		rf += s.rate
		held += float64(s.m.Unacked)*float64(s.m.SndMSS) + float64(s.m.NotsentBytes)
		if s.rtt > 0 && (srttF == 0 || s.rtt < srttF) {
			srttF = s.rtt
		}
		if r := s.baseRTT(); r > 0 && (baseF == 0 || r < baseF) {
			baseF = r
		}
	}
	if n == 0 || rf <= 0 || srttF == 0 {
		return nil
	}
	// The fastest candidate first.
	var best subKey
	var bs *ksub
	for sk, s := range k.subs {
		if b.eligible(k, bc, sk, s, now) && (bs == nil || s.baseRTT() < bs.baseRTT()) {
			best, bs = sk, s
		}
	}
	if bs == nil {
		return nil
	}
	rs := bs.baseRTT()
	// ECF: a segment sent on it now arrives after about its RTT; one that
	// waits for the active paths, after their RTT plus the time they need
	// to drain what they hold.
	ts := rs
	tf := srttF + time.Duration(held/rf*float64(time.Second))
	if ts > tf {
		return b.wait(k, fmt.Sprintf("%s: arrival estimate %s vs %s through the active paths", bs.path(), ts.Round(time.Millisecond), tf.Round(time.Millisecond)))
	}
	// BLEST: the reordering it causes fits the receive buffer.
	if need := (rf + rf/float64(n)) * rs.Seconds(); need > float64(p.cfg.RcvBuf) {
		return b.wait(k, fmt.Sprintf("%s: %.1f MB would wait out of order per RTT, receive buffer %.1f MB", bs.path(), need/1e6, float64(p.cfg.RcvBuf)/1e6))
	}
	slow := max(rs, baseF)
	t := &bfTrial{sk: best, start: now, guard: max(3*slow, 300*time.Millisecond), end: now.Add(max(w/2, 8*rs)), before: before,
		win: max(slow, 150*time.Millisecond),
		why: fmt.Sprintf("active paths full, arrival estimate %s vs %s", ts.Round(time.Millisecond), tf.Round(time.Millisecond))}
	bc.trial = t
	in := p.setBackup(k, best, bs, false)
	bs.role, bs.decision = RoleProbing, "trial: "+t.why
	p.cfg.Log.Debug("backup subflow on trial", "token", fmt.Sprintf("%08x", k.c.Token), "path", bs.path(), "why", t.why)
	return []Intent{in}
}

// wait records why the backups keep waiting (status) and starts nothing.
func (b *backupFirst) wait(k *kconn, why string) []Intent {
	for _, s := range k.subs {
		if s.d != nil && s.backup && s.up && !s.stale && !s.promoted && !s.configuredBackup() && s.role == RoleBackup {
			s.decision = "backup: waiting for evidence that it helps (" + why + ")"
		}
	}
	return nil
}

// judge guards and ends a running trial.
func (b *backupFirst) judge(k *kconn, bc *bfConn, now time.Time) []Intent {
	p := b.e
	t := bc.trial
	s := k.subs[t.sk]
	if s == nil || !s.up || s.stale || s.dead || s.promoted {
		bc.trial = nil
		return nil
	}
	mbit := func(r float64) string { return fmt.Sprintf("%.2f Mbit/s", r*8/1e6) }
	if now.Sub(t.start) < t.guard {
		return nil
	}
	if t.winAt.IsZero() {
		b.window(k, t, now)
		return nil
	}
	if now.Sub(t.winAt) >= t.win {
		r, ok := k.rate(t.winAt, now)
		switch excuse := b.excused(k, t); {
		case excuse != "":
			// Neither evidence of harm nor of its absence.
			s.decision = "trial: a window not counted (" + excuse + ")"
		case ok && r < bfStall*t.before:
			t.bad++
		default:
			t.bad = 0
		}
		b.window(k, t, now)
		if t.bad >= bfStallWindows {
			return b.fail(k, bc, t.sk, s, now, true, fmt.Sprintf("the connection stalled: below %s in %d windows of %s in a row vs %s before",
				mbit(bfStall*t.before), t.bad, t.win.Round(time.Millisecond), mbit(t.before)))
		}
	}
	if now.Before(t.end) {
		return nil
	}
	since, _ := k.rate(t.start, now)
	after, ok := k.rate(t.start.Add(t.guard/3), now)
	if !ok {
		after = since
	}
	verdict := fmt.Sprintf("%s with it vs %s before", mbit(after), mbit(t.before))
	if after >= bfGain*t.before {
		bc.trial = nil
		bc.next = now.Add(p.cfg.Window / 2)
		bc.paths[t.sk] = &bfPath{phase: bfKept}
		s.role, s.decision = RoleActive, "kept: "+verdict
		k.decision = s.path() + ": " + s.decision
		p.cfg.Log.Info("backup subflow made active", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "verdict", verdict)
		return nil
	}
	return b.fail(k, bc, t.sk, s, now, after < bfHarm*t.before, verdict)
}

// window starts a stall-check window: the active paths' retransmission
// counters and congestion windows now.
func (b *backupFirst) window(k *kconn, t *bfTrial, now time.Time) {
	t.winAt = now
	t.retrans, t.cwnd = map[subKey]uint32{}, map[subKey]uint32{}
	for sk, s := range k.subs {
		if sk != t.sk && activePath(s) {
			t.retrans[sk], t.cwnd[sk] = s.m.TotalRetrans, s.m.SndCwnd
		}
	}
}

// excused says why the window that ends now tells nothing about the
// subflow on trial: an active path was in loss recovery or slow start
// (its own dip, which static has as well), or "" if nothing.
func (b *backupFirst) excused(k *kconn, t *bfTrial) string {
	for sk, r0 := range t.retrans {
		s := k.subs[sk]
		if s == nil || !activePath(s) {
			continue
		}
		if s.m.TotalRetrans != r0 || s.m.Retransmits > 0 {
			return s.path() + " in loss recovery"
		}
		if c0 := t.cwnd[sk]; c0 > 0 && s.m.SndCwnd >= c0+c0/2 {
			return s.path() + " in slow start"
		}
	}
	return ""
}

// othersCarry reports whether an active path besides sk delivers: it
// made progress within max(2 RTTs, 500 ms), is not in RTO backoff and is
// not a dead path being retried.
// Demoting the only path that carries data would stall the connection.
func (b *backupFirst) othersCarry(k *kconn, sk subKey, now time.Time) bool {
	for osk, s := range k.subs {
		if osk == sk || !activePath(s) || s.retrying || s.m.Retransmits > 0 {
			continue // a dead path being retried does not deliver yet
		}
		if now.Sub(s.lastProgress) <= max(2*s.rtt, 500*time.Millisecond) {
			return true
		}
	}
	return false
}

// backoff is how long a detour waits after its failed-th failed trial on
// this connection: max(Window, 8 base RTTs), doubled per failure, at
// most Hold.
func (b *backupFirst) backoff(s *ksub, failed int) time.Duration {
	d := max(b.e.cfg.Window, 8*s.baseRTT())
	for range max(failed-1, 0) {
		if d >= b.e.cfg.Hold {
			break
		}
		d *= 2
	}
	return min(d, b.e.cfg.Hold)
}

// fail ends a trial that did not gain: the subflow goes back to backup
// (MP_PRIO: no new data on it) and, once its queue drained, waits out a
// back-off that doubles per failed trial. It stays active while it is
// the only path carrying data (the trial goes on for another window).
func (b *backupFirst) fail(k *kconn, bc *bfConn, sk subKey, s *ksub, now time.Time, harmed bool, verdict string) []Intent {
	p := b.e
	t := bc.trial
	if !b.othersCarry(k, sk, now) {
		t.end, t.bad = now.Add(t.win), 0
		s.decision = "trial: kept active, no other path delivers (" + verdict + ")"
		return nil
	}
	bc.trial = nil
	bc.next = now.Add(p.cfg.Window / 2)
	dk := Key(*s.d)
	bc.failed[dk]++
	back := b.backoff(s, bc.failed[dk])
	bc.paths[sk] = &bfPath{phase: bfDraining, until: now.Add(max(4*s.baseRTT(), 500*time.Millisecond)), retry: back}
	in := p.setBackup(k, sk, s, true)
	what := "no gain"
	if harmed {
		what = "harmed"
		p.cfg.Log.Info("backup subflow harmed; back to backup", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "why", verdict, "retry_in", back)
	}
	s.decision = fmt.Sprintf("backup: %s, %s (tried again in %s)", what, verdict, back)
	s.keepUntil = now.Add(back)
	k.decision = s.path() + ": " + s.decision
	return []Intent{in}
}

// drain finishes demotions: a demoted subflow with nothing in flight
// waits again (for its back-off); one whose queue does not drain in time
// is destroyed, which re-sends its data on the others.
func (b *backupFirst) drain(k *kconn, bc *bfConn, now time.Time) []Intent {
	var out []Intent
	for sk, bp := range bc.paths {
		if bp.phase != bfDraining {
			continue
		}
		s := k.subs[sk]
		if s == nil || !s.up || s.stale {
			delete(bc.paths, sk)
			continue
		}
		switch {
		case s.probedAt == now && s.m.Unacked == 0:
			bp.phase, bp.until = bfWaiting, now.Add(bp.retry)
		case now.After(bp.until):
			out = append(out, b.destroy(k, bc, sk, s, now, bp.retry, "demoted, but its queue did not drain")...)
		}
	}
	return out
}

// destroy closes a detour subflow (the kernel re-sends its queue on the
// others at once) and avoids its detour for this server for retry; then
// it rejoins as backup (reopen), or another detour replaces it.
func (b *backupFirst) destroy(k *kconn, bc *bfConn, sk subKey, s *ksub, now time.Time, retry time.Duration, why string) []Intent {
	delete(bc.paths, sk)
	if bc.rejoin.IsZero() || now.Add(retry).Before(bc.rejoin) {
		bc.rejoin = now.Add(retry)
	}
	return b.e.evict(k, sk, s, now.Add(retry), fmt.Sprintf("evicted: %s (rejoins as backup in %s)", why, retry))
}

// reopen lets a destroyed detour join again, as backup, once its
// back-off passed (the engine's fill skips it while it is avoided).
func (b *backupFirst) reopen(k *kconn, bc *bfConn, now time.Time) []Intent {
	return b.e.rejoin(k, &bc.rejoin, now)
}

// rejoin fills k once *at (when a detour a strategy destroyed stops being
// avoided) has passed, and clears *at when that filled or no destroyed
// detour subflow is left waiting for its SUB_CLOSED. The engine wakes a
// connection for backed-off detours and polls the sources only for a
// while, never for an avoided detour: a strategy that promises one back
// calls this from measured.
func (p *Engine) rejoin(k *kconn, at *time.Time, now time.Time) []Intent {
	if at.IsZero() || now.Before(*at) {
		return nil
	}
	out := p.fill(k)
	gone := true
	for _, s := range k.subs {
		if s.d != nil && s.stale {
			gone = false // its SUB_CLOSED has not arrived: fill cannot reuse the detour yet
		}
	}
	if len(out) > 0 || gone {
		*at = time.Time{}
	}
	return out
}
