package agentd

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// subflowLowat runs the subflow_lowat mechanism: every subflow of every
// managed connection gets TCP_NOTSENT_LOWAT = bytes through the BPF
// program (bpfclamp.Clamper.SetLowat), keyed by its 4-tuple: only that
// subflow gets it, not other sockets between the same addresses (plain
// TCP, probes, unselected connections to other ports), and the program
// touches MPTCP subflows only.
//
// Why: on an MPTCP socket TCP_NOTSENT_LOWAT bounds only the bytes not yet
// handed to a subflow; the kernel sets every subflow's own to UINT_MAX
// (mptcp_sockopt_sync_locked, net/mptcp/sockopt.c), so a subflow takes
// data until its autotuned send buffer (MBs) is full. The MPTCP scheduler
// stops pushing into a subflow whose unsent bytes reach its lowat
// (sk_stream_memory_free), so with a lowat the data stays at the MPTCP
// level, where a faster subflow can take it, and the backlog a slow
// subflow drains after the writer is done stays bounded
// (docs/upstream/mptcp-1sf-p019-p058, docs/agent.md).
//
// A subflow's entry lives while a tracked connection has it established
// (the agent's OnSubflows view: the initial subflow's for the
// connection's life, each join's while it is up; counted per connection,
// should a 4-tuple be reported twice) and is deleted after. A socket
// keeps the lowat it was given.
type subflowLowat struct {
	log   *slog.Logger
	prog  *bpfProgram
	bytes uint32

	mu    sync.Mutex // status reads pairs and refused
	conns map[uint32]map[bpfclamp.Conn]bool
	pairs map[bpfclamp.Conn]int // connections with the subflow
	// refused: the kernel refused TCP_NOTSENT_LOWAT from BPF (warned
	// once, in status); unread: the refusals could not be read (warned
	// once).
	refused string
	unread  bool
}

// startLowat writes the limits through prog (openBPF).
func startLowat(bytes uint32, prog *bpfProgram, log *slog.Logger) *subflowLowat {
	l := &subflowLowat{log: log, prog: prog, bytes: bytes, conns: map[uint32]map[bpfclamp.Conn]bool{}, pairs: map[bpfclamp.Conn]int{}}
	if !prog.ok() {
		log.Warn("subflow lowat off: the BPF program could not be loaded or attached; running without it", "err", prog.err)
		return l
	}
	log.Info("subflow lowat on: every subflow of a managed connection keeps at most this many bytes unsent (TCP_NOTSENT_LOWAT)", "bytes", bytes)
	return l
}

// unmapPort is ap with an IPv4-mapped address unmapped.
func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// subflows takes a connection's subflows' 4-tuples (agent.Options.OnSubflows;
// nil: the connection is gone) and writes or deletes the entries whose
// use changed.
func (l *subflowLowat) subflows(token uint32, pairs []agent.SubflowPair) {
	if !l.prog.ok() {
		return
	}
	now := make(map[bpfclamp.Conn]bool, len(pairs))
	for _, p := range pairs {
		now[bpfclamp.Conn{Local: unmapPort(p.Local), Remote: unmapPort(p.Remote)}] = true
	}
	l.mu.Lock()
	before := l.conns[token]
	if len(now) == 0 {
		delete(l.conns, token)
	} else {
		l.conns[token] = now
	}
	var add, drop []bpfclamp.Conn
	for k := range now {
		if !before[k] {
			if l.pairs[k]++; l.pairs[k] == 1 {
				add = append(add, k)
			}
		}
	}
	for k := range before {
		if !now[k] {
			if l.pairs[k]--; l.pairs[k] <= 0 {
				delete(l.pairs, k)
				drop = append(drop, k)
			}
		}
	}
	l.mu.Unlock()
	for _, k := range add {
		if err := l.prog.lowat(k, l.bytes); err != nil {
			// Not written (e.g. the map is full): not counted, so the
			// connection's next report (or another connection's report
			// of the same 4-tuple) tries again.
			l.log.Warn("subflow lowat not set", "local", k.Local, "remote", k.Remote, "err", err)
			l.mu.Lock()
			if l.conns[token] != nil {
				delete(l.conns[token], k)
			}
			if l.pairs[k]--; l.pairs[k] <= 0 {
				delete(l.pairs, k)
			}
			l.mu.Unlock()
			continue
		}
		l.log.Debug("subflow lowat", "local", k.Local, "remote", k.Remote, "bytes", l.bytes)
	}
	for _, k := range drop {
		if err := l.prog.lowat(k, 0); err != nil {
			l.log.Warn("subflow lowat not removed", "local", k.Local, "remote", k.Remote, "err", err)
		}
	}
	if len(add) > 0 {
		// Refusals of earlier subflows; later ones: measured.
		l.checkRefused()
	}
}

// measured looks for the kernel's refusal at every probe round
// (agent.Options.OnMeasured): the program sets a subflow's lowat at a
// callback after its entry was written, so a refusal shows up only after
// the subflow was added, and a host with one long connection reports no new
// subflow to check it at.
func (l *subflowLowat) measured([]policy.Measurement) {
	if l.prog.ok() {
		l.checkRefused()
	}
}

// checkRefused reads whether the kernel refused the program's
// TCP_NOTSENT_LOWAT (a kernel whose bpf_setsockopt lacks it answers
// EINVAL or ENOPROTOOPT): one warning, and status says it.
func (l *subflowLowat) checkRefused() {
	r, err := l.prog.m.Refused()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil && !l.unread:
		l.unread = true
		l.log.Warn("subflow lowat: the kernel's refusals cannot be read; a refused lowat would not be shown", "err", err)
	case err == nil && r.Lowat != 0 && l.refused == "":
		l.refused = fmt.Sprintf("the kernel refused TCP_NOTSENT_LOWAT from BPF (%v): subflows keep the kernel's unbounded lowat", r.Lowat)
		l.log.Warn("subflow lowat refused by the kernel: subflows run without it", "err", r.Lowat)
	}
}

// status is the mechanism for "mpdetour status".
func (l *subflowLowat) status() agent.LowatStatus {
	if !l.prog.ok() {
		return agent.LowatStatus{State: "failed", Bytes: l.bytes, Error: l.prog.err}
	}
	l.checkRefused()
	sets, err := l.prog.m.LowatSets()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := agent.LowatStatus{State: "active", Bytes: l.bytes, Refused: l.refused, Pairs: len(l.pairs), Sets: sets}
	if l.refused != "" {
		st.State = "refused"
	}
	if err != nil {
		st.Error = err.Error()
	}
	return st
}
