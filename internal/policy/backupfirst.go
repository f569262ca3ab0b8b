package policy

import (
	"fmt"
	"net/netip"
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
// The trial is short and guarded: from 3 RTTs after it starts (of the
// slowest path involved, at least 300 ms), every probe compares the
// connection's delivery since the start with its rate before; below half,
// the subflow is destroyed at once (SUBFLOW_DESTROY re-sends its queue on
// the others) and its detour avoided for the server for Hold. At the end
// (max(Window/2, 8 of its base RTTs)) it is kept active if the connection
// delivers at least 5 % more, destroyed if it delivers less than 90 %, and
// otherwise demoted to backup; a demoted subflow whose queue has not
// drained (data in flight) within max(4 RTTs, 500 ms) is destroyed, so
// that no data stays stranded on it (MP_PRIO does not re-send what is
// queued). The default path is never set aside by this strategy; the
// engine's watchdog fails over dead paths (backups are promoted when no
// active path is left).
type backupFirst struct{ e *Engine }

type bfConn struct {
	trial *bfTrial
	next  time.Time // no new trial before
	paths map[subKey]*bfPath
}

type bfPhase int

const (
	bfWaiting  bfPhase = iota // backup, waiting for evidence
	bfKept                    // proven useful, active
	bfDraining                // demoted, its queue not drained yet
)

type bfPath struct {
	phase bfPhase
	until time.Time // waiting: not tried before; draining: destroyed after
}

type bfTrial struct {
	sk     subKey
	start  time.Time
	guard  time.Duration // the stall check runs from start+guard
	end    time.Time
	before float64 // connection rate (bytes/s) before the trial
	why    string
}

const (
	// bfGain: a trial keeps the subflow when the connection delivers this
	// much more with it; bfHarm: below this share of before it is harm.
	bfGain = 1.05
	bfHarm = 0.9
	// bfStall: a trial whose connection delivers below this share of
	// before (from the guard time on) ends at once.
	bfStall = 0.5
)

func (b *backupFirst) conn(k *kconn) *bfConn {
	bc, _ := k.st.(*bfConn)
	if bc == nil {
		bc = &bfConn{paths: map[subKey]*bfPath{}}
		k.st = bc
	}
	return bc
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
	before, ok := k.rate(now.Add(-w/2), now)
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
	since, ok := k.rate(t.start, now)
	if !ok {
		return nil
	}
	if since < bfStall*t.before {
		return b.harm(k, bc, t.sk, s, now, fmt.Sprintf("the connection stalled: %s since the trial began vs %s before", mbit(since), mbit(t.before)))
	}
	if now.Before(t.end) {
		return nil
	}
	bc.trial = nil
	bc.next = now.Add(p.cfg.Window / 2)
	after, ok := k.rate(t.start.Add(t.guard/3), now)
	if !ok {
		after = since
	}
	verdict := fmt.Sprintf("%s with it vs %s before", mbit(after), mbit(t.before))
	switch {
	case after >= bfGain*t.before:
		bc.paths[t.sk] = &bfPath{phase: bfKept}
		s.role, s.decision = RoleActive, "kept: "+verdict
		k.decision = s.path() + ": " + s.decision
		p.cfg.Log.Info("backup subflow made active", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "verdict", verdict)
		return nil
	case after < bfHarm*t.before:
		return b.harm(k, bc, t.sk, s, now, verdict)
	}
	// No gain and no clear harm: back to backup once its queue drained.
	bc.paths[t.sk] = &bfPath{phase: bfDraining, until: now.Add(max(4*s.baseRTT(), 500*time.Millisecond))}
	in := p.setBackup(k, t.sk, s, true)
	s.decision = "backup: no gain, " + verdict
	s.keepUntil = now.Add(p.cfg.Hold)
	k.decision = s.path() + ": " + s.decision
	return []Intent{in}
}

// drain finishes demotions: a demoted subflow with nothing in flight
// waits again (for Hold); one whose queue does not drain in time is
// destroyed, which re-sends its data on the others.
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
			bp.phase, bp.until = bfWaiting, now.Add(b.e.cfg.Hold)
		case now.After(bp.until):
			out = append(out, b.destroy(k, sk, s, now, "demoted, but its queue did not drain")...)
		}
	}
	return out
}

// harm destroys a subflow that lowered the connection's delivery.
func (b *backupFirst) harm(k *kconn, bc *bfConn, sk subKey, s *ksub, now time.Time, why string) []Intent {
	bc.trial = nil
	bc.next = now.Add(b.e.cfg.Window / 2)
	b.e.cfg.Log.Info("backup subflow harmed; destroyed", "token", fmt.Sprintf("%08x", k.c.Token), "path", s.path(), "why", why)
	return b.destroy(k, sk, s, now, "harmed: "+why)
}

// destroy closes a detour subflow (the kernel re-sends its queue on the
// others at once), avoids its detour for this server for Hold and opens a
// replacement (as backup) through another detour if one is ready.
func (b *backupFirst) destroy(k *kconn, sk subKey, s *ksub, now time.Time, why string) []Intent {
	p := b.e
	s.stale, s.role, s.decision = true, RoleEvicted, "evicted: "+why
	k.decision = s.path() + ": " + s.decision
	delete(b.conn(k).paths, sk)
	p.avoid[avoidKey(k.c.Remote, Key(*s.d))] = now.Add(p.cfg.Hold)
	out := []Intent{{Action: DestroySubflow, Token: k.c.Token, LocalID: s.localID,
		Local: netip.AddrPortFrom(sk.local, s.port), Remote: sk.remote, Detour: s.d}}
	return append(out, p.fill(k)...)
}
