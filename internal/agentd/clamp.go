package agentd

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/netnsx"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

// clampMap is where limits go: the BPF program's map (bpfclamp.Clamper),
// or a fake in tests.
type clampMap interface {
	Set(k bpfclamp.Key, l bpfclamp.Limits) error
	Delete(k bpfclamp.Key) error
	// SetLowatScaled writes a subflow's lowat (fixed: Ceil or MaxRTT 0).
	SetLowatScaled(k bpfclamp.Conn, l bpfclamp.Lowat) error
	DeleteLowat(k bpfclamp.Conn) error
	// Refused reports what the kernel refused the program.
	Refused() (bpfclamp.Refusals, error)
	// LowatSets counts the program's TCP_NOTSENT_LOWAT settings.
	LowatSets() (uint64, error)
	Close() error
}

// bpfProgram is the agent's one BPF sock_ops program, shared by
// cwnd_clamp and subflow_lowat: one attach. It keeps each address pair's
// cwnd and pacing limits and writes them together (a map entry holds all
// of a pair's limits), deleting the entry when none is left; the lowat
// has a map of its own, keyed by the subflow's 4-tuple (lowat).
type bpfProgram struct {
	mu     sync.Mutex
	m      clampMap // nil: failed
	err    string
	limits map[bpfclamp.Key]bpfclamp.Limits
	// cgroup is where it attaches: bpf_cgroup (or cwnd_clamp.cgroup);
	// "" = the cgroup v2 root (status says which).
	cgroup string
}

// openBPF attaches the program to cgroup through attach (attachClamp
// outside tests); a failure is kept for the mechanisms to report (each
// says once that it is off) and the agent runs without them.
func openBPF(cgroup string, attach func(string) (clampMap, error)) *bpfProgram {
	b := &bpfProgram{limits: map[bpfclamp.Key]bpfclamp.Limits{}, cgroup: cgroup}
	m, err := attach(cgroup)
	if err != nil {
		b.err = err.Error()
		if errors.Is(err, unix.EPERM) {
			// cilium/ebpf's hint (MEMLOCK) does not apply: the kernel
			// accounts BPF memory to the cgroup since 5.11.
			b.err = "needs CAP_BPF and CAP_NET_ADMIN (the deploy unit grants both): " + b.err
		} else if strings.Contains(b.err, "cannot use helper") {
			// bpf_skc_to_mptcp_sock is offered only with CAP_PERFMON.
			b.err = "needs CAP_PERFMON (the deploy unit grants it) or a kernel with bpf_skc_to_mptcp_sock (5.19+): " + b.err
		}
		return b
	}
	b.m = m
	return b
}

// ok says whether the program is attached.
func (b *bpfProgram) ok() bool { return b.m != nil }

// change applies fn to the pair's limits and writes the result.
func (b *bpfProgram) change(k bpfclamp.Key, fn func(*bpfclamp.Limits)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		return errors.New(b.err)
	}
	l := b.limits[k]
	fn(&l)
	if l == (bpfclamp.Limits{}) {
		delete(b.limits, k)
		return b.m.Delete(k)
	}
	if err := b.m.Set(k, l); err != nil {
		return err
	}
	b.limits[k] = l
	return nil
}

// lowat writes a subflow's notsent lowat (l.Floor > 0) or deletes it
// (the zero Lowat).
func (b *bpfProgram) lowat(k bpfclamp.Conn, l bpfclamp.Lowat) error {
	if b.m == nil {
		return errors.New(b.err)
	}
	if l.Floor == 0 {
		return b.m.DeleteLowat(k)
	}
	return b.m.SetLowatScaled(k, l)
}

// close detaches the program (the kernel also does when the agent dies:
// the BPF link goes with its last file descriptor).
func (b *bpfProgram) close() error {
	if b.m == nil {
		return nil
	}
	if err := b.m.Close(); err != nil {
		return fmt.Errorf("BPF program: %w", err)
	}
	return nil
}

// attachClamp loads and attaches the BPF program to the cgroup v2
// directory cgroup ("" = the cgroup v2 mount's root); its lowats are
// keyed in namespace netns (a netnsx spec: the agent's, whose subflows
// it reports), since the program sees every namespace's sockets of the
// cgroup and a 4-tuple may exist in several.
func attachClamp(cgroup, netns string, o bpfclamp.Options) (clampMap, error) {
	if cgroup == "" {
		var err error
		if cgroup, err = bpfclamp.Cgroup2Root(); err != nil {
			return nil, err
		}
	}
	var cookie uint64
	if err := netnsx.Do(netns, func() (err error) { cookie, err = bpfclamp.NetnsCookie(); return err }); err != nil {
		return nil, err
	}
	c, err := bpfclamp.Attach(cgroup, o)
	if err != nil {
		return nil, err
	}
	return nsClamper{c, cookie}, nil
}

// nsClamper is the program with its lowats keyed in one namespace.
type nsClamper struct {
	*bpfclamp.Clamper
	netns uint64
}

