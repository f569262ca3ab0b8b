package topology

import (
	"fmt"
	"net/netip"
)

// Family is the address family a lab is built with (built-in parameter
// family: 4, 6 or dual; topology files are IPv4).
type Family string

const (
	Family4    Family = "4"    // IPv4 only (default; IPv6 disabled in every namespace)
	Family6    Family = "6"    // IPv6 only: every address is the IPv6 twin of the IPv4 one
	FamilyDual Family = "dual" // both: every link and route exists in both families
)

// familyParam is the parameter every built-in topology accepts.
const familyParam = "family"

func checkFamily(v string) error {
	switch Family(v) {
	case Family4, Family6, FamilyDual:
		return nil
	}
	return fmt.Errorf("family must be 4, 6 or dual, not %q", v)
}

// Has4 and Has6 say whether the family carries IPv4 and IPv6 addresses.
func (f Family) Has4() bool { return f != Family6 }
func (f Family) Has6() bool { return f == Family6 || f == FamilyDual }

// Family returns the family the topology is built with (Family4 for
// topology files and built-ins without the parameter).
func (t *Topology) Family() Family {
	if f := Family(t.params[familyParam]); f != "" {
		return f
	}
	return Family4
}

// V6Prefix is the ULA /96 that holds the IPv6 twins of the lab's IPv4
// addresses: 10.0.1.1 becomes fd6c:6162::a00:101 (prefix length + 96), so
// the IPv6 plan has exactly the IPv4 plan's links, subnets and routes.
var V6Prefix = netip.MustParsePrefix("fd6c:6162::/96")

// V6 returns the IPv6 twin of an IPv4 address (an IPv6 address is returned
// as is).
func V6(a netip.Addr) netip.Addr {
	if !a.Is4() {
		return a
	}
	b := V6Prefix.Addr().As16()
	v := a.As4()
	copy(b[12:], v[:])
	return netip.AddrFrom16(b)
}

// V6Prefixed returns the IPv6 twin of an IPv4 prefix (0.0.0.0/0 becomes ::/0:
// a default route stays a default route).
func V6Prefixed(p netip.Prefix) netip.Prefix {
	if !p.Addr().Is4() {
		return p
	}
	if p.Bits() == 0 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(V6(p.Addr()), p.Bits()+96)
}

// V4 returns the IPv4 address whose twin a is (a itself when it is IPv4
// or not in V6Prefix).
func V4(a netip.Addr) netip.Addr {
	if a.Is6() && V6Prefix.Contains(a) {
		b := a.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return a
}
