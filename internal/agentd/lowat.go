package agentd

import (
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/netnsx"
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
//
// Scaled (subflow_lowat_scale: rtt), bytes is the floor and ceil the
// ceiling of a limit the program computes per subflow at each RTT
// callback: cwnd x mss x (T - srtt) / srtt, the bytes the subflow sends
// while the connection's slowest subflow (smoothed RTT T) makes one round
// trip (bpfclamp.Clamper.SetLowatScaled). Why: the MPTCP scheduler
// (mptcp_subflow_get_send) picks the subflow with the lowest linger time
// (its queued bytes over its pacing rate) and sends nothing when that one
// has no room under its lowat; a fixed cap on a short subflow caps its
// linger time, and a long subflow gets data only while its own is below
// that cap: at p149 the 365 ms detour had window but no data for 6-7 % of
// its busy time with 128 KiB (docs/results/design/lowat-p149; the short
// subflow F keeps the long one L fed with a lowat of at least
// cwnd_F x mss x (srtt_L / srtt_F - 1)). No subflow's callback sees T, so the
// agent writes it into each entry of the connection from the probe
// rounds' RTTs (measured): a new subflow's entry is the floor (T = 0) until
// it has a measurement, so SUBFLOW_CREATE costs the one map write it
// costs today; T is rewritten only when it moved by more than 1/8.
type subflowLowat struct {
	log   *slog.Logger
	prog  *bpfProgram
	bytes uint32
	// ceil: the scaled limit's ceiling; 0: fixed (subflow_lowat_scale:
	// none).
	ceil uint32
	// dflt: the file does not set subflow_lowat (bytes is the default;
	// the warning and status say so).
	dflt bool

	mu    sync.Mutex // status reads pairs and refused
	conns map[uint32]*lowatConn
	pairs map[bpfclamp.Conn]int // connections with the subflow
	// rewrites: entries rewritten for a new T (status).
	rewrites uint64
	// refusal: whether the kernel refused TCP_NOTSENT_LOWAT from BPF
	// (warned once, in status).
	refusal refusalWatch
}

// lowatConn is one managed connection's subflows and the T written
// into their entries.
type lowatConn struct {
	// subs: each subflow's T as written (0: the floor) and whether it
	// has had a measurement.
	subs map[bpfclamp.Conn]*lowatSub
	// t is the connection's largest subflow RTT as last written (0: no
	// measurement yet).
	t time.Duration
}

type lowatSub struct {
	written  time.Duration
	measured bool
}

// startLowat writes the limits through prog (openBPF): fixed (ceil 0)
// or scaled between bytes and ceil (lowatCeil). dflt: the limit is the
// default (the file does not set subflow_lowat). A program that cannot be
// loaded or attached is one warning either way, and the agent runs
// without the limit; for the default the line also says that it is the
// default and how to turn it off (subflow_lowat: 0).
func startLowat(bytes, ceil uint32, dflt bool, prog *bpfProgram, log *slog.Logger) *subflowLowat {
	l := &subflowLowat{log: log, prog: prog, bytes: bytes, ceil: ceil, dflt: dflt, conns: map[uint32]*lowatConn{}, pairs: map[bpfclamp.Conn]int{},
		refusal: refusalWatch{name: "subflow lowat", what: "lowat", option: "TCP_NOTSENT_LOWAT", without: "subflows keep the kernel's unbounded lowat"}}
	if !prog.ok() {
		msg, args := "subflow lowat off: the BPF program could not be loaded or attached; running without it", []any{"err", prog.err}
		if dflt {
			msg += " (subflow_lowat is not set: the limit is on by default; subflow_lowat: 0 turns it off without this warning)"
			args = append([]any{"bytes", bytes}, args...)
		}
		log.Warn(msg, args...)
		return l
	}
	if ceil != 0 {
		log.Info("subflow lowat on, scaled to the subflows' RTTs: each subflow of a managed connection keeps at most what it sends in the connection's largest RTT unsent (TCP_NOTSENT_LOWAT), between floor and ceiling", "floor", bytes, "ceiling", ceil)
		return l
	}
	log.Info("subflow lowat on: every subflow of a managed connection keeps at most this many bytes unsent (TCP_NOTSENT_LOWAT)", "bytes", bytes, "default", dflt, "cgroup", cgroupName(prog.cgroup))
	return l
}

// defaultLowatCeil is the scaled limit's ceiling when the host's
// tcp_wmem cannot be read: Linux's default tcp_wmem maximum.
const defaultLowatCeil = 4 << 20

// lowatCeil is the scaled limit's ceiling: the maximum of
// net.ipv4.tcp_wmem in namespace netns (the agent's) at start, above
// which a subflow's send buffer binds first; at least floor and at most
// math.MaxInt32. Unreadable: defaultLowatCeil, said once.
func lowatCeil(netns string, floor uint32, read func(netns string) (string, error), log *slog.Logger) uint32 {
	ceil := int64(defaultLowatCeil)
	v, err := read(netns)
	if err == nil {
		f := strings.Fields(v)
		if len(f) != 3 {
			err = fmt.Errorf("%q is not three numbers", strings.TrimSpace(v))
		} else if n, perr := strconv.ParseInt(f[2], 10, 64); perr != nil || n <= 0 {
			err = fmt.Errorf("%q: the maximum is not a positive number", strings.TrimSpace(v))
		} else {
			ceil = n
		}
	}
	if err != nil {
		log.Warn("subflow lowat: net.ipv4.tcp_wmem unreadable; the scaled limit's ceiling is Linux's default maximum", "ceiling", ceil, "err", err)
	}
	return uint32(min(max(ceil, int64(floor)), math.MaxInt32))
}

// readWmem reads net.ipv4.tcp_wmem in namespace netns.
func readWmem(netns string) (string, error) {
	var v []byte
	err := netnsx.Do(netns, func() (err error) {
		v, err = os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
		return err
	})
	return string(v), err
}

// value is the entry of a subflow whose connection's T is t.
func (l *subflowLowat) value(t time.Duration) bpfclamp.Lowat {
	if l.ceil == 0 {
		return bpfclamp.Lowat{Floor: l.bytes}
	}
	return bpfclamp.Lowat{Floor: l.bytes, Ceil: l.ceil, MaxRTT: min(t, bpfclamp.MaxLowatRTT)}
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
	c := l.conns[token]
	if c == nil {
		c = &lowatConn{subs: map[bpfclamp.Conn]*lowatSub{}}
	}
	if len(now) == 0 {
		delete(l.conns, token)
	} else {
		l.conns[token] = c
	}
	var add, drop []bpfclamp.Conn
	for k := range now {
		if c.subs[k] == nil {
			// No measurement yet: the floor.
			c.subs[k] = &lowatSub{}
			if l.pairs[k]++; l.pairs[k] == 1 {
				add = append(add, k)
			}
		}
	}
	for k := range c.subs {
		if !now[k] {
			delete(c.subs, k)
			if l.pairs[k]--; l.pairs[k] <= 0 {
				delete(l.pairs, k)
				drop = append(drop, k)
			}
		}
	}
	l.mu.Unlock()
	for _, k := range add {
		if err := l.prog.lowat(k, l.value(0)); err != nil {
			// Not written (e.g. the map is full): not counted, so the
			// connection's next report (or another connection's report
			// of the same 4-tuple) tries again.
			l.log.Warn("subflow lowat not set", "local", k.Local, "remote", k.Remote, "err", err)
			l.mu.Lock()
			if c := l.conns[token]; c != nil {
				delete(c.subs, k)
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
		if err := l.prog.lowat(k, bpfclamp.Lowat{}); err != nil {
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
// subflow to check it at. Scaled, it also writes each connection's T
// (its subflows' largest smoothed RTT in this round) into the entries of
// its measured subflows: all of them when T moved by more than 1/8 of the
// T written, else only those measured for the first time.
func (l *subflowLowat) measured(ms []policy.Measurement) {
	if !l.prog.ok() {
		return
	}
	l.checkRefused()
	if l.ceil == 0 {
		return
	}
	type write struct {
		k   bpfclamp.Conn
		t   time.Duration
		sub *lowatSub
	}
	var writes []write
	rtt := map[uint32]time.Duration{}
	seen := map[bpfclamp.Conn]uint32{}
	l.mu.Lock()
	for _, m := range ms {
		k := bpfclamp.Conn{Local: unmapPort(m.Local), Remote: unmapPort(m.Remote)}
		seen[k] = m.Token
		// T is the largest RTT among the subflows the scheduler sends on
		// and the mechanism manages: a backup subflow gets data only when
		// no active one exists (mptcp_subflow_get_send), so its RTT says
		// nothing about how long the active ones must keep their queue
		// (counted, a long backup detour would leave the default subflow
		// in effect uncapped).
		if c := l.conns[m.Token]; m.Backup || c == nil || c.subs[k] == nil {
			continue
		}
		rtt[m.Token] = max(rtt[m.Token], m.RTT)
	}
	for tok, t := range rtt {
		c := l.conns[tok]
		if c == nil || t <= 0 {
			continue
		}
		if d := t - c.t; d*8 > c.t || -d*8 > c.t {
			c.t = t
		}
		for k, sub := range c.subs {
			if tk, ok := seen[k]; ok && tk == tok {
				sub.measured = true
			}
			if sub.measured && sub.written != c.t {
				writes = append(writes, write{k, c.t, sub})
			}
		}
	}
	l.mu.Unlock()
	for _, w := range writes {
		if err := l.prog.lowat(w.k, l.value(w.t)); err != nil {
			// Tried again at the next round (written is unchanged).
			l.log.Warn("subflow lowat not rescaled", "local", w.k.Local, "remote", w.k.Remote, "rtt", w.t, "err", err)
			continue
		}
		l.mu.Lock()
		w.sub.written = w.t
		l.rewrites++
		l.mu.Unlock()
		l.log.Debug("subflow lowat rescaled", "local", w.k.Local, "remote", w.k.Remote, "rtt", w.t)
	}
}

// checkRefused reads whether the kernel refused the program's
// TCP_NOTSENT_LOWAT (a kernel whose bpf_setsockopt lacks it answers
// EINVAL or ENOPROTOOPT): one warning, and status says it.
func (l *subflowLowat) checkRefused() {
	r, err := l.prog.m.Refused()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refusal.note(l.log, r.Lowat, err)
}

// status is the mechanism for "mpdetour status".
func (l *subflowLowat) status() agent.LowatStatus {
	if !l.prog.ok() {
		st := agent.LowatStatus{State: "failed", Bytes: l.bytes, Error: l.prog.err, Default: l.dflt, Cgroup: cgroupName(l.prog.cgroup)}
		if l.ceil != 0 {
			st.Scale, st.Ceil = "rtt", l.ceil
		}
		return st
	}
	l.checkRefused()
	sets, err := l.prog.m.LowatSets()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := agent.LowatStatus{State: "active", Bytes: l.bytes, Refused: l.refusal.refused, Pairs: len(l.pairs), Sets: sets, Default: l.dflt, Cgroup: cgroupName(l.prog.cgroup)}
	if l.ceil != 0 {
		st.Scale, st.Ceil, st.Rewrites = "rtt", l.ceil, l.rewrites
	}
	if l.refusal.refused != "" {
		st.State = "refused"
	}
	if err != nil {
		st.Error = err.Error()
	}
	return st
}

// cgroupName is the cgroup the program attaches to as status and the log
// say it: bpf_cgroup's directory, or "cgroup v2 root" for "" (every
// process's MPTCP subflows run the program there; it acts on the agent's
// own managed subflows only).
func cgroupName(cg string) string {
	if cg == "" {
		return "cgroup v2 root"
	}
	return cg
}
