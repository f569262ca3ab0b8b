package policy

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// sim drives an adaptive Engine with synthetic measurements: every path
// delivers at its own rate (bytes/s, 0 = dead) and the test advances time.
type sim struct {
	t     *testing.T
	p     *Engine
	clk   *clock
	conn  Conn
	paths map[subKey]*simPath
	ins   []Intent // every intent returned so far
	// joinable, when set, says whether a new subflow's SYN gets through
	// now; creates that do not are retried every step (SYN retransmits).
	joinable func(sk subKey) bool
	pending  []Intent
	port     uint16 // the last local port given to a subflow
	// extra holds further subflows on the default path's addresses (a
	// second redial attempt that came up), by local port: not measured.
	extra map[uint16]*simPath
	// refuseDestroy, when set, is the kernel's error for a destroy (nil:
	// done); a refused one reaches the policy's Failed (ESRCH: the subflow
	// was closed already, its SUB_CLOSED follows the failure).
	refuseDestroy func(in Intent) error
	// refuseFlags, when set, is the kernel's error for a SET_FLAGS (nil:
	// done); a refused one reaches the policy's Failed, the flag stays.
	refuseFlags func(in Intent) error
	// others: further connections of the same engine (and clock); an
	// intent for one of them (from the engine's Tick) is applied there.
	others []*sim
}

// second is a further connection to the server (token) of the same
// engine and clock, its default path up; intents go to the sim they are for.
func (s *sim) second(token uint32) *sim {
	b := &sim{t: s.t, p: s.p, clk: s.clk, conn: Conn{Token: token, Local: s.conn.Local, Remote: server}, paths: map[subKey]*simPath{}}
	s.others, b.others = append(s.others, b), []*sim{s}
	b.apply(b.p.Established(b.conn))
	b.paths[key(client.Addr(), server)] = &simPath{local: client, remote: server, rate: 1e6, rtt: 30 * time.Millisecond}
	return b
}

// refuseFirst refuses the first command it is asked about (EINVAL),
// counting in *n, and lets the others through.
func refuseFirst(n *int) func(Intent) error {
	return func(Intent) error {
		if *n++; *n == 1 {
			return syscall.EINVAL
		}
		return nil
	}
}

// owner is the sim of the connection in is for.
func (s *sim) owner(in Intent) *sim {
	for _, o := range s.others {
		if o.conn.Token == in.Token {
			return o
		}
	}
	return s
}

// onDefault: the default path's subflow or a redial of it.
func onDefault(sk subKey) bool { return sk.local == client.Addr() && sk.remote == server }

type simPath struct {
	local, remote netip.AddrPort
	rate          float64 // bytes/s; 0 = black hole
	down          bool    // download: bytes received rather than acked
	rtt           time.Duration
	minRTT        time.Duration // 0: the same as rtt
	loss          float64
	acked, rcvd   uint64
	segs, retrans uint32
	quietFor      time.Duration
	backup        bool
	full          bool   // limited by its congestion window (backup-first's evidence)
	cwnd          uint32 // congestion window, segments (0: 10)
	rtos          uint8  // black hole: consecutive RTOs reported (0: 1)
}

func newSim(t *testing.T, k int, ds ...detour.Detour) *sim {
	return newSimMode(t, Adaptive, k, ds...)
}

func newSimMode(t *testing.T, mode Mode, k int, ds ...detour.Detour) *sim {
	clk := &clock{t: time.Unix(1000, 0)}
	p := New(Config{Mode: mode, Subflows: k, Now: clk.now, Rand: func() float64 { return 0.5 }}, []detour.Source{&list{ds: ds}})
	s := &sim{t: t, p: p, clk: clk, conn: Conn{Token: 9, Local: client, Remote: server}, paths: map[subKey]*simPath{}}
	s.apply(p.Established(s.conn))
	s.paths[key(client.Addr(), server)] = &simPath{local: client, remote: server, rate: 1e6, rtt: 30 * time.Millisecond}
	return s
}

// apply records intents and brings requested subflows up (port 50000+n).
func (s *sim) apply(ins []Intent) { s.exec(ins, true) }

