package policy

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
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
// The pacing mode caps the subflow's pacing rate instead (or as well):
//
//	ClampGain x its largest delivery rate, at least ClampFloor x MSS / min RTT
//
// under the same trigger: the rate that clamp's window gives at the
// minimum RTT, as a maximum pacing rate (SO_MAX_PACING_RATE, which also
// switches on TCP's internal pacing of that subflow). A cwnd clamp bounds
// how much the subflow keeps in flight; a pacing rate bounds how fast it
// sends, spreading its packets instead of sending each window in a burst
// into the tunnel's queue.
//
// Clamps are per (local address, remote address) pair, as the BPF program
// (internal/bpfclamp) keys them; a pair keeps its clamp while the agent
// runs, and later subflows on the same pair start with it.
const (
	ClampGain  = 1.25
	ClampFloor = 10 // segments: the initial window (RFC 6928)
	// MaxPacingRate is the largest rate the BPF program can set
	// (SO_MAX_PACING_RATE from BPF is 32 bits, ~0 = unlimited).
	MaxPacingRate = 1<<32 - 2
)

// ClampMode says what the clamp of a tunnel subflow limits.
type ClampMode string

const (
	ClampCwnd   ClampMode = "cwnd"   // the congestion window (the default)
	ClampPacing ClampMode = "pacing" // the maximum pacing rate
	ClampBoth   ClampMode = "both"   // both
)

// ParseClampMode checks a configured mode ("" = cwnd).
func ParseClampMode(s string) (ClampMode, error) {
	switch m := ClampMode(s); m {
	case "":
		return ClampCwnd, nil
	case ClampCwnd, ClampPacing, ClampBoth:
		return m, nil
	}
	return "", fmt.Errorf("%q is not a clamp mode (cwnd, pacing or both)", s)
}

func (m ClampMode) cwnd() bool   { return m == ClampCwnd || m == ClampBoth }
func (m ClampMode) pacing() bool { return m == ClampPacing || m == ClampBoth }

// Clamp is one decision: limit subflows between Local and Remote to
// Segments (cwnd, in segments; 0 = no cwnd clamp) and PacingRate
// (maximum pacing rate, bytes/s; 0 = none).
type Clamp struct {
	Local, Remote netip.Addr
	Segments      uint32
	PacingRate    uint64
	// Reason says which measurements set it.
	Reason string
}

// ClampPair is a pair's state, for status.
type ClampPair struct {
	Local    netip.Addr `json:"local"`
	Remote   netip.Addr `json:"remote"`
	Path     string     `json:"path"`
	Segments uint32     `json:"segments"`
	// PacingRate is the maximum pacing rate decided (bytes/s, 0 = none).
	PacingRate uint64        `json:"pacing_rate,omitempty"`
	MaxRate    float64       `json:"max_rate"` // bytes/s
	MinRTT     time.Duration `json:"min_rtt"`
	MSS        uint32        `json:"mss"`
	Note       string        `json:"note,omitempty"`
}

// ClampStatus is the clamp mechanism as status shows it.
type ClampStatus struct {
	// State is "off" (not configured), "active" or "failed" (the BPF
	// program could not be loaded or attached: the policy runs without
	// clamps; Error says why).
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Mode is what the clamps limit (cwnd, pacing or both): the mode
	// configured, or cwnd after a fallback.
	Mode ClampMode `json:"mode,omitempty"`
	// Fallback says why Mode is not the mode configured.
	Fallback string `json:"fallback,omitempty"`
	// Refused says that the kernel refused the program's cwnd clamps
	// (TCP_BPF_SNDCWND_CLAMP) and with which error: they are not in
	// effect although Pairs lists them.
	Refused string      `json:"refused,omitempty"`
	Pairs   []ClampPair `json:"pairs,omitempty"`
}

type clampPair struct {
	ClampPair
	decided bool // a clamp was decided for this pair
}

