package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// A backup-first connection: the default path (30 ms) and one NAT detour
// opened as backup. set gives each path its rate as the test wants it;
// the kernel sends nothing on a backup subflow, so a backup path's rate
// is 0 there.
func newBackupFirst(t *testing.T) (*sim, subKey, subKey) {
	t.Helper()
	s := newSimMode(t, BackupFirst, 1, d1)
	def := key(client.Addr(), server)
	det := key(client.Addr(), d1.Remote)
	if len(s.ins) != 1 || s.ins[0].Action != CreateSubflow || !s.ins[0].Backup {
		t.Fatalf("intents %v, want one create with the B flag", s.ins)
	}
	if s.role("nat:r1") != RoleBackup {
		t.Fatalf("detour role %q, want backup", s.role("nat:r1"))
	}
	return s, def, det
}

func (s *sim) decision(path string) string { return s.report(path).Decision }

// The default path is full (cwnd-limited) and the detour, as fast, adds
// its own capacity: it is tried and kept active.
func TestBackupFirstPromotesDetourThatHelps(t *testing.T) {
	s, def, det := newBackupFirst(t)
	s.run(6*time.Second, func(sk subKey, sp *simPath) {
		sp.full = true
		switch {
		case sk == def:
			sp.rate = 1e6
		case sp.backup:
			sp.rate = 0
		default:
			sp.rate = 1e6
		}
	})
	if s.paths[det].backup || s.role("nat:r1") != RoleActive || !strings.HasPrefix(s.decision("nat:r1"), "kept") {
		t.Fatalf("detour backup=%v role %q decision %q, want kept active; intents %v", s.paths[det].backup, s.role("nat:r1"), s.decision("nat:r1"), s.ins)
	}
}

// Without evidence (the default path has room: the application is the
// limit) the detour waits as backup: no trial, no flag change.
func TestBackupFirstWaitsWhileTheActivePathHasRoom(t *testing.T) {
	s, def, _ := newBackupFirst(t)
	s.run(10*time.Second, func(sk subKey, sp *simPath) {
		if sk == def {
			sp.rate = 1e6
		} else {
			sp.rate = 0
		}
	})
	if n := s.count(SetBackup); n != 0 {
		t.Fatalf("%d SET_FLAGS while the active path was not full: %v", n, s.ins)
	}
	if d := s.decision("nat:r1"); !strings.Contains(d, "not full") {
		t.Fatalf("decision %q, want the reason it waits", d)
	}
}

// ECF: a detour whose RTT exceeds what a segment waits for the active
// path (its RTT plus draining what it holds) is not tried.
func TestBackupFirstLeavesSlowDetourWaiting(t *testing.T) {
	s, def, _ := newBackupFirst(t)
	s.run(10*time.Second, func(sk subKey, sp *simPath) {
		sp.full = true
		if sk == def {
			sp.rate = 1e6
		} else {
			sp.rate, sp.rtt = 0, time.Second
		}
	})
	if n := s.count(SetBackup); n != 0 {
		t.Fatalf("%d SET_FLAGS for a 1 s detour beside a 30 ms path: %v", n, s.ins)
	}
	if d := s.decision("nat:r1"); !strings.Contains(d, "arrival estimate") {
		t.Fatalf("decision %q, want the arrival estimate", d)
	}
}

// A detour that stalls the connection once active (head-of-line blocking:
// both paths collapse) is destroyed within a few RTTs of the trial's
// start, its detour avoided for the server; the connection goes on on
// the default path alone.
func TestBackupFirstDestroysDetourThatStallsQuickly(t *testing.T) {
	s, def, _ := newBackupFirst(t)
	var tried, destroyed time.Time
	s.run(8*time.Second, func(sk subKey, sp *simPath) {
		sp.full = true
		active := false
		for psk, p := range s.paths {
			if psk != def && !p.backup {
				active = true
			}
		}
		if active && tried.IsZero() {
			tried = s.clk.t
		}
		if tried.IsZero() == false && destroyed.IsZero() && s.count(DestroySubflow) > 0 {
			destroyed = s.clk.t
		}
		switch {
		case sk == def && active:
			sp.rate = 1e4
		case sk == def:
			sp.rate = 1e6
		case sp.backup:
			sp.rate = 0
		default:
			sp.rate = 1e4
		}
	})
	if tried.IsZero() || s.count(DestroySubflow) != 1 {
		t.Fatalf("tried at %v, %d destroys; intents %v", tried, s.count(DestroySubflow), s.ins)
	}
	took := destroyed.Sub(tried)
	t.Logf("trial began %s, detour destroyed %s later", tried.Sub(time.Unix(1000, 0)), took)
	if took > 600*time.Millisecond {
		t.Fatalf("the stall lasted %s before the detour was destroyed, want a few RTTs (<= 600 ms)", took)
	}
	if n := s.count(CreateSubflow); n != 1 {
		t.Fatalf("%d creates: the harmful detour was reopened within Hold", n)
	}
	if !strings.HasPrefix(s.decision("nat:r1"), "evicted: harmed") && len(s.paths) != 1 {
		t.Fatalf("paths %d, decision %q", len(s.paths), s.decision("nat:r1"))
	}
}

// A detour that adds nothing and harms nothing goes back to backup once
// its queue drained; not destroyed, not tried again for Hold.
func TestBackupFirstDemotesDetourThatAddsNothing(t *testing.T) {
	s, def, det := newBackupFirst(t)
	s.run(10*time.Second, func(sk subKey, sp *simPath) {
		sp.full = true
		active := !s.paths[det].backup
		switch {
		case sk == def && active:
			sp.rate = 5e5
		case sk == def:
			sp.rate = 1e6
		case sp.backup:
			sp.rate = 0
		default:
			sp.rate = 5e5
		}
	})
	if !s.paths[det].backup || s.count(DestroySubflow) != 0 {
		t.Fatalf("detour backup=%v, %d destroys; want demoted, not destroyed; intents %v", s.paths[det].backup, s.count(DestroySubflow), s.ins)
	}
	if n := s.count(SetBackup); n != 2 {
		t.Fatalf("%d SET_FLAGS in 10 s, want 2 (one trial, then not again for Hold)", n)
	}
	if d := s.decision("nat:r1"); !strings.HasPrefix(d, "backup: no gain") {
		t.Fatalf("decision %q", d)
	}
}

// The 6.18 kernel reports backup=0 in SUB_ESTABLISHED for a join created
// with the backup flag (and sends nothing on it): the subflow stays a
// backup to the policy, so it can be tried. Found in the lab: before the
// fix the detour counted as active and was never tried (9.38 Mbit/s
// beside static's 18.58 on brennan2017 core-limited).
func TestBackupFirstJoinStaysBackupWhateverTheEventSays(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	p := NewBackupFirst(Config{Subflows: 1, Now: clk.now}, []detour.Source{&list{ds: []detour.Detour{d1}}})
	ins := p.Established(Conn{Token: 1, Local: client, Remote: server, Fully: true})
	if len(ins) != 1 || !ins[0].Backup {
		t.Fatalf("intents %v", ins)
	}
	p.SubflowEstablished(up(ins[0], 41000)) // the event's backup attribute: 0
	for _, sf := range p.Report().Conns[0].Subflows {
		if sf.Path == "nat:r1" && sf.Role != RoleBackup {
			t.Fatalf("detour subflow role %q, want backup", sf.Role)
		}
	}
}