func (s *sim) exec(ins []Intent, record bool) {
	for _, in := range ins {
		if o := s.owner(in); o != s {
			o.exec([]Intent{in}, record)
			continue
		}
		if record {
			s.ins = append(s.ins, in)
		}
		sk := key(in.Local.Addr(), in.Remote)
		switch in.Action {
		case CreateSubflow:
			if s.paths[sk] != nil {
				sk.redial = true // a second subflow on the default path
			}
			if s.joinable != nil && !s.joinable(sk) {
				s.pending = append(s.pending, in)
				continue
			}
			if s.port == 0 {
				s.port = 50000
			}
			s.port++
			local := netip.AddrPortFrom(in.Local.Addr(), s.port)
			sp := &simPath{local: local, remote: in.Remote, rate: 1e6, rtt: 30 * time.Millisecond, backup: in.Backup}
			if sk.redial && s.paths[sk] != nil {
				if s.extra == nil {
					s.extra = map[uint16]*simPath{}
				}
				s.extra[s.port] = sp
			} else {
				s.paths[sk] = sp
			}
			s.apply(s.p.SubflowEstablished(Subflow{Token: in.Token, Local: local, Remote: in.Remote, Backup: in.Backup}))
		case DestroySubflow:
			if s.refuseDestroy != nil {
				if err := s.refuseDestroy(in); err != nil {
					s.apply(s.p.Failed(in, err))
					if !errors.Is(err, syscall.ESRCH) {
						continue
					}
					// "subflow not found": it closed before the command
					// (its SUB_CLOSED was on its way); it follows.
				}
			}
			if sp := s.extra[in.Local.Port()]; sp != nil && in.Local.Port() != 0 {
				delete(s.extra, in.Local.Port())
				s.apply(s.p.SubflowClosed(Subflow{Token: in.Token, Local: sp.local, Remote: sp.remote}))
				continue
			}
			for psk, sp := range s.paths {
				if sp.remote != in.Remote || sp.local.Addr() != in.Local.Addr() || in.Local.Port() != 0 && sp.local.Port() != in.Local.Port() {
					continue
				}
				delete(s.paths, psk)
				if rk := (subKey{local: psk.local, remote: psk.remote, redial: true}); !psk.redial && s.paths[rk] != nil {
					s.paths[psk] = s.paths[rk] // the redial is the default subflow now
					delete(s.paths, rk)
				}
				s.apply(s.p.SubflowClosed(Subflow{Token: in.Token, Local: sp.local, Remote: sp.remote}))
				break
			}
		case SetBackup:
			if s.refuseFlags != nil {
				if err := s.refuseFlags(in); err != nil {
					s.apply(s.p.Failed(in, err))
					continue
				}
			}
			if sp := s.paths[sk]; sp != nil {
				sp.backup = in.Backup
			}
		}
	}
}

// run advances time in 100 ms steps, measuring every path.
func (s *sim) run(d time.Duration, set func(sk subKey, sp *simPath)) {
	const step = 100 * time.Millisecond
	for range int(d / step) {
		s.clk.advance(step)
		pending := s.pending
		s.pending = nil
		s.exec(pending, false)
		var ms []Measurement
		for sk, sp := range s.paths {
			if set != nil {
				set(sk, sp)
			}
			m := Measurement{Token: s.conn.Token, Local: sp.local, Remote: sp.remote, RTT: sp.rtt, MinRTT: sp.minRTT, Backup: sp.backup}
			if m.MinRTT == 0 {
				m.MinRTT = sp.rtt
			}
			m.SndCwnd, m.SndMSS = 10, 1400
			if sp.cwnd > 0 {
				m.SndCwnd = sp.cwnd
			}
			if sp.rate > 0 {
				m.Unacked = 2
				if sp.full {
					m.Unacked = m.SndCwnd
				}
				n := uint64(sp.rate * step.Seconds())
				segs := uint32(n/1400) + 1
				sp.segs += segs
				sp.retrans += uint32(float64(segs) * sp.loss)
				if sp.down {
					sp.rcvd += n
				} else {
					sp.acked += n
				}
				sp.quietFor = 0
			} else {
				sp.quietFor += step
				if !sp.down && !sp.backup { // a backup with nothing to send is idle, not stuck
					m.Unacked, m.Retransmits = 10, max(1, sp.rtos)
				}
			}
			m.BytesAcked, m.BytesReceived, m.SegsOut, m.TotalRetrans = sp.acked, sp.rcvd, sp.segs, sp.retrans
			m.SinceDataRecv = sp.quietFor
			ms = append(ms, m)
		}
		s.apply(s.p.Measured(s.clk.t, ms))
		s.apply(s.p.Tick(s.clk.t))
	}
}

func (s *sim) count(a Action) int {
	n := 0
	for _, in := range s.ins {
		if in.Action == a {
			n++
		}
	}
	return n
}

func (s *sim) role(path string) Role { return s.report(path).Role }

// report is the status line of the subflow on path (zero if none).
func (s *sim) report(path string) SubflowReport {
	for _, c := range s.p.Report().Conns {
		for _, sf := range c.Subflows {
			if sf.Path == path {
				return sf
			}
		}
	}
	return SubflowReport{}
}

