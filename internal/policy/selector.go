package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// PortRange is an inclusive range of ports.
type PortRange struct{ Lo, Hi uint16 }

// ParsePortRange accepts "443" or "8000-8100".
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	if err != nil || a == 0 {
		return PortRange{}, fmt.Errorf("bad port %q (want 1-65535 or LO-HI)", s)
	}
	b := a
	if isRange {
		if b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 16); err != nil || b < a {
			return PortRange{}, fmt.Errorf("bad port range %q", s)
		}
	}
	return PortRange{uint16(a), uint16(b)}, nil
}

// Selector picks connections by destination. Empty lists match anything.
type Selector struct {
	Prefixes []netip.Prefix
	Ports    []PortRange
}

func (s Selector) match(dst netip.AddrPort) bool {
	ok := len(s.Prefixes) == 0
	for _, p := range s.Prefixes {
		if p.Contains(dst.Addr()) {
			ok = true
			break
		}
	}
	if !ok {
		return false
	}
	if len(s.Ports) == 0 {
		return true
	}
	for _, r := range s.Ports {
		if dst.Port() >= r.Lo && dst.Port() <= r.Hi {
			return true
		}
	}
	return false
}

// Selected reports whether connections to dst get detours: dst must match
// one selector (or there are none) and never be loopback, link-local,
// multicast or unspecified.
func Selected(sels []Selector, dst netip.AddrPort) bool {
	a := dst.Addr().Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsMulticast() || a.IsUnspecified() || a.IsInterfaceLocalMulticast() {
		return false
	}
	if len(sels) == 0 {
		return true
	}
	dst = netip.AddrPortFrom(a, dst.Port())
	for _, s := range sels {
		if s.match(dst) {
			return true
		}
	}
	return false
}
