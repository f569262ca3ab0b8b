// Package destination is the destination policy of every kind of detour: a
// relay (or converter) must not become a way into its own or anyone's
// private networks, nor a mail relay. It is one of the three things once
// all called "policy"; the agent's path manager is internal/policy.
package destination

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// special lists destination ranges refused unless an allow prefix
// covers them: a relay must not become a way into its own or anyone's
// private networks.
var special = []struct {
	p    netip.Prefix
	what string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (TEST-NET-1)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (deprecated)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (TEST-NET-2)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (TEST-NET-3)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	// IPv6 (IANA IPv6 Special-Purpose Address Registry, RFC 6890 and
	// successors). The IPv4-mapped range never gets here (Check judges its
	// IPv4 address); the unspecified address is refused before.
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated) or unassigned"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64 well-known prefix"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64 local-use prefix"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignments (Teredo, ORCHID, benchmarking)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
	{netip.MustParsePrefix("5f00::/16"), "SRv6 SIDs"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (ULA)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	// Everything outside global unicast 2000::/3 (where IANA allocates)
	// that no entry above names: reserved. Three prefixes rather than a
	// test of their own so that the tunnel's ip6 table, which takes this
	// list, refuses them too (and the IPv4-mapped range ::ffff:0:0/96 on
	// the wire with them).
	{netip.MustParsePrefix("::/3"), "reserved (outside global unicast 2000::/3)"},
	{netip.MustParsePrefix("4000::/2"), "reserved (outside global unicast 2000::/3)"},
	{netip.MustParsePrefix("8000::/1"), "reserved (outside global unicast 2000::/3)"},
}

// embedded lists IPv6 ranges whose addresses stand for an IPv4 address
// that the traffic ends up at (NAT64 translates to it; 6to4 and Teredo
// encapsulate toward it): when an allow prefix lets such a range through,
// the IPv4 address must pass the IPv4 checks too, or "allow NAT64" would
// open the relay's private IPv4 networks. The NAT64 local-use prefix
// 64:ff9b:1::/48 is not here: where its IPv4 address sits depends on the
// operator's prefix length (RFC 6052), so it stays refused unless allowed,
// and allowing it is trusting that translator.
var embedded = []struct {
	p      netip.Prefix
	off    int  // byte offset of the IPv4 address
	invert bool // stored bit-inverted (Teredo's client address)
	what   string
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12, false, "NAT64"},
	{netip.MustParsePrefix("2002::/16"), 2, false, "6to4"},
	{netip.MustParsePrefix("2001::/32"), 12, true, "Teredo"},
}

// Embedded returns, for IPv4 prefixes that are refused, the IPv6 prefixes
// standing for them in the embedding ranges (NAT64 well-known, 6to4) that
// an allow entry overlaps: a packet filter that cannot recurse the way
// Check does drops these before its allow rules. (Teredo's embedding is
// not a prefix and its range stays refused unless allowed; an IPv4 allow
// does not reopen an embedded refusal here: stricter than Check.)
func Embedded(refused4, allow []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, e := range embedded {
		if e.invert || e.p.Bits() != e.off*8 {
			continue
		}
		open := false
		for _, a := range allow {
			open = open || a.Overlaps(e.p)
		}
		if !open {
			continue
		}
		for _, r := range refused4 {
			if !r.Addr().Is4() {
				continue
			}
			b := e.p.Addr().As16()
			v4 := r.Masked().Addr().As4()
			copy(b[e.off:], v4[:])
			out = append(out, netip.PrefixFrom(netip.AddrFrom16(b), e.p.Bits()+r.Bits()))
		}
	}
	return out
}

// Policy decides which destinations a detour may lead to (NAT grants, and
// the converter). Allow lists special ranges that are allowed anyway, Deny
// is absolute, DenyPorts are refused destination ports.
type Policy struct {
	Allow     []netip.Prefix
	Deny      []netip.Prefix
	DenyPorts map[uint16]bool
	// own: the relay's addresses (always refused) and networks (refused
	// unless allowed), refreshed from the kernel.
	ownAddrs []netip.Addr
	ownNets  []netip.Prefix
}

