package design

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// Range is a closed interval of one dimension, sampled uniformly or, with
// Log, log-uniformly (uniform in the logarithm: as many points between
// 0.001 and 0.01 as between 0.1 and 1).
type Range struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
	Log bool    `json:"log,omitempty"`
}

// ParseRange reads "MIN:MAX" (or one number, a fixed value), e.g. "1:100",
// "0.1:2", "0", and "MIN:MAX:log" for a log-uniform range (MIN > 0). Both
// ends must be finite and MIN <= MAX.
func ParseRange(s string) (Range, error) {
	t := strings.TrimSpace(s)
	var log bool
	if rest, ok := strings.CutSuffix(t, ":log"); ok {
		t, log = rest, true
	}
	lo, hi, two := strings.Cut(t, ":")
	if !two {
		hi = lo
	}
	a, err := parseNum(lo)
	if err != nil {
		return Range{}, fmt.Errorf("range %q: %w", s, err)
	}
	b, err := parseNum(hi)
	if err != nil {
		return Range{}, fmt.Errorf("range %q: %w", s, err)
	}
	if a > b {
		return Range{}, fmt.Errorf("range %q: minimum above maximum", s)
	}
	if log && (a <= 0 || !two || a == b) {
		return Range{}, fmt.Errorf("range %q: a log range needs 0 < MIN < MAX", s)
	}
	return Range{Min: a, Max: b, Log: log}, nil
}

func parseNum(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, fmt.Errorf("want MIN:MAX with numbers, e.g. 1:100")
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s is not a finite number", s)
	}
	return v, nil
}

func (r Range) String() string {
	if r.Min == r.Max {
		return strconv.FormatFloat(r.Min, 'g', -1, 64)
	}
	s := strconv.FormatFloat(r.Min, 'g', -1, 64) + ":" + strconv.FormatFloat(r.Max, 'g', -1, 64)
	if r.Log {
		s += ":log"
	}
	return s
}

// at maps u in [0,1] into the range (through the logarithm for a log
// range), clamped to the range against rounding.
func (r Range) at(u float64) float64 {
	if r.Log {
		return min(r.Max, max(r.Min, math.Exp(math.Log(r.Min)+u*(math.Log(r.Max)-math.Log(r.Min)))))
	}
	return r.Min + u*(r.Max-r.Min)
}

// Space is what a design samples: every path has the same four
// dimensions with the same ranges.
type Space struct {
	Paths    int   `json:"paths"`
	Capacity Range `json:"capacity_mbps"` // bottleneck rate, Mbit/s
	RTT      Range `json:"rtt_ms"`        // round-trip propagation delay, ms
	Loss     Range `json:"loss_pct"`      // random loss per direction, %
	Buffer   Range `json:"buffer_bdp"`    // bottleneck queue, in bandwidth-delay products
}

// DefaultSpace is the space: capacity 1-100 Mbit/s, RTT 10-400 ms,
// loss 0-2 %, buffer 0.1-2 BDP per path.
func DefaultSpace(paths int) Space {
	return Space{Paths: paths, Capacity: Range{Min: 1, Max: 100}, RTT: Range{Min: 10, Max: 400}, Loss: Range{Min: 0, Max: 2}, Buffer: Range{Min: 0.1, Max: 2}}
}

// RealWorldSpace is the space whose loss is log-uniform over
// 0.001-2 % and whose capacity and RTT span what published broadband and
// mobile measurements report (docs/design.md, "The real-world space"):
// capacity 2-100 Mbit/s and RTT 10-300 ms, both log-uniform; buffer
// 0.1-2 BDP as in the default space.
func RealWorldSpace(paths int) Space {
	return Space{Paths: paths, Capacity: Range{2, 100, true}, RTT: Range{10, 300, true}, Loss: Range{0.001, 2, true}, Buffer: Range{0.1, 2, false}}
}

// Spaces are the named spaces of --space.
var Spaces = map[string]func(paths int) Space{"default": DefaultSpace, "realworld": RealWorldSpace}

// Limits of a space (the lab's: detours 1..8 means 2..9 paths; rates the
// tbf takes; delays up to the lab's 10 s one way).
const (
	MaxPaths = 9
)

// Validate checks the space against what the lab can build.
func (s Space) Validate() error {
	if s.Paths < 2 || s.Paths > MaxPaths {
		return fmt.Errorf("paths: %d, want 2..%d", s.Paths, MaxPaths)
	}
	for _, c := range []struct {
		name   string
		r      Range
		lo, hi float64
	}{
		{"capacity", s.Capacity, 0.01, 10000},
		{"rtt", s.RTT, 0, 10000},
		{"loss", s.Loss, 0, 100},
		{"buffer", s.Buffer, 0, 1000},
	} {
		if c.r.Min < c.lo || c.r.Max > c.hi || c.r.Min > c.r.Max {
			return fmt.Errorf("%s range %s outside %g:%g", c.name, c.r, c.lo, c.hi)
		}
		if c.r.Log && c.r.Min <= 0 {
			return fmt.Errorf("%s range %s: a log range needs MIN > 0", c.name, c.r)
		}
	}
	return nil
}

// Dimensions names the design's dimensions in order: capacity1, rtt1,
// loss1, buffer1, capacity2, ...
func (s Space) Dimensions() []string {
	var d []string
	for p := 1; p <= s.Paths; p++ {
		for _, k := range dimKinds {
			d = append(d, fmt.Sprintf("%s%d", k, p))
		}
	}
	return d
}

var dimKinds = []string{"capacity", "rtt", "loss", "buffer"}

