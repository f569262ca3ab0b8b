package policy

import (
	"container/heap"
	"fmt"
	"net/netip"
	"time"
)

// watchdog declares dead a path that stopped delivering while data is
// outstanding: no progress for max(3 x RTT, Watchdog) with segments
// unacknowledged after a retransmission timeout (upload), or while other
// subflows of the connection keep receiving (download). A dead detour
// subflow is closed (the kernel reinjects its data) and replaced; a dead
// default or announced path is set aside as backup, another backup is
// promoted if nothing active is left, and it is revived once it delivers.
func (p *Engine) watchdog(k *kconn, now time.Time) []Intent {
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
		p.strat.gone(k, sk)
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
func (p *Engine) redial(k *kconn, now time.Time) []Intent {
	if k.c.DenyJoinInitial || k.finished != "" {
		return nil // a redial is a join to the server's initial address
	}
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
func (p *Engine) redialed(k *kconn, now time.Time) []Intent {
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
		p.strat.gone(k, bk)
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
func (p *Engine) setBackup(k *kconn, sk subKey, s *ksub, on bool) Intent {
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
