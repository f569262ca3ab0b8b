// Package topology is the lab's network model: nodes, links with their
// per-direction shapes (rate, delay, loss, queue), routes and sysctls; the
// YAML topology files, the built-in generators (brennan2017, triangle,
// detours) and "--set" overrides. It only describes networks; package lab
// builds them in namespaces (docs/lab.md).
package topology

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Topology is a lab description: nodes, links between them and static
// routes. It is pure data until Up builds it; LoadFile, Builtin and Set
// produce one and Validate checks it.
type Topology struct {
	// Name is the topology's name ("brennan2017", or the file's name: field).
	Name  string
	Nodes []*Node
	Links []*Link

	// Source names where the topology came from ("lab/x.yaml",
	// "builtin:detours") so that errors point at it.
	Source string

	builtin *builtin          // non-nil for built-ins: parameters regenerate the topology
	params  map[string]string // built-in parameters set so far
	sets    [][2]string       // per-link overrides, replayed when a parameter changes
}

// Node is a host or router: one network namespace.
type Node struct {
	Name string
	// Forward enables IPv4 forwarding (routers).
	Forward bool
	// Sysctls are written under /proc/sys inside the node's namespace
	// (keys like "net.ipv4.tcp_congestion_control"; only net.* keys are
	// namespaced, so only those are accepted).
	Sysctls []Sysctl
	Routes  []Route
	pos     pos
}

// Sysctl is one key=value written when the node is created.
type Sysctl struct {
	Key, Value string
	pos        pos
}

// Route is a static IPv4 route in a node.
type Route struct {
	Dst netip.Prefix // 0.0.0.0/0 for "default"
	Via netip.Addr
	// Src, if set, is the preferred source address of the route (one of
	// the node's addresses; built-in topologies only: the rack's servers
	// reach their neighbours with their primary address as source).
	Src netip.Addr
	pos pos
}

// Link is a point-to-point link between two nodes (a veth pair).
type Link struct {
	// Name is also the interface name on both endpoints, so it must be a
	// valid interface name (at most 15 characters).
	Name string
	// Class groups links for --set (e.g. "core", "access"); optional.
	Class string
	A, B  End
	// AB shapes traffic from A to B, BA from B to A.
	AB, BA Shape
	pos    pos
	// endPos locates the a:/b: fields, addrPos the address fields.
	endPos, addrPos [2]pos
}

// End is one endpoint of a link.
type End struct {
	Node string
	Addr netip.Prefix // address with the link's prefix length, e.g. 10.0.1.1/24
}

// Shape is the emulation of one direction of a link. The zero value is an
// unshaped, undelayed, lossless link with the default queue.
type Shape struct {
	Rate  Rate          // 0 = unlimited
	Delay time.Duration // one-way
	Loss  Loss
	Queue int // tail-drop queue limit in packets; 0 = DefaultQueue
}

// DefaultQueue is the queue limit in packets when a link does not set one.
// 100 full-size packets hold more than half the bandwidth-delay product of
// the reference's slowest case (10 Mbit/s, 220 ms RTT), which is what CUBIC
// needs to keep a tail-drop bottleneck busy.
const DefaultQueue = 100

// Emulated reports whether the direction needs any emulation at all.
func (s Shape) Emulated() bool { return s.Rate > 0 || s.Delay > 0 || s.Loss > 0 }

// QueueLimit returns the queue limit in packets, with the default applied.
func (s Shape) QueueLimit() int {
	if s.Queue > 0 {
		return s.Queue
	}
	return DefaultQueue
}

// Rate is a link rate in bits per second.
type Rate uint64

func (r Rate) String() string {
	switch {
	case r == 0:
		return "unlimited"
	case r%1_000_000_000 == 0:
		return fmt.Sprintf("%dgbit", r/1_000_000_000)
	case r%1_000_000 == 0:
		return fmt.Sprintf("%dmbit", r/1_000_000)
	case r%1000 == 0:
		return fmt.Sprintf("%dkbit", r/1000)
	}
	return fmt.Sprintf("%dbit", uint64(r))
}

// Mbit returns the rate in Mbit/s.
func (r Rate) Mbit() float64 { return float64(r) / 1e6 }

var rateRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z/]*)$`)

// ParseRate parses tc-style bit rates: "10mbit", "20Mbit/s", "500kbit",
// "1gbit", "0" (unlimited). Byte-based units such as "mbps" are refused
// because tc and everyday usage disagree on what they mean.
func ParseRate(s string) (Rate, error) {
	m := rateRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("bad rate %q: want a number and a unit, e.g. 10mbit", s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("bad rate %q: %v", s, err)
	}
	unit := strings.TrimSuffix(strings.ToLower(m[2]), "/s")
	var mult float64
	switch unit {
	case "":
		if v != 0 {
			return 0, fmt.Errorf("bad rate %q: missing unit (bit, kbit, mbit, gbit)", s)
		}
		return 0, nil
	case "bit":
		mult = 1
	case "kbit":
		mult = 1e3
	case "mbit":
		mult = 1e6
	case "gbit":
		mult = 1e9
	default:
		return 0, fmt.Errorf("bad rate %q: unknown unit %q (use bit, kbit, mbit or gbit)", s, m[2])
	}
	bits := v * mult
	if bits > 100e9 {
		return 0, fmt.Errorf("bad rate %q: above 100gbit", s)
	}
	if bits != 0 && bits < 8000 {
		return 0, fmt.Errorf("bad rate %q: below 8kbit", s)
	}
	return Rate(math.Round(bits)), nil
}

// MaxDelay bounds one-way delays: beyond it a typo ("100s") is likelier
// than an experiment, and the delay line would have to hold gigabytes.
const MaxDelay = 10 * time.Second

// ParseDelay parses a one-way delay as a Go duration ("5ms", "100ms", "0").
func ParseDelay(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad delay %q: want a duration such as 5ms", s)
	}
	if d < 0 || d > MaxDelay {
		return 0, fmt.Errorf("bad delay %q: must be between 0 and %v", s, MaxDelay)
	}
	return d, nil
}

// Loss is a packet loss probability in [0, 1].
type Loss float64

func (l Loss) String() string { return strconv.FormatFloat(float64(l)*100, 'g', -1, 64) + "%" }

// ParseLoss parses a loss percentage: "1%", "0.5%", "0". A bare non-zero
// number is refused: "1" could mean 1% or 100%.
func ParseLoss(s string) (Loss, error) {
	s = strings.TrimSpace(s)
	num, pct := strings.CutSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("bad loss %q: want a percentage such as 1%%", s)
	}
	if !pct && v != 0 {
		return 0, fmt.Errorf("bad loss %q: missing %% sign", s)
	}
	if v < 0 || v > 100 {
		return 0, fmt.Errorf("bad loss %q: must be between 0%% and 100%%", s)
	}
	return Loss(v / 100), nil
}

// ParseQueue parses a queue limit in packets ("100", "100p").
func ParseQueue(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "p"))
	if err != nil || n < 1 || n > 100000 {
		return 0, fmt.Errorf("bad queue %q: want a packet count between 1 and 100000", s)
	}
	return n, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]*$`)

// Node and link names become parts of namespace and interface names; no
// '-' so that "<lab>-<node>" can be split unambiguously when cleaning up.
func checkName(kind, s string, max int) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("bad %s name %q: use letters, digits and _, starting with a letter", kind, s)
	}
	if len(s) > max {
		return fmt.Errorf("bad %s name %q: at most %d characters", kind, s, max)
	}
	return nil
}

var labNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// MaxLabName keeps "<lab>-<node>" readable and well under NAME_MAX.
const MaxLabName = 40

// CheckLabName validates a lab name (letters, digits, _ and -).
func CheckLabName(s string) error {
	if !labNameRE.MatchString(s) || len(s) > MaxLabName {
		return fmt.Errorf("bad lab name %q: use up to %d letters, digits, _ and -", s, MaxLabName)
	}
	return nil
}

// pos locates a value for error messages: a file line or a field path.
type pos struct {
	line, col int
	field     string
}

// Node returns the node named name, or nil.
func (t *Topology) Node(name string) *Node {
	for _, n := range t.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Link returns the link named name, or nil.
func (t *Topology) Link(name string) *Link {
	for _, l := range t.Links {
		if l.Name == name {
			return l
		}
	}
	return nil
}

// Primary returns a node's primary address: its address on the first link
// (in file order) that it is an endpoint of.
func (t *Topology) Primary(node string) netip.Addr {
	for _, l := range t.Links {
		if l.A.Node == node {
			return l.A.Addr.Addr()
		}
		if l.B.Node == node {
			return l.B.Addr.Addr()
		}
	}
	return netip.Addr{}
}
