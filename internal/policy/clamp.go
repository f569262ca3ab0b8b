package policy

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Cwnd clamps for tunnel detour subflows (issue 26 item 3).
//
// A subflow through a tunnel detour leaves the host through a TUN device
// whose driver orphans every packet it queues, so TCP small queues never
// hold the subflow back: its window grows into the tunnel interface's
// queue (500 packets by default) and wireguard-go's socket buffer, where
// it waits 60-75 ms on top of the path's 61 ms in the lab
// (docs/results/tunnel-shared). The kernel's MPTCP scheduler then sees a
// slow subflow it keeps filling, and the default subflow gets less.
//
// The rule: a tunnel subflow's cwnd is clamped to
//
//	ceil(ClampGain x its largest delivery rate x its minimum RTT / its largest MSS)
//
// segments, never below ClampFloor: its own bandwidth-delay product, from
// the kernel's measurements of that subflow (tcp_info, every probe
// interval), with the headroom BBR probes with (gain 1.25), so that it can
// still find more bandwidth (a higher delivery rate raises the clamp) but
// never keeps more than a quarter of its minimum RTT queued at the rate it
// has reached. A pair gets its first clamp only once the subflow's smoothed
// RTT exceeds ClampGain x its minimum RTT: a queue longer than the rule
// allows has built, so the window, not the path, sets the subflow's delay,
// and its delivery rate is what the path gives it (in slow start, before
// any queue, the rate is still climbing and a clamp from it would hold the
// subflow back). No constant of the rule comes from the lab topology.
//
// Clamps are per (local address, remote address) pair, as the BPF program
// (internal/bpfclamp) keys them; a pair keeps its clamp while the agent
// runs, and later subflows on the same pair start with it.
const (
	ClampGain  = 1.25
	ClampFloor = 10 // segments: the initial window (RFC 6928)
)

// Clamp is one decision: clamp subflows between Local and Remote to
// Segments (cwnd, in segments).
type Clamp struct {
	Local, Remote netip.Addr
	Segments      uint32
	// Reason says which measurements set it.
	Reason string
}

// ClampPair is a pair's state, for status.
type ClampPair struct {
	Local    netip.Addr    `json:"local"`
	Remote   netip.Addr    `json:"remote"`
	Path     string        `json:"path"`
	Segments uint32        `json:"segments"`
	MaxRate  float64       `json:"max_rate"` // bytes/s
	MinRTT   time.Duration `json:"min_rtt"`
	MSS      uint32        `json:"mss"`
	Note     string        `json:"note,omitempty"`
}

// ClampStatus is the clamp mechanism as status shows it.
type ClampStatus struct {
	// State is "off" (not configured), "active" or "failed" (the BPF
	// program could not be loaded or attached: the policy runs without
	// clamps; Error says why).
	State string      `json:"state"`
	Error string      `json:"error,omitempty"`
	Pairs []ClampPair `json:"pairs,omitempty"`
}

type clampPair struct {
	ClampPair
	set uint32 // the clamp last decided (0 = none yet)
}

// Clamps decides the cwnd clamps of tunnel subflows from their
// measurements. Calls come from one goroutine (the agent's loop).
type Clamps struct {
	mu      sync.Mutex // Pairs is called from status requests
	sources []detour.Source
	pairs   map[[2]netip.Addr]*clampPair
}

// NewClamps decides clamps for subflows through the tunnel detours that
// sources offer.
func NewClamps(sources []detour.Source) *Clamps {
	return &Clamps{sources: sources, pairs: map[[2]netip.Addr]*clampPair{}}
}

// Decide takes one round of measurements and returns the clamps that
// changed: new pairs, and pairs whose rule gives a value more than an
// eighth away from the one last decided (each change resets the subflow's
// ssthresh to the clamp, so small moves are not worth one).
func (c *Clamps) Decide(ms []Measurement) []Clamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Clamp
	for _, m := range ms {
		d, ok := c.tunnel(m.Local.Addr(), m.Remote)
		if !ok {
			continue
		}
		k := [2]netip.Addr{m.Local.Addr().Unmap(), m.Remote.Addr().Unmap()}
		p := c.pairs[k]
		if p == nil {
			p = &clampPair{ClampPair: ClampPair{Local: k[0], Remote: k[1], Path: PathName(&d, "")}}
			c.pairs[k] = p
		}
		if m.DeliveryRate > 0 && !m.AppLimited {
			p.MaxRate = max(p.MaxRate, float64(m.DeliveryRate))
		}
		if m.MinRTT > 0 && (p.MinRTT == 0 || m.MinRTT < p.MinRTT) {
			p.MinRTT = m.MinRTT
		}
		// The largest MSS seen: a sample taken while the path MTU is
		// probed (536-byte segments) must not inflate the clamp.
		p.MSS = max(p.MSS, m.SndMSS)
		segs, ok := ClampSegments(p.MaxRate, p.MinRTT, p.MSS)
		if !ok {
			p.Note = "waiting for a delivery rate, minimum RTT and MSS"
			continue
		}
		if p.set == 0 && float64(m.RTT) <= ClampGain*float64(p.MinRTT) {
			p.Note = fmt.Sprintf("no queue yet: smoothed RTT %s within %.2f x min RTT", m.RTT, ClampGain)
			continue
		}
		p.Note = ""
		if s, set := uint64(segs)*8, uint64(p.set); set != 0 && s <= set*9 && s >= set*7 {
			continue
		}
		p.set, p.Segments = segs, segs
		out = append(out, Clamp{Local: k[0], Remote: k[1], Segments: segs,
			Reason: fmt.Sprintf("%s: %.2f x %.2f Mbit/s x min RTT %s / MSS %d", p.Path, ClampGain, p.MaxRate*8/1e6, p.MinRTT, p.MSS)})
	}
	return out
}

// ClampSegments is the rule: ceil(ClampGain x rate x minRTT / mss)
// segments, at least ClampFloor; ok is false until all three are known.
func ClampSegments(rate float64, minRTT time.Duration, mss uint32) (uint32, bool) {
	if rate <= 0 || minRTT <= 0 || mss == 0 {
		return 0, false
	}
	segs := math.Ceil(ClampGain * rate * minRTT.Seconds() / float64(mss))
	return uint32(min(max(segs, ClampFloor), math.MaxInt32)), true
}

// tunnel finds the tunnel detour a subflow goes through.
func (c *Clamps) tunnel(local netip.Addr, remote netip.AddrPort) (detour.Detour, bool) {
	var ds []detour.Detour
	for _, s := range c.sources {
		ds = append(ds, s.Detours(remote)...)
	}
	d, ok := Match(ds, local, remote)
	return d, ok && d.Kind == detour.Tunnel
}

// Pairs lists the pairs seen, for status.
func (c *Clamps) Pairs() []ClampPair {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ClampPair, 0, len(c.pairs))
	for _, p := range c.pairs {
		out = append(out, p.ClampPair)
	}
	slices.SortFunc(out, func(a, b ClampPair) int {
		if r := a.Local.Compare(b.Local); r != 0 {
			return r
		}
		return a.Remote.Compare(b.Remote)
	})
	return out
}
