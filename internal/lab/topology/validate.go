package topology

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// MaxNodes and MaxLinks bound a topology: each node and each delayed link
// is a namespace, and a file is untrusted input.
const (
	MaxNodes = 64
	MaxLinks = 128
)

var sysctlRE = regexp.MustCompile(`^net\.[A-Za-z0-9_.-]+$`)

// Validate checks everything Up needs: names, endpoints, addresses,
// routes and sysctl keys. Up calls it again, so a topology edited in Go
// cannot slip past it.
func (t *Topology) Validate() error {
	errAt := func(p pos, format string, a ...any) error {
		return &Error{Source: t.Source, Line: p.line, Col: p.col, Field: p.field, Msg: fmt.Sprintf(format, a...)}
	}
	if len(t.Nodes) == 0 {
		return &Error{Source: t.Source, Msg: "no nodes"}
	}
	if len(t.Nodes) > MaxNodes {
		return &Error{Source: t.Source, Msg: fmt.Sprintf("%d nodes, at most %d", len(t.Nodes), MaxNodes)}
	}
	if len(t.Links) > MaxLinks {
		return &Error{Source: t.Source, Msg: fmt.Sprintf("%d links, at most %d", len(t.Links), MaxLinks)}
	}
	nodes := map[string]*Node{}
	for _, n := range t.Nodes {
		if err := checkName("node", n.Name, 15); err != nil {
			return errAt(n.pos, "%v", err)
		}
		if nodes[n.Name] != nil {
			return errAt(n.pos, "duplicate node %q", n.Name)
		}
		nodes[n.Name] = n
		seen := map[string]bool{}
		for _, s := range n.Sysctls {
			if !sysctlRE.MatchString(s.Key) || strings.Contains(s.Key, "..") {
				return errAt(s.pos, "bad sysctl %q: only net.* keys are per-namespace", s.Key)
			}
			if seen[s.Key] {
				return errAt(s.pos, "sysctl %q set twice", s.Key)
			}
			seen[s.Key] = true
			if s.Value == "" || strings.ContainsAny(s.Value, "\n\x00") {
				return errAt(s.pos, "bad value %q for sysctl %s", s.Value, s.Key)
			}
		}
	}
	links := map[string]bool{}
	addrs := map[netip.Addr]string{}
	// connected[node] lists the prefixes directly reachable from it.
	connected := map[string][]netip.Prefix{}
	for _, l := range t.Links {
		if err := checkName("link", l.Name, 15); err != nil {
			return errAt(l.pos, "%v", err)
		}
		if l.Name == "lo" {
			return errAt(l.pos, "link name %q is reserved", l.Name)
		}
		if nodes[l.Name] != nil {
			return errAt(l.pos, "link %q has the name of a node (both name namespaces)", l.Name)
		}
		if links[l.Name] {
			return errAt(l.pos, "duplicate link %q", l.Name)
		}
		links[l.Name] = true
		if l.Class != "" {
			if err := checkName("class", l.Class, 15); err != nil {
				return errAt(l.pos, "%v", err)
			}
		}
		for i, e := range []struct {
			side string
			end  End
		}{{"a", l.A}, {"b", l.B}} {
			ep, ap := l.pos, l.pos
			if l.endPos[i].line > 0 {
				ep = l.endPos[i]
			}
			if l.addrPos[i].line > 0 {
				ap = l.addrPos[i]
			}
			if e.end.Node == "" {
				return errAt(l.pos, "missing endpoint %s:", e.side)
			}
			if nodes[e.end.Node] == nil {
				return errAt(ep, "unknown node %q", e.end.Node)
			}
			a := e.end.Addr.Addr()
			if !e.end.Addr.IsValid() || !a.Is4() {
				return errAt(l.pos, "endpoint %s has no IPv4 address", e.side)
			}
			if a.IsLoopback() || a.IsMulticast() || a.IsUnspecified() || a == e.end.Addr.Masked().Addr() || isBroadcast(e.end.Addr) {
				return errAt(ap, "address %s of endpoint %s is not a usable host address", e.end.Addr, e.side)
			}
			if other, dup := addrs[a]; dup {
				return errAt(ap, "duplicate address %s (already on %s)", a, other)
			}
			addrs[a] = "link " + l.Name
		}
		if l.A.Node == l.B.Node {
			return errAt(l.pos, "both ends on node %q", l.A.Node)
		}
		if l.A.Addr.Masked() != l.B.Addr.Masked() {
			return errAt(l.pos, "endpoints %s and %s are not in the same subnet", l.A.Addr, l.B.Addr)
		}
		for _, sh := range []Shape{l.AB, l.BA} {
			if sh.Loss < 0 || sh.Loss > 1 || sh.Delay < 0 || sh.Delay > MaxDelay || sh.Queue < 0 {
				return errAt(l.pos, "bad shape %+v", sh)
			}
		}
		connected[l.A.Node] = append(connected[l.A.Node], l.A.Addr.Masked())
		connected[l.B.Node] = append(connected[l.B.Node], l.B.Addr.Masked())
	}
	// Subnets of different links must not overlap: routes would be ambiguous.
	for i, l := range t.Links {
		for _, m := range t.Links[:i] {
			if l.A.Addr.Masked().Overlaps(m.A.Addr.Masked()) {
				return errAt(l.pos, "subnet %s overlaps link %s's %s", l.A.Addr.Masked(), m.Name, m.A.Addr.Masked())
			}
		}
	}
	for _, n := range t.Nodes {
		dsts := map[netip.Prefix]bool{}
		for _, r := range n.Routes {
			if !r.Dst.IsValid() || !r.Via.IsValid() {
				return errAt(r.pos, "route needs a destination and a gateway")
			}
			if dsts[r.Dst] {
				return errAt(r.pos, "second route to %s", r.Dst)
			}
			dsts[r.Dst] = true
			onLink := false
			for _, c := range connected[n.Name] {
				if c.Contains(r.Via) {
					onLink = true
				}
			}
			if !onLink {
				return errAt(r.pos, "route to %s via %s goes nowhere: %s is on none of node %s's links", r.Dst, r.Via, r.Via, n.Name)
			}
			if owner, ok := addrs[r.Via]; ok && isOwn(t, n.Name, r.Via) {
				return errAt(r.pos, "route to %s via %s: that is node %s's own address (%s)", r.Dst, r.Via, n.Name, owner)
			}
			if _, ok := addrs[r.Via]; !ok {
				return errAt(r.pos, "route to %s via %s goes nowhere: no node has address %s", r.Dst, r.Via, r.Via)
			}
			if r.Src.IsValid() && !isOwn(t, n.Name, r.Src) {
				return errAt(r.pos, "route to %s: source %s is not one of node %s's addresses", r.Dst, r.Src, n.Name)
			}
		}
	}
	return nil
}

func isBroadcast(p netip.Prefix) bool {
	b := p.Addr().As4()
	bits := p.Bits()
	for i := bits; i < 32; i++ {
		if b[i/8]&(0x80>>(i%8)) == 0 {
			return false
		}
	}
	return true
}

func isOwn(t *Topology, node string, a netip.Addr) bool {
	for _, l := range t.Links {
		if (l.A.Node == node && l.A.Addr.Addr() == a) || (l.B.Node == node && l.B.Addr.Addr() == a) {
			return true
		}
	}
	return false
}