func TestAdaptiveWatchdogReplacesDeadDetour(t *testing.T) {
	for _, down := range []bool{false, true} {
		s := newSim(t, 1, d1, d2)
		s.run(time.Second, func(_ subKey, sp *simPath) { sp.down = down })
		dead := key(client.Addr(), d1.Remote)
		start := s.clk.t
		s.run(time.Second, func(sk subKey, _ *simPath) {
			if sk == dead {
				s.paths[sk].rate = 0
			}
		})
		if _, ok := s.paths[dead]; ok {
			t.Fatalf("download=%v: dead detour subflow still open after %s", down, s.clk.t.Sub(start))
		}
		if _, ok := s.paths[key(client.Addr(), d2.Remote)]; !ok {
			t.Fatalf("download=%v: no replacement via r2; intents %v", down, s.ins)
		}
		// Destroyed within the watchdog's limit plus a sample or two.
		var at int
		for i, in := range s.ins {
			if in.Action == DestroySubflow {
				at = i
			}
		}
		if at == 0 || s.p.Backoff(d1).IsZero() {
			t.Fatalf("download=%v: no destroy or r1 not backed off: %v", down, s.ins)
		}
	}
}

func TestAdaptiveWatchdogFailsOverDefaultPathAndRevives(t *testing.T) {
	s := newSim(t, 1, d1)
	s.run(time.Second, nil)
	def := key(client.Addr(), server)
	var deadAt, backupAt time.Time
	dead := true
	s.joinable = func(sk subKey) bool { return !dead || !onDefault(sk) }
	s.run(2*time.Second, func(sk subKey, sp *simPath) {
		if onDefault(sk) {
			if deadAt.IsZero() {
				deadAt = s.clk.t
			}
			sp.rate = 0
			if sp.backup && backupAt.IsZero() {
				backupAt = s.clk.t
			}
		}
	})
	if backupAt.IsZero() || backupAt.Sub(deadAt) > 500*time.Millisecond {
		t.Fatalf("default path not set aside within 500 ms (at %v after death); intents %v", backupAt.Sub(deadAt), s.ins)
	}
	if s.role("default") != RoleFailed {
		t.Fatalf("default role %q, want failed", s.role("default"))
	}
	// The path comes back: its retransmissions are acknowledged again.
	s.run(500*time.Millisecond, func(sk subKey, sp *simPath) {
		if onDefault(sk) {
			sp.rate = 1e6
		}
	})
	if s.paths[def].backup || s.role("default") != RoleActive {
		t.Fatalf("default path not revived: backup=%v role %q", s.paths[def].backup, s.role("default"))
	}
}

func TestAdaptiveRefusingServerDoesNotLoop(t *testing.T) {
	s := newSim(t, 2, d1, d2)
	// The server resets every join right after it comes up.
	creates := 0
	for range 100 { // 10 s
		s.clk.advance(100 * time.Millisecond)
		for sk, sp := range s.paths {
			if sk == key(client.Addr(), server) {
				continue
			}
			delete(s.paths, sk)
			s.apply(s.p.SubflowClosed(Subflow{Token: s.conn.Token, Local: sp.local, Remote: sp.remote}))
		}
		s.apply(s.p.Tick(s.clk.t))
	}
	creates = s.count(CreateSubflow)
	if creates > 12 {
		t.Fatalf("%d SUBFLOW_CREATE in 10 s against a server refusing every join, want a bounded few", creates)
	}
	r := s.p.Report().Conns[0]
	if r.HoldUntil.IsZero() || len(r.Refusals) == 0 || !strings.Contains(r.Decision, "refusals") {
		t.Fatalf("report does not show the hold: %+v", r)
	}
}

func TestAdaptiveSetsHarmfulPathAsideAndKeepsUsefulOne(t *testing.T) {
	for _, tc := range []struct {
		name string
		// the detour's rate with the long, lossy default path active and
		// with it set aside
		with, without float64
		wantBackup    bool
	}{
		// Head-of-line blocking behind the default path holds the detour
		// back: the connection does better without it.
		{"harmful", 6e5, 1e6, true},
		// It looks bad (long RTT, loss) but the connection loses without it.
		{"useful", 1e6, 1e6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 1, d1)
			def := key(client.Addr(), server)
			s.run(7*time.Second, func(sk subKey, sp *simPath) {
				if sk == def {
					sp.rtt, sp.loss, sp.rate = 400*time.Millisecond, 0.05, 3e5
					if sp.backup {
						sp.rate = 0.01 // in-flight only
					}
				} else if s.paths[def].backup {
					sp.rate = tc.without
				} else {
					sp.rate = tc.with
				}
			})
			got := s.paths[def].backup
			if got != tc.wantBackup {
				t.Fatalf("default path backup=%v, want %v; decision %q; intents %v", got, tc.wantBackup, s.p.Report().Conns[0].Decision, s.ins)
			}
			if s.count(SetBackup) == 0 {
				t.Fatal("no trial was run")
			}
		})
	}
}

