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
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
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
}

// globalUnicast6 is where IANA allocates global IPv6 unicast: an IPv6
// destination outside it that no entry of special names is reserved too.
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// nat64 is the well-known NAT64 prefix: an address in it stands for the
// IPv4 address in its last 32 bits (RFC 6052), which must pass the IPv4
// checks too when an allow prefix lets NAT64 addresses through.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

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
	if a.Is6() && !globalUnicast6.Contains(a) && !allowed() {
		return fmt.Errorf("%v is reserved (outside global unicast %v) and not in allow_destinations", a, globalUnicast6)
	}
	for _, n := range p.ownNets {
		if n.Contains(a) && !allowed() {
			return fmt.Errorf("%v is in the relay's own network %v and not in allow_destinations", a, n)
		}
	}
	if nat64.Contains(a) {
		// Allowed NAT64: the IPv4 address it stands for must pass too.
		b := a.As16()
		if err := p.Check(netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[12:])), server.Port())); err != nil {
			return fmt.Errorf("%v is NAT64 for a refused IPv4 address: %w", a, err)
		}
	}
	return nil
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