// Check returns nil if server may be reached, else why not. Both families:
// an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is judged as the IPv4
// address it maps (the wire formats refuse it; a caller that passes one
// gets the verdict of the address it stands for, never a way around it);
// an address with a zone (fe80::1%eth0) is refused.
func (p *Policy) Check(server netip.AddrPort) error {
	if server.Addr().Zone() != "" {
		return fmt.Errorf("%v: an address with a zone (scope id) is never a detour destination", server.Addr())
	}
	a := server.Addr().Unmap()
	if !a.IsValid() {
		return fmt.Errorf("no destination address")
	}
	if p.DenyPorts[server.Port()] {
		return fmt.Errorf("port %d is denied", server.Port())
	}
	for _, d := range p.Deny {
		if d.Contains(a) {
			return fmt.Errorf("%v is in denied %v", a, d)
		}
	}
	if a.IsUnspecified() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("%v is not a unicast address", a)
	}
	for _, o := range p.ownAddrs {
		if o == a {
			return fmt.Errorf("%v is the relay's own address", a)
		}
	}
	allowed := func() bool {
		for _, al := range p.Allow {
			if al.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, s := range special {
		if s.p.Contains(a) && !allowed() {
			return fmt.Errorf("%v is %s (%v) and not in allow_destinations", a, s.what, s.p)
		}
	}
	for _, n := range p.ownNets {
		if n.Contains(a) && !allowed() {
			return fmt.Errorf("%v is in the relay's own network %v and not in allow_destinations", a, n)
		}
	}
	for _, e := range embedded {
		if !e.p.Contains(a) {
			continue
		}
		// Allowed NAT64, 6to4 or Teredo: the IPv4 address it stands for
		// must pass too.
		b := a.As16()
		v4 := [4]byte(b[e.off : e.off+4])
		if e.invert {
			for i := range v4 {
				v4[i] = ^v4[i]
			}
		}
		if err := p.Check(netip.AddrPortFrom(netip.AddrFrom4(v4), server.Port())); err != nil {
			return fmt.Errorf("%v is %s for a refused IPv4 address: %w", a, e.what, err)
		}
	}
	return nil
}

// ParsePrefix reads a destination prefix or address of either family (the
// allow and deny lists of the relay and of its tunnel section). A zone
// (fe80::1%eth0), host bits and the IPv4-mapped form (::ffff:10.0.0.0/104)
// are refused: Check judges a mapped address as its IPv4 address, so a
// mapped prefix would never match.
func ParsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Masked() != p {
			return p, fmt.Errorf("%q has host bits set (did you mean %v?)", s, p.Masked())
		}
		if p.Addr().Is4In6() {
			return p, fmt.Errorf("%q is IPv4-mapped: write the IPv4 prefix", s)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a prefix nor an address", s)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q has a zone: destinations are global addresses", s)
	}
	if a.Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is IPv4-mapped: write the IPv4 address %v", s, a.Unmap())
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// RefreshOwn reads the host's addresses of both families from the kernel
// (the calling thread's namespace): they are always refused, their networks
// unless allowed.
func (p *Policy) RefreshOwn() error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing own addresses: %w", err)
	}
	p.ownAddrs, p.ownNets = nil, nil
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		ones, _ := a.Mask.Size()
		p.ownAddrs = append(p.ownAddrs, ip)
		if !ip.IsLoopback() {
			p.ownNets = append(p.ownNets, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	return nil
}

// SetOwn sets the host's own addresses and networks (tests, or a copy from
// another Policy on reload).
func (p *Policy) SetOwn(addrs []netip.Addr, nets []netip.Prefix) {
	p.ownAddrs, p.ownNets = addrs, nets
}

// Own returns what SetOwn or RefreshOwn set.
func (p *Policy) Own() ([]netip.Addr, []netip.Prefix) { return p.ownAddrs, p.ownNets }

// Special returns the ranges refused unless allowed: private, loopback,
// link-local, multicast, reserved and the like. NAT detours, tunnel detours
// and the converter share this one definition.
func Special() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(special))
	for _, s := range special {
		out = append(out, s.p)
	}
	return out
}