func TestAdaptiveEvictsDetourThatAddsNothing(t *testing.T) {
	// K=1; r1 shares the default path's bottleneck (adds nothing), r2 is
	// disjoint. The policy tries r1, sees no loss without it, evicts it and
	// keeps r2.
	s := newSim(t, 1, d1, d2)
	def := key(client.Addr(), server)
	p1, p2 := key(client.Addr(), d1.Remote), key(client.Addr(), d2.Remote)
	s.run(12*time.Second, func(sk subKey, sp *simPath) {
		shared := s.paths[p1] != nil && !s.paths[p1].backup
		switch sk {
		case def:
			sp.rate = 1e6
			if shared {
				sp.rate = 5e5
			}
		case p1:
			sp.rate = 5e5
			if sp.backup {
				sp.rate = 0.01
			}
		case p2:
			sp.rate = 1e6
		}
	})
	if s.paths[p1] != nil || s.paths[p2] == nil {
		t.Fatalf("after 12 s: r1 open=%v r2 open=%v, want r1 evicted for r2; intents %v", s.paths[p1] != nil, s.paths[p2] != nil, s.ins)
	}
	if s.role("nat:r2") != RoleActive {
		t.Fatalf("r2 role %q", s.role("nat:r2"))
	}
}

func TestBackupDetourOpenedBesidesNAsBackup(t *testing.T) {
	bk := detour.Detour{Kind: detour.NAT, Relay: "rb", Remote: netip.MustParseAddrPort("10.0.5.2:4000"), Backup: true}
	for _, mode := range []Mode{Static, Adaptive} {
		p := New(Config{Mode: mode, Subflows: 1}, []detour.Source{&list{ds: []detour.Detour{bk, d1}}})
		ins := p.Established(Conn{Token: 1, Local: client, Remote: server})
		if len(ins) != 2 {
			t.Fatalf("%s: intents %v, want the backup detour and one more", mode, ins)
		}
		for _, in := range ins {
			if in.Backup != (in.Detour.Relay == "rb") {
				t.Fatalf("%s: %v: backup flag %v", mode, in, in.Backup)
			}
		}
	}
}

// A dead default path set aside as backup carries no new data (the kernel
// does not schedule on backup subflows), so it cannot show by itself that it
// came back: the policy retries it (after 1 s, then 2 s, ... up to Hold), and
// a retry on a path still dead is set aside again by the watchdog.
func TestAdaptiveRetriesDeadDefaultPathUntilItIsBack(t *testing.T) {
	s := newSim(t, 1, d1)
	s.run(time.Second, nil)
	def := key(client.Addr(), server)
	restored := false
	s.joinable = func(sk subKey) bool { return restored || !onDefault(sk) }
	realistic := func(sk subKey, sp *simPath) {
		if !onDefault(sk) {
			return
		}
		switch {
		case !restored:
			sp.rate = 0
		case sp.backup:
			sp.rate = 0 // nothing new is sent on a backup subflow
		default:
			sp.rate = 1e6
		}
	}
	s.run(4*time.Second, realistic) // dead for 4 s: set aside, retried, set aside again
	if !s.paths[def].backup {
		t.Fatalf("dead default path not set aside; role %q", s.role("default"))
	}
	backups := 0
	for _, in := range s.ins {
		if in.Action == SetBackup && key(in.Local.Addr(), in.Remote) == def && in.Backup {
			backups++
		}
	}
	if backups < 2 {
		t.Fatalf("dead default path set aside %d times in 4 s, want retries (>= 2)", backups)
	}
	restored = true
	s.run(5*time.Second, realistic)
	if s.paths[def].backup || s.role("default") == RoleFailed {
		t.Fatalf("restored default path not used again within 5 s: backup=%v role %q", s.paths[def].backup, s.role("default"))
	}
}

// A configured backup detour stays backup while the default path works,
// takes over when it dies, and goes back to backup once the default path
// delivers again (before, a promoted backup stayed active for good: the
// backup scenario measured 41% of the bytes on it with a healthy default
// path).
func TestAdaptiveConfiguredBackupReturnsToBackup(t *testing.T) {
	bk := detour.Detour{Kind: detour.NAT, Relay: "rb", Remote: netip.MustParseAddrPort("10.0.5.2:4000"), Backup: true}
	s := newSim(t, 1, bk)
	defaultDead := false
	s.joinable = func(sk subKey) bool { return !defaultDead || !onDefault(sk) }
	set := func(sk subKey, sp *simPath) {
		switch {
		case onDefault(sk) && defaultDead:
			sp.rate = 0
		case onDefault(sk):
			sp.rate = 1e6
		case sp.backup:
			sp.rate, sp.down = 0, true // the kernel sends nothing new on it
		default:
			sp.rate, sp.down = 1e6, false
		}
	}
	s.run(10*time.Second, set)
	if r := s.role("nat:rb"); r != RoleBackup {
		t.Fatalf("backup detour with a healthy default path: role %q, want backup", r)
	}
	defaultDead = true
	s.run(3*time.Second, set)
	if r := s.role("nat:rb"); r != RoleActive {
		t.Fatalf("backup detour with the default path dead: role %q, want active", r)
	}
	defaultDead = false
	s.run(10*time.Second, set)
	if r := s.role("nat:rb"); r != RoleBackup {
		t.Fatalf("backup detour after the default path came back: role %q, want backup", r)
	}
}