// Clamps decides the clamps of tunnel subflows from their measurements.
// Calls come from one goroutine (the agent's loop).
type Clamps struct {
	mu      sync.Mutex // Pairs is called from status requests
	sources []detour.Source
	mode    ClampMode
	pairs   map[[2]netip.Addr]*clampPair
}

// NewClamps decides clamps of kind mode for subflows through the tunnel
// detours that sources offer.
func NewClamps(sources []detour.Source, mode ClampMode) *Clamps {
	return &Clamps{sources: sources, mode: mode, pairs: map[[2]netip.Addr]*clampPair{}}
}

// Mode is what the clamps limit now.
func (c *Clamps) Mode() ClampMode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mode
}

// SetMode changes what the clamps limit (a fallback: the kernel refused a
// pacing rate); the next Decide gives every pair that had a clamp its
// clamp of the new mode.
func (c *Clamps) SetMode(m ClampMode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m == c.mode {
		return
	}
	c.mode = m
	for _, p := range c.pairs {
		p.Segments, p.PacingRate = 0, 0 // differ from what the new mode decides
	}
}

// Decide takes one round of measurements and returns the clamps that
// changed: new pairs, and pairs whose rule gives a value more than an
// eighth away from the one last decided (each change of a cwnd clamp
// resets the subflow's ssthresh to the clamp, so small moves are not
// worth one).
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
		if !p.decided && float64(m.RTT) <= ClampGain*float64(p.MinRTT) {
			p.Note = fmt.Sprintf("no queue yet: smoothed RTT %s within %.2f x min RTT", m.RTT, ClampGain)
			continue
		}
		p.Note = ""
		var rate uint64
		if !c.mode.cwnd() {
			segs = 0
		}
		if c.mode.pacing() {
			rate, _ = ClampPacingRate(p.MaxRate, p.MinRTT, p.MSS)
		}
		if p.decided && nearby(uint64(segs), uint64(p.Segments)) && nearby(rate, p.PacingRate) {
			continue
		}
		p.decided, p.Segments, p.PacingRate = true, segs, rate
		out = append(out, Clamp{Local: k[0], Remote: k[1], Segments: segs, PacingRate: rate, Reason: c.reason(p)})
	}
	return out
}

// reason is the rule behind p's clamp in the mode's terms: the cwnd's
// bandwidth-delay product, the pacing rate's delivery rate, or both.
func (c *Clamps) reason(p *clampPair) string {
	var r []string
	if c.mode.cwnd() {
		r = append(r, fmt.Sprintf("cwnd %.2f x %.2f Mbit/s x min RTT %s / MSS %d", ClampGain, p.MaxRate*8/1e6, p.MinRTT, p.MSS))
	}
	if c.mode.pacing() {
		r = append(r, fmt.Sprintf("pacing rate %.2f x %.2f Mbit/s", ClampGain, p.MaxRate*8/1e6))
	}
	return p.Path + ": " + strings.Join(r, "; ")
}

// nearby says whether v is within an eighth of was (both 0: yes).
func nearby(v, was uint64) bool {
	if was == 0 || v == 0 {
		return v == was
	}
	// In float: the values go up to 2^32, an eighth's product in
	// integers would too.
	return math.Abs(float64(v)-float64(was)) <= float64(was)/8
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

// ClampPacingRate is the pacing rule: ceil(ClampGain x rate) bytes/s, at
// least ClampFloor segments of mss per minRTT, at most MaxPacingRate; ok
// is false until rate, minRTT and mss are known.
func ClampPacingRate(rate float64, minRTT time.Duration, mss uint32) (uint64, bool) {
	if rate <= 0 || minRTT <= 0 || mss == 0 {
		return 0, false
	}
	r := max(math.Ceil(ClampGain*rate), math.Ceil(ClampFloor*float64(mss)/minRTT.Seconds()))
	return uint64(min(r, MaxPacingRate)), true
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
