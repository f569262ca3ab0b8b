package agentd

import (
	"fmt"
	"log/slog"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// subflowPacing runs the subflow_pacing mechanism: the address pair of
// every subflow of every managed connection gets the largest maximum
// pacing rate the program can set (bpfclamp.MaxPacingRate, ~4.3 GB/s)
// through the agent's BPF program (bpfclamp.Clamper.Set, Limits{PacingRate}).
//
// Why: the rate caps nothing, but setting SO_MAX_PACING_RATE to anything
// but ~0 switches the socket's pacing status to SK_PACING_NEEDED
// (sk_setsockopt, net/core/sock.c), and with it TCP's internal pacing
// (tcp_needs_internal_pacing, net/ipv4/tcp_output.c): the subflow sends
// at its own pacing rate (about 2 x cwnd/srtt in slow start, 1.2 x in
// congestion avoidance; tcp_update_pacing_rate) instead of in the bursts
// the MPTCP scheduler hands it. This kernel has no fq qdisc, so there is
// no other way to pace a subflow. Measured in docs/results/design/pace.
//
// The program keys limits by address pair, not by 4-tuple: a plain TCP
// socket between the same two addresses that connects while the pair has
// its entry is paced too (at its own rate; the program watches MPTCP
// subflows only after they connect, bpfclamp.Options). A pair's entry
// lives while a tracked connection has a subflow on it (counted per
// connection, like subflow_lowat's 4-tuples) and is deleted after; a
// socket keeps the pacing it was given.
//
// subflow_pacing and cwnd_clamp are not combined (the config refuses it):
// both write a pair's pacing rate.
type subflowPacing struct {
	log  *slog.Logger
	prog *bpfProgram

	mu    sync.Mutex // status reads the counts and refused
	users pairUsers[bpfclamp.Key]
	// refusal: whether the kernel refused SO_MAX_PACING_RATE from BPF
	// (warned once, in status).
	refusal refusalWatch
}

// startPacing writes the pacing rates through prog (openBPF).
func startPacing(prog *bpfProgram, log *slog.Logger) *subflowPacing {
	p := &subflowPacing{log: log, prog: prog, users: newPairUsers[bpfclamp.Key](),
		refusal: refusalWatch{name: "subflow pacing", what: "pacing rate", option: "SO_MAX_PACING_RATE", without: "subflows are not paced"}}
	if !prog.ok() {
		log.Warn("subflow pacing off: the BPF program could not be loaded or attached; running without it", "err", prog.err)
		return p
	}
	log.Info("subflow pacing on: the subflows of managed connections pace themselves at TCP's own rate (SO_MAX_PACING_RATE, not capped)", "max_pacing_rate", uint64(bpfclamp.MaxPacingRate))
	return p
}

// wirePacing runs subflow_pacing beside what opts already reports
// subflows and measurements to (subflow_lowat, cwnd clamps), through the
// agent's one program.
func wirePacing(opts *agent.Options, prog *bpfProgram, log *slog.Logger) {
	p := startPacing(prog, log)
	if prev := opts.OnSubflows; prev != nil {
		opts.OnSubflows = func(token uint32, pairs []agent.SubflowPair) { prev(token, pairs); p.subflows(token, pairs) }
	} else {
		opts.OnSubflows = p.subflows
	}
	if prev := opts.OnMeasured; prev != nil {
		opts.OnMeasured = func(ms []policy.Measurement) { prev(ms); p.measured(ms) }
	} else {
		opts.OnMeasured = p.measured
	}
	opts.SubflowPacing = p.status
}

// subflows takes a connection's subflows (agent.Options.OnSubflows; nil:
// the connection is gone) and writes or deletes the address pairs whose
// use changed.
func (p *subflowPacing) subflows(token uint32, pairs []agent.SubflowPair) {
	if !p.prog.ok() {
		return
	}
	now := make(map[bpfclamp.Key]bool, len(pairs))
	for _, sp := range pairs {
		now[bpfclamp.Key{Local: sp.Local.Addr().Unmap(), Remote: sp.Remote.Addr().Unmap()}] = true
	}
	p.mu.Lock()
	add, drop := p.users.update(token, now)
	p.mu.Unlock()
	for _, k := range add {
		err := p.prog.change(k, func(l *bpfclamp.Limits) { l.PacingRate = bpfclamp.MaxPacingRate })
		if err != nil {
			// Not counted: the connection's next report tries again.
			p.log.Warn("subflow pacing not set", "local", k.Local, "remote", k.Remote, "err", err)
			p.mu.Lock()
			p.users.forget(token, k)
			p.mu.Unlock()
			continue
		}
		p.log.Debug("subflow pacing", "local", k.Local, "remote", k.Remote)
	}
	for _, k := range drop {
		if err := p.prog.change(k, func(l *bpfclamp.Limits) { l.PacingRate = 0 }); err != nil {
			p.log.Warn("subflow pacing not removed", "local", k.Local, "remote", k.Remote, "err", err)
		}
	}
	if len(add) > 0 {
		p.checkRefused()
	}
}

// measured looks for the kernel's refusal at every probe round
// (agent.Options.OnMeasured): the program sets the rate at a callback
// after the entry was written.
func (p *subflowPacing) measured([]policy.Measurement) {
	if p.prog.ok() {
		p.checkRefused()
	}
}

// checkRefused reads whether the kernel refused the program's
// SO_MAX_PACING_RATE: one warning, and status says it.
func (p *subflowPacing) checkRefused() {
	r, err := p.prog.m.Refused()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusal.note(p.log, r.Pacing, err)
}

// status is the mechanism for "mpdetour status".
func (p *subflowPacing) status() agent.PacingStatus {
	if !p.prog.ok() {
		return agent.PacingStatus{State: "failed", Error: p.prog.err}
	}
	p.checkRefused()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := agent.PacingStatus{State: "active", MaxRate: bpfclamp.MaxPacingRate, Refused: p.refusal.refused, Pairs: p.users.len()}
	if p.refusal.refused != "" {
		st.State = "refused"
	}
	return st
}

// pairUsers counts, for each key (an address pair or a 4-tuple), the
// tracked connections that have a subflow on it, so that an entry is
// written when its first user appears and deleted after its last.
type pairUsers[K comparable] struct {
	byConn map[uint32]map[K]bool
	count  map[K]int
}

func newPairUsers[K comparable]() pairUsers[K] {
	return pairUsers[K]{byConn: map[uint32]map[K]bool{}, count: map[K]int{}}
}

// update sets connection token's keys to now (empty: the connection is
// gone) and returns the keys that got their first user (add) and those
// that lost their last (drop).
func (u pairUsers[K]) update(token uint32, now map[K]bool) (add, drop []K) {
	before := u.byConn[token]
	if len(now) == 0 {
		delete(u.byConn, token)
	} else {
		u.byConn[token] = now
	}
	for k := range now {
		if before[k] {
			continue
		}
		u.count[k]++
		if u.count[k] == 1 {
			add = append(add, k)
		}
	}
	for k := range before {
		if now[k] {
			continue
		}
		if u.count[k]--; u.count[k] <= 0 {
			delete(u.count, k)
			drop = append(drop, k)
		}
	}
	return add, drop
}

// forget undoes connection token's use of k (its entry could not be
// written), so that a later report adds it again.
func (u pairUsers[K]) forget(token uint32, k K) {
	if c := u.byConn[token]; c != nil {
		delete(c, k)
	}
	if u.count[k]--; u.count[k] <= 0 {
		delete(u.count, k)
	}
}

func (u pairUsers[K]) len() int { return len(u.count) }

// buildPacing validates subflow_pacing (unset or false: off). On, it
// attaches the program alone or beside subflow_lowat, to bpf_cgroup,
// which it validates itself (buildLowat gets rest, the file without it,
// and the caller keeps cgroup); it refuses cwnd_clamp (clamps: on),
// which writes the same pairs' pacing rates.
func buildPacing(f File, clamps bool) (on bool, cgroup string, rest File, err error) {
	if f.SubflowPacing == nil || !*f.SubflowPacing {
		return false, "", f, nil
	}
	if clamps {
		return false, "", f, fmt.Errorf("subflow_pacing: cannot be combined with cwnd_clamp: both set the address pairs' SO_MAX_PACING_RATE in the agent's one BPF program (use one of them)")
	}
	if f.BPFCgroup != "" {
		if err := cgroupPath("bpf_cgroup", f.BPFCgroup); err != nil {
			return false, "", f, err
		}
	}
	rest = f
	rest.BPFCgroup = ""
	return true, f.BPFCgroup, rest, nil
}

// refusalWatch keeps what the kernel refused one mechanism's socket
// option (from the program's counts, bpfProgram.m.Refused) and warns
// once of a refusal and once of refusals that cannot be read
// (subflow_lowat and subflow_pacing; the caller holds its lock).
type refusalWatch struct {
	// name is the mechanism ("subflow lowat"), what the value it sets
	// ("lowat"), option the socket option, without what the subflows
	// keep when it is refused.
	name, what, option, without string
	// refused: the reason for status ("" while none); unread: the
	// refusals could not be read (warned).
	refused string
	unread  bool
}

// note takes one reading: errno is the option's refusal (0: none), err
// the reading's failure.
func (w *refusalWatch) note(log *slog.Logger, errno unix.Errno, err error) {
	switch {
	case err != nil && !w.unread:
		w.unread = true
		log.Warn(w.name+": the kernel's refusals cannot be read; a refused "+w.what+" would not be shown", "err", err)
	case err == nil && errno != 0 && w.refused == "":
		w.refused = fmt.Sprintf("the kernel refused %s from BPF (%v): %s", w.option, errno, w.without)
		log.Warn(w.name+" refused by the kernel: subflows run without it", "err", errno)
	}
}