// While the default path stays dead, its retries (active again for a
// while) must not demote the backup that carries the connection: only a
// path that delivered again counts.
func TestAdaptiveRetryDoesNotDemoteBackup(t *testing.T) {
	bk := detour.Detour{Kind: detour.NAT, Relay: "rb", Remote: netip.MustParseAddrPort("10.0.5.2:4000"), Backup: true}
	s := newSim(t, 1, bk)
	s.joinable = func(sk subKey) bool { return !onDefault(sk) }
	set := func(sk subKey, sp *simPath) {
		switch {
		case onDefault(sk):
			sp.rate = 0 // dead for the whole test
		case sp.backup:
			sp.rate, sp.down = 0, true
		default:
			sp.rate, sp.down = 1e6, false
		}
	}
	s.run(2*time.Second, func(sk subKey, sp *simPath) {
		if onDefault(sk) {
			sp.rate = 1e6
		} else {
			set(sk, sp)
		}
	})
	before := len(s.ins)
	s.run(30*time.Second, set)
	bkKey := key(client.Addr(), bk.Remote)
	demotions := 0
	for _, in := range s.ins[before:] {
		if in.Action == SetBackup && key(in.Local.Addr(), in.Remote) == bkKey && in.Backup {
			demotions++
		}
	}
	if demotions != 0 {
		t.Fatalf("the backup carrying the connection was demoted %d times while the default path stayed dead", demotions)
	}
	if r := s.role("nat:rb"); r != RoleActive {
		t.Fatalf("backup role %q after 30 s of dead default path, want active", r)
	}
}

// A bulk transfer fills every path's queue: the smoothed RTTs grow far above
// the base delays (120-160 ms on 30-40 ms paths in the candidates scenario).
// Only a long base RTT makes a path suspect.
func TestAdaptiveJudgesRTTByBaseDelayNotQueue(t *testing.T) {
	for _, tc := range []struct {
		name        string
		minRTT      time.Duration
		wantProbing bool
	}{
		{"queued", 40 * time.Millisecond, false},
		{"long", 330 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 1, d1)
			det := key(client.Addr(), d1.Remote)
			def := key(client.Addr(), server)
			s.run(8*time.Second, func(sk subKey, sp *simPath) {
				switch sk {
				case def:
					sp.rtt, sp.minRTT = 35*time.Millisecond, 30*time.Millisecond
				case det:
					// It delivers a tenth of the default path: a long path
					// that carries little is suspect, one that carries its
					// share is not (TestAdaptiveLongPathCarryingItsShare).
					sp.rtt, sp.minRTT, sp.rate = 150*time.Millisecond+tc.minRTT, tc.minRTT, 1e5
				}
			})
			probed := s.count(SetBackup) > 0
			if probed != tc.wantProbing {
				t.Fatalf("base RTT %s: trial started=%v, want %v; intents %v", tc.minRTT, probed, tc.wantProbing, s.ins)
			}
			if tc.wantProbing {
				for _, c := range s.p.Report().Conns {
					if !strings.Contains(c.Decision, "base RTT 330ms") {
						t.Fatalf("decision %q does not give the base RTT", c.Decision)
					}
				}
			}
		})
	}
}

// Two lossy detours that hold the default path back: both are set aside,
// the worse loss first.
func TestAdaptiveTriesLossierPathFirst(t *testing.T) {
	s := newSim(t, 2, d1, d2)
	p1, p2 := key(client.Addr(), d1.Remote), key(client.Addr(), d2.Remote)
	var aside []time.Time
	was := map[subKey]bool{}
	s.run(12*time.Second, func(sk subKey, sp *simPath) {
		switch sk {
		case p1:
			sp.loss = 0.05
		case p2:
			sp.loss = 0.08
		default:
			// Head-of-line blocking: each active lossy detour holds the
			// default path back by more than it delivers itself.
			sp.rate = 1.2e6
			for _, o := range []subKey{p1, p2} {
				if q := s.paths[o]; q != nil && !q.backup {
					sp.rate -= 5e5
				}
			}
			return
		}
		if sp.backup {
			sp.rate = 0.01
		} else {
			sp.rate = 4e5
		}
		if sp.backup && !was[sk] {
			aside = append(aside, s.clk.t)
		}
		was[sk] = sp.backup
	})
	if !s.paths[p1].backup || !s.paths[p2].backup {
		t.Fatalf("lossy detours not set aside: %v %v; intents %v", s.paths[p1].backup, s.paths[p2].backup, s.ins)
	}
	if len(aside) != 2 {
		t.Fatalf("set aside at %v, want two trials", aside)
	}
	// The 8% one first.
	for _, in := range s.ins {
		if in.Action == SetBackup {
			if in.Remote != d2.Remote {
				t.Fatalf("first trial on %s, want the lossier %s", in.Remote, d2.Remote)
			}
			break
		}
	}
}