// Path holds one path's conditions at a design point.
type Path struct {
	CapacityMbps float64 `json:"capacity_mbps"`
	RTTms        float64 `json:"rtt_ms"`
	LossPct      float64 `json:"loss_pct"`
	BufferBDP    float64 `json:"buffer_bdp"`
}

// BDPBytes is the path's bandwidth-delay product.
func (p Path) BDPBytes() float64 { return p.CapacityMbps * 1e6 / 8 * p.RTTms / 1000 }

// frameBytes is what the lab's tbf counts per full-size packet (see
// internal/lab: queue limits in packets are converted with it).
const frameBytes = 1514

// MinQueue is the smallest bottleneck queue a point gets, in packets: tbf
// needs room for its 2-frame bucket, and below that a tiny-BDP point would
// be a link that drops every burst.
const MinQueue = 2

// QueuePackets is the path's bottleneck buffer in full-size packets:
// buffer × BDP / 1514 bytes, at least MinQueue.
func (p Path) QueuePackets() int {
	return max(MinQueue, int(math.Round(p.BufferBDP*p.BDPBytes()/frameBytes)))
}

// Point is one design point.
type Point struct {
	ID    string `json:"id"`
	Paths []Path `json:"paths"`
	// Unit is the point in the unit cube, in Space.Dimensions order.
	Unit []float64 `json:"unit"`
}

// BDP classes.
const (
	LowBDP  = "low"
	HighBDP = "high"
)

// DefaultLowBDP is the low-BDP bound in bytes: 100 Mbit/s × 50 ms, the
// largest bandwidth-delay product of the CoNEXT 2013 low-BDP design
// (capacity up to 100 Mbit/s, RTT up to 50 ms).
const DefaultLowBDP = 625000

// Class is LowBDP when every path's BDP is at most bound bytes.
func (pt Point) Class(bound float64) string {
	for _, p := range pt.Paths {
		if p.BDPBytes() > bound {
			return HighBDP
		}
	}
	return LowBDP
}

// Points scales a unit-cube design into the space, rounding every value to
// what the lab sets (capacity to 1 kbit/s, RTT to 2 µs, loss to 0.001 %,
// buffer to 0.001 BDP) so that the rows show exactly what ran.
func (s Space) Points(unit [][]float64) []Point {
	pts := make([]Point, len(unit))
	for i, u := range unit {
		pt := Point{ID: fmt.Sprintf("p%03d", i+1), Unit: u}
		for p := 0; p < s.Paths; p++ {
			v := u[4*p : 4*p+4]
			pt.Paths = append(pt.Paths, Path{
				CapacityMbps: round(s.Capacity.at(v[0]), 1e3),
				RTTms:        round(s.RTT.at(v[1]), 500),
				LossPct:      round(s.Loss.at(v[2]), 1e3),
				BufferBDP:    round(s.Buffer.at(v[3]), 1e3),
			})
		}
		pts[i] = pt
	}
	return pts
}

func round(v, scale float64) float64 { return math.Round(v*scale) / scale }

// Topology is the lab topology points run on: `detours` with one detour
// per path beyond the first.
const Topology = "detours"

// BaseSet are the lab parameters every point of an n-path space shares:
// n-1 detours, and access and egress links neither shaped nor delayed, so
// that each path's only emulated link is its core link (C0 for path 1,
// C1 for path 2, ...).
func BaseSet(paths int) scenario.Params {
	return scenario.Params{
		{Key: "detours", Value: strconv.Itoa(paths - 1)},
		{Key: "access.rate", Value: "0"}, {Key: "access.delay", Value: "0"},
		{Key: "egress.rate", Value: "0"}, {Key: "egress.delay", Value: "0"},
	}
}

// Set returns the lab parameters of the point: per path i (link C(i-1)),
// rate = capacity, one-way delay = RTT/2 in both directions, loss in both
// directions, queue = QueuePackets (the tbf limit, the only buffer on the
// path: the delay line holds at least 1024 frames and drops none at these
// rates).
func (pt Point) Set() scenario.Params {
	var ps scenario.Params
	for i, p := range pt.Paths {
		l := fmt.Sprintf("C%d.", i)
		ps = append(ps,
			scenario.Param{Key: l + "rate", Value: fmt.Sprintf("%dkbit", int64(math.Round(p.CapacityMbps*1e3)))},
			scenario.Param{Key: l + "delay", Value: fmt.Sprintf("%dus", int64(math.Round(p.RTTms*500)))},
			scenario.Param{Key: l + "loss", Value: strconv.FormatFloat(p.LossPct, 'f', -1, 64) + "%"},
			scenario.Param{Key: l + "queue", Value: strconv.Itoa(p.QueuePackets())},
		)
	}
	return ps
}

// Params returns the point's parameters as the flat map rows carry:
// capacity1_mbps, rtt1_ms, loss1_pct, buffer1_bdp, queue1_pkts, bdp1_bytes, ...
func (pt Point) Params() map[string]float64 {
	m := map[string]float64{}
	for i, p := range pt.Paths {
		n := strconv.Itoa(i + 1)
		m["capacity"+n+"_mbps"] = p.CapacityMbps
		m["rtt"+n+"_ms"] = p.RTTms
		m["loss"+n+"_pct"] = p.LossPct
		m["buffer"+n+"_bdp"] = p.BufferBDP
		m["queue"+n+"_pkts"] = float64(p.QueuePackets())
		m["bdp"+n+"_bytes"] = math.Round(p.BDPBytes())
	}
	return m
}