func (c nsClamper) SetLowatScaled(k bpfclamp.Conn, l bpfclamp.Lowat) error {
	k.Netns = c.netns
	return c.Clamper.SetLowatScaled(k, l)
}

func (c nsClamper) DeleteLowat(k bpfclamp.Conn) error {
	k.Netns = c.netns
	return c.Clamper.DeleteLowat(k)
}

// cwndClamps runs the cwnd_clamp mechanism: the policy's clamp decisions
// (policy.Clamps) from every round of measurements, written into the BPF
// program's map. A program that cannot be loaded or attached leaves the
// agent running without clamps, said once in the log and in status; a
// kernel that refuses the program's pacing rates (SO_MAX_PACING_RATE from
// BPF) turns the pacing and both modes into cwnd clamps, likewise.
type cwndClamps struct {
	log      *slog.Logger
	decide   *policy.Clamps
	prog     *bpfProgram
	mu       sync.Mutex // fallback is read by status requests
	fallback string     // why the mode is cwnd although pacing was configured
	// unread: the refusal map could not be read (warned once).
	unread bool
	// refused: the kernel refused cwnd clamps (warned once, in status).
	refused string
}

// startClamps writes the clamps through prog (openBPF).
func startClamps(s ClampSettings, sources []detour.Source, log *slog.Logger, prog *bpfProgram) *cwndClamps {
	if s.Mode == "" {
		s.Mode = policy.ClampCwnd
	}
	c := &cwndClamps{log: log, decide: policy.NewClamps(sources, s.Mode), prog: prog}
	if !prog.ok() {
		log.Warn("cwnd clamps off: the BPF program could not be loaded or attached; running without them", "err", prog.err)
		return c
	}
	log.Info("cwnd clamps on: tunnel subflows are limited to 1.25 x their measured bandwidth-delay product (cwnd) or delivery rate (pacing)", "mode", s.Mode)
	return c
}

// measured decides and applies the clamps of one round of measurements
// (agent.Options.OnMeasured).
func (c *cwndClamps) measured(ms []policy.Measurement) {
	if !c.prog.ok() {
		return
	}
	c.checkRefusals()
	for _, cl := range c.decide.Decide(ms) {
		err := c.prog.change(bpfclamp.Key{Local: cl.Local, Remote: cl.Remote}, func(l *bpfclamp.Limits) {
			l.CwndSegments, l.PacingRate = cl.Segments, cl.PacingRate
		})
		if err != nil {
			c.log.Warn("cwnd clamp not set", "local", cl.Local, "remote", cl.Remote, "err", err)
			continue
		}
		c.log.Info("clamp", "local", cl.Local, "remote", cl.Remote, "segments", cl.Segments, "pacing_rate", cl.PacingRate, "rule", cl.Reason)
	}
}

// checkRefusals reads what the kernel refused the program. A refused
// pacing rate turns the pacing and both modes into cwnd clamps; a refused
// cwnd clamp cannot fall back to anything: each is one warning, and
// status says it.
func (c *cwndClamps) checkRefusals() {
	r, err := c.prog.m.Refused()
	if err != nil {
		if !c.unread {
			c.unread = true
			c.log.Warn("cwnd clamps: the kernel's refusals cannot be read; a refused clamp would not be shown, a refused pacing rate would not fall back to cwnd clamps", "err", err)
		}
		return
	}
	if r.Cwnd != 0 && c.refused == "" {
		c.mu.Lock()
		c.refused = fmt.Sprintf("the kernel refused TCP_BPF_SNDCWND_CLAMP from BPF (%v): cwnd clamps are not in effect", r.Cwnd)
		c.mu.Unlock()
		if c.decide.Mode() == policy.ClampBoth && r.Pacing == 0 {
			// The program sets the pacing rate after a refused cwnd clamp.
			c.log.Warn("cwnd clamps refused by the kernel: tunnel subflows keep only their pacing-rate clamps", "err", r.Cwnd)
		} else {
			c.log.Warn("cwnd clamps refused by the kernel: tunnel subflows run unclamped", "err", r.Cwnd)
		}
	}
	if r.Pacing == 0 || c.decide.Mode() == policy.ClampCwnd {
		return
	}
	c.mu.Lock()
	c.fallback = fmt.Sprintf("the kernel refused SO_MAX_PACING_RATE from BPF (%v): cwnd clamps instead", r.Pacing)
	c.mu.Unlock()
	c.log.Warn("pacing clamps off: the kernel refused SO_MAX_PACING_RATE from BPF; cwnd clamps instead", "mode", c.decide.Mode(), "err", r.Pacing)
	c.decide.SetMode(policy.ClampCwnd)
}

// status is the mechanism for "mpdetour status".
func (c *cwndClamps) status() policy.ClampStatus {
	if !c.prog.ok() {
		return policy.ClampStatus{State: "failed", Error: c.prog.err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return policy.ClampStatus{State: "active", Mode: c.decide.Mode(), Fallback: c.fallback, Refused: c.refused, Pairs: c.decide.Pairs()}
}