// In a download the server's subflow on a dead default path backs off its
// retransmission timer: after the path comes back it may send nothing for
// seconds (the kernel alone took 6 s after a 4 s outage). The policy redials
// the default path on a fresh subflow when it retries it; the first of the
// two to deliver stays, the other is closed. While the path stays dead the
// redials are bounded by the retry schedule.
func TestAdaptiveRedialsDeadDefaultPath(t *testing.T) {
	s := newSim(t, 1, d1)
	s.run(time.Second, func(_ subKey, sp *simPath) { sp.down = true })
	def := key(client.Addr(), server)
	old := s.paths[def].local
	restored := false
	s.joinable = func(sk subKey) bool { return restored || !onDefault(sk) }
	backedOff := func(sk subKey, sp *simPath) {
		sp.down = true
		switch {
		case !onDefault(sk):
		case !restored, sp.local == old:
			sp.rate = 0 // the old subflow stays silent: the server's RTO backed off
		case sp.backup:
			sp.rate = 0
		default:
			sp.rate = 1e6
		}
	}
	s.run(10*time.Second, backedOff)
	redials := 0
	for _, in := range s.ins {
		if in.Action == CreateSubflow && in.Remote == server {
			redials++
		}
	}
	if redials == 0 || redials > 5 {
		t.Fatalf("%d redials of the default path in 10 s dead, want a few (retry schedule)", redials)
	}
	restored = true
	start := s.clk.t
	var usedAt time.Time
	s.run(5*time.Second, func(sk subKey, sp *simPath) {
		backedOff(sk, sp)
		if onDefault(sk) && sp.rate > 0 && usedAt.IsZero() {
			usedAt = s.clk.t
		}
	})
	if usedAt.IsZero() {
		t.Fatalf("restored default path not used within 5 s; intents %v", s.ins)
	}
	p := s.paths[def]
	if p == nil || p.local == old {
		t.Fatalf("default subflow still the old one (%v)", p)
	}
	if len(s.paths) != 2 {
		t.Fatalf("paths %v: want the redialled default and the detour", s.paths)
	}
	if r := s.role("default"); r != RoleActive {
		t.Fatalf("default role %q after the redial delivered", r)
	}
	t.Logf("default path used again %s after it came back, %d redials while dead", usedAt.Sub(start), redials)
}

// SET_FLAGS refused for a live subflow (a kernel without set_flags) is a
// refusal; refused for a subflow that closed meanwhile (a redial replaced
// it) is not.
func TestSetBackupFailureOnGoneSubflowIsNotARefusal(t *testing.T) {
	s := newSim(t, 1, d1)
	s.run(time.Second, nil)
	sp := s.paths[key(client.Addr(), d1.Remote)]
	gone := Intent{Action: SetBackup, Token: s.conn.Token, Local: netip.AddrPortFrom(client.Addr(), 1), Remote: server, Backup: true}
	s.p.Failed(gone, syscall.EINVAL)
	if r := s.p.Report().Conns[0].Refusals; len(r) != 0 {
		t.Fatalf("refusals %v after SET_FLAGS on a subflow that no longer exists", r)
	}
	live := Intent{Action: SetBackup, Token: s.conn.Token, Local: sp.local, Remote: sp.remote, Backup: true}
	s.p.Failed(live, syscall.EOPNOTSUPP)
	if r := s.p.Report().Conns[0].Refusals; r["set_flags: operation not supported"] != 1 {
		t.Fatalf("refusals %v after SET_FLAGS refused on a live subflow", r)
	}
}

// A new subflow on a long path is not judged before it could ramp up
// (10 base RTTs), so it is not evicted as "least delivering" while slow
// start still runs.
func TestAdaptiveLetsLongPathRampUp(t *testing.T) {
	s := newSim(t, 1, d1, d2)
	det := key(client.Addr(), d1.Remote)
	var triedAt time.Duration
	start := s.clk.t
	s.run(6*time.Second, func(sk subKey, sp *simPath) {
		if sk == det {
			sp.rtt, sp.rate = 330*time.Millisecond, 2e5 // still ramping
			if sp.backup && triedAt == 0 {
				triedAt = s.clk.t.Sub(start)
			}
		}
	})
	if triedAt == 0 || triedAt < 3300*time.Millisecond {
		t.Fatalf("long path put on trial %s after it came up, want >= 10 base RTTs (3.3 s)", triedAt)
	}
}

