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

// Check returns nil if server may be reached, else why not.
func (p *Policy) Check(server netip.AddrPort) error {
	a := server.Addr().Unmap()
	if !a.Is4() {
		return fmt.Errorf("%v: the NAT data plane is IPv4 only", a)
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
	return nil
}

// RefreshOwn reads the host's addresses from the kernel (the calling
// thread's namespace): they are always refused, their networks unless allowed.
func (p *Policy) RefreshOwn() error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing own addresses: %w", err)
	}
	p.ownAddrs, p.ownNets = nil, nil
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
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