// A trial that shows at once that the connection needs the subflow ends
// early: the aggregate without it fell below 80% of before.
func TestAdaptiveTrialOfClearlyUsefulPathEndsEarly(t *testing.T) {
	s := newSim(t, 1, d1)
	det := key(client.Addr(), d1.Remote)
	var asideAt, backAt time.Time
	s.run(8*time.Second, func(sk subKey, sp *simPath) {
		if sk != det {
			return
		}
		sp.loss = 0.05 // looks harmful: tried first
		sp.rate = 4e6
		if sp.backup {
			sp.rate = 0.01
			if asideAt.IsZero() {
				asideAt = s.clk.t
			}
		} else if !asideAt.IsZero() && backAt.IsZero() {
			backAt = s.clk.t
		}
	})
	if asideAt.IsZero() || backAt.IsZero() {
		t.Fatalf("no trial of the lossy detour: intents %v", s.ins)
	}
	if d := backAt.Sub(asideAt); d > s.p.cfg.Window/4+700*time.Millisecond {
		t.Fatalf("useful detour kept aside %s, want the trial cut short (< %s)", d, s.p.cfg.Window/4+700*time.Millisecond)
	}
	if !strings.Contains(s.p.Report().Conns[0].Decision, "kept") {
		t.Fatalf("decision %q", s.p.Report().Conns[0].Decision)
	}
}

// While untried detours remain, a detour that adds little (here 6% of the
// aggregate, less than half a fair share) makes room for a candidate, even
// though the connection does a little worse without it.
func TestAdaptiveExploresPastDetourThatAddsLittle(t *testing.T) {
	s := newSim(t, 1, d1, d2)
	p1, p2 := key(client.Addr(), d1.Remote), key(client.Addr(), d2.Remote)
	s.run(12*time.Second, func(sk subKey, sp *simPath) {
		switch sk {
		case p1:
			sp.loss, sp.rate = 0.05, 6e4
		case p2:
			sp.rate = 1e6
		default:
			return
		}
		if sp.backup {
			sp.rate = 0.01
		}
	})
	if _, ok := s.paths[p2]; !ok || s.paths[p1] != nil {
		t.Fatalf("paths %v: want the lossy detour (adding 6%%) replaced by the untried one; intents %v", s.paths, s.ins)
	}
}

// Redial bookkeeping against the kernel's events (review findings): an
// older attempt that comes up after the tracked redial is closed, and its
// close event does not drop the tracked redial; an attempt in SYN_SENT that
// ends while a newer one is outstanding keeps the record.
func TestRedialAttemptsKeepTheirRecord(t *testing.T) {
	p := NewAdaptive(Config{Subflows: 1, Now: (&clock{t: time.Unix(1000, 0)}).now}, []detour.Source{&list{}})
	c := Conn{Token: 7, Local: client, Remote: server}
	p.Established(c)
	k := p.conns[7]
	now := p.cfg.Now()
	// Two attempts outstanding (the first given up on, the second pending).
	p.redial(k, now)
	rk := key(client.Addr(), server)
	rk.redial = true
	k.subs[rk].stale = true
	p.redial(k, now)
	if r := k.subs[rk]; r == nil || r.attempts != 2 {
		t.Fatalf("record %+v, want 2 attempts", k.subs[rk])
	}
	// One attempt's SYN retries end: the record stays for the other.
	p.SubflowClosed(Subflow{Token: 7, Local: netip.AddrPortFrom(client.Addr(), 0), Remote: server, Errno: 110})
	if k.subs[rk] == nil {
		t.Fatal("record dropped while an attempt is outstanding")
	}
	// The other comes up on port 60001 and is tracked.
	a := netip.AddrPortFrom(client.Addr(), 60001)
	p.SubflowEstablished(Subflow{Token: 7, Local: a, Remote: server})
	if r := k.subs[rk]; r == nil || !r.up || r.port != 60001 {
		t.Fatalf("redial not tracked: %+v", k.subs[rk])
	}
	// A late attempt on 60002: closed, and its close keeps 60001 tracked.
	b := netip.AddrPortFrom(client.Addr(), 60002)
	ins := p.SubflowEstablished(Subflow{Token: 7, Local: b, Remote: server})
	if len(ins) != 1 || ins[0].Action != DestroySubflow || ins[0].Local != b {
		t.Fatalf("intents %v, want the late attempt destroyed", ins)
	}
	p.SubflowClosed(Subflow{Token: 7, Local: b, Remote: server})
	if r := k.subs[rk]; r == nil || r.port != 60001 {
		t.Fatalf("tracked redial lost to the late attempt's close: %+v", k.subs[rk])
	}
	p.SubflowClosed(Subflow{Token: 7, Local: a, Remote: server})
	if k.subs[rk] != nil {
		t.Fatal("redial record kept after its own close")
	}
	if r := p.Report().Conns[0]; len(r.Refusals) != 0 {
		t.Fatalf("refusals %v from redial attempts", r.Refusals)
	}
}

// A trial ended early because the connection clearly needs the subflow
// keeps it, also while untried candidates would otherwise make a weak
// detour go.
func TestAdaptiveTrialCutShortKeepsSubflow(t *testing.T) {
	s := newSim(t, 1, d1, d2)
	p1 := key(client.Addr(), d1.Remote)
	s.run(8*time.Second, func(sk subKey, sp *simPath) {
		if sk != p1 {
			return
		}
		sp.loss, sp.rate = 0.05, 3e5 // 23% of the aggregate: the cut (80%) comes before explore's 75%
		if sp.backup {
			sp.rate = 0.01
		}
	})
	if s.paths[p1] == nil {
		t.Fatalf("detour evicted after a trial cut short; decision %q", s.p.Report().Conns[0].Decision)
	}
}

// A server that resets joins beyond its limit (2 extra subflows) teaches
// the policy the limit: no detour is blamed, the connection is not held,
// and no more joins are asked for than it accepts.
func TestAdaptiveLearnsServerSubflowLimit(t *testing.T) {
	d3 := detour.Detour{Kind: detour.NAT, Relay: "r3", Remote: netip.MustParseAddrPort("10.0.6.2:4000")}
	d4 := detour.Detour{Kind: detour.NAT, Relay: "r4", Remote: netip.MustParseAddrPort("10.0.7.2:4000")}
	s := newSim(t, 4, d1, d2, d3, d4)
	// The server resets every join beyond the first two (the kernel's
	// SUB_ESTABLISHED then SUB_CLOSED with ECONNRESET).
	for sk, sp := range s.paths {
		if sk.remote == d3.Remote || sk.remote == d4.Remote {
			delete(s.paths, sk)
			s.apply(s.p.SubflowClosed(Subflow{Token: s.conn.Token, Local: sp.local, Remote: sp.remote, Errno: 104}))
		}
	}
	s.run(10*time.Second, nil)
	for _, d := range []detour.Detour{d1, d2, d3, d4} {
		if !s.p.Backoff(d).IsZero() {
			t.Errorf("%s blamed for the server's limit", d.Relay)
		}
	}
	r := s.p.Report().Conns[0]
	if !r.HoldUntil.IsZero() {
		t.Fatalf("connection held: %+v", r)
	}
	if n := len(s.paths) - 1; n != 2 {
		t.Fatalf("%d detour subflows, want the server's 2; intents %v", n, s.ins)
	}
	if creates := s.count(CreateSubflow); creates != 4 {
		t.Fatalf("%d creates, want 4 (no retries beyond the limit)", creates)
	}
}

// A long path that carries its share of the connection is not put on
// trial for its RTT alone.
func TestAdaptiveLongPathCarryingItsShare(t *testing.T) {
	s := newSim(t, 1, d1)
	def := key(client.Addr(), server)
	s.run(10*time.Second, func(sk subKey, sp *simPath) {
		if sk == def {
			sp.rtt, sp.minRTT = 240*time.Millisecond, 220*time.Millisecond // 1e6 B/s, half the aggregate
		}
	})
	if n := s.count(SetBackup); n != 0 {
		t.Fatalf("%d set-backup intents for a long path carrying half the aggregate; intents %v", n, s.ins)
	}
}

// Losses a path takes from its own full queue (smoothed RTT far above the
// base RTT) do not make it suspect; losses on a path whose queue stays
// empty do.
func TestAdaptiveSuspectsRandomLossNotQueueLoss(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rtt     time.Duration
		suspect bool
	}{
		{"queue", 160 * time.Millisecond, false},
		{"random", 45 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 1, d1)
			det := key(client.Addr(), d1.Remote)
			s.run(6*time.Second, func(sk subKey, sp *simPath) {
				if sk == det {
					sp.loss, sp.rtt, sp.minRTT = 0.08, tc.rtt, 40*time.Millisecond
				}
			})
			if got := s.count(SetBackup) > 0; got != tc.suspect {
				t.Fatalf("RTT %s, 8%% loss: trial=%v, want %v; intents %v", tc.rtt, got, tc.suspect, s.ins)
			}
		})
	}
}
