package tunnel

// IPv6 inside a VXLAN tunnel (the relay's vxlan subnet6). The WireGuard
// kind's scheme (client6.go), per VXLAN device: a member's inner IPv6
// address is subnet6 plus its IPv4 inner address's host offset (addr6: no
// allocation or lease of its own, it comes and goes with the IPv4 one),
// the relay's is subnet6's first host. The relay puts its address on the
// member's device as a /128 with a host route to the member's; the client
// puts its address on its device as a /128 and routes ::/0 via the
// relay's address in its tunnel table, with a rule from its address.
// Unlike WireGuard the device is Ethernet-like: the next hop is found by
// neighbour discovery, which the relay's ip6 table admits from VXLAN
// devices (encap_nft.go). Kept apart from encap.go and encap_client.go so
// that the IPv4 path reads as before.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// minIPv6MTU: below it the kernel turns IPv6 off on a device (RFC 8200).
const minIPv6MTU = 1280

// enableIPv6 turns IPv6 on for iface in ns when the namespace's default
// (net.ipv6.conf.default.disable_ipv6) created it without. The interface is
// ours; nothing else changes. There is no netlink attribute for it, hence
// the sysctl file.
func enableIPv6(ns *nsRef, iface string) error {
	return ns.do(func() error {
		p := "/proc/sys/net/ipv6/conf/" + iface + "/disable_ipv6"
		if b, err := os.ReadFile(p); err == nil && string(b) == "0\n" {
			return nil
		}
		if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
			return fmt.Errorf("enable IPv6 on %s (is IPv6 disabled on this host?): %w", iface, err)
		}
		return nil
	})
}

// inside6 is the IPv6 inside for allocation a: none without a subnet6, or
// (logged) when a's inner MTU is below what IPv6 needs (a small vxlan.mtu
// over an IPv6 underlay).
func (s *EncapServer) inside6(a EncapAllocation) (netip.Prefix, netip.Addr) {
	p4, p6 := s.alloc.subnet, s.cfg.Subnet6
	if !p6.IsValid() {
		return netip.Prefix{}, netip.Addr{}
	}
	if a.MTU < minIPv6MTU {
		s.log.Warn("vxlan member gets IPv4 inside only: its inner MTU is below IPv6's minimum (raise tunnel.vxlan.mtu)",
			"member", a.Member, "mtu", a.MTU, "min", minIPv6MTU)
		return netip.Prefix{}, netip.Addr{}
	}
	return netip.PrefixFrom(addr6(p4, p6, a.Address.Addr()), p6.Bits()), addr6(p4, p6, gateway(p4))
}

// addDevice6 gives the member's device its IPv6 side: IPv6 on, the relay's
// inner IPv6 address (no duplicate address detection: it is ours on a
// point-to-point link, and DAD would hold it unusable for a second) and a
// host route to the member's. When that fails the member gets IPv4 inside
// only (logged; its allocation loses Address6, so the grant and the
// filter say so).
func (s *EncapServer) addDevice6(m *encapMember, l netlink.Link) {
	a := m.alloc
	if !a.Address6.IsValid() {
		return
	}
	err := enableIPv6(s.ns, m.iface)
	if err == nil {
		err = s.nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a.Gateway6, 128)), Flags: unix.IFA_F_NODAD})
		if err != nil {
			err = fmt.Errorf("address %s on %s: %w", a.Gateway6, m.iface, err)
		}
	}
	if err == nil {
		err = s.nl.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(a.Address6.Addr(), 128))})
		if err != nil {
			err = fmt.Errorf("route %s dev %s: %w", a.Address6.Addr(), m.iface, err)
		}
	}
	if err != nil {
		_ = s.nl.AddrDel(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a.Gateway6, 128))})
		s.log.Warn("vxlan member gets IPv4 inside only: IPv6 inside not configured", "member", a.Member, "err", err)
		m.alloc.Address6, m.alloc.Gateway6 = netip.Prefix{}, netip.Addr{}
	}
}

// apply6 configures allocation a's IPv6 inside on the client's device l:
// IPv6 on, the address as a /128, a host route to the relay's inner IPv6
// address and ::/0 via it in the tunnel table, a rule from the address.
// On error nothing of it stays (the device and table are ours and
// rebuilt on every change; the caller carries on with IPv4).
func (c *EncapClient) apply6(l netlink.Link, a EncapAllocation) (err error) {
	ad, gw := a.Address6.Addr(), a.Gateway6
	rule := netlink.NewRule()
	rule.Family = unix.AF_INET6
	rule.Priority = EncapRulePriority
	rule.Table = c.table
	rule.Src = prefixNet(netip.PrefixFrom(ad, 128))
	defer func() {
		if err != nil {
			_ = c.nl.RuleDel(rule)
			_ = removeTableState(c.nl, netlink.FAMILY_V6, c.table)
			_ = c.nl.AddrDel(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ad, 128))})
		}
	}()
	if err := enableIPv6(c.ns, c.iface); err != nil {
		return err
	}
	if err := c.nl.AddrReplace(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ad, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on %s: %w", ad, c.iface, err)
	}
	idx := l.Attrs().Index
	if err := c.nl.RouteReplace(&netlink.Route{LinkIndex: idx, Table: c.table, Dst: prefixNet(netip.PrefixFrom(gw, 128))}); err != nil {
		return fmt.Errorf("route to IPv6 gateway %s in table %d: %w", gw, c.table, err)
	}
	if err := c.nl.RouteReplace(&netlink.Route{LinkIndex: idx, Table: c.table, Gw: gw.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("IPv6 default route via %s in table %d: %w", gw, c.table, err)
	}
	if err := c.nl.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("rule from %s lookup %d: %w", ad, c.table, err)
	}
	return nil
}

// setup6 applies a's IPv6 inside, if any, and returns the inner IPv6
// address now in use: invalid when the relay granted none or configuring
// it failed (then the tunnel carries IPv4 alone, logged in one line).
func (c *EncapClient) setup6(l netlink.Link, a EncapAllocation) netip.Addr {
	if !a.Address6.IsValid() {
		return netip.Addr{}
	}
	if err := c.apply6(l, a); err != nil {
		c.log.Warn("vxlan tunnel carries IPv4 only: IPv6 inner address not configured", "address6", a.Address6, "err", err)
		return netip.Addr{}
	}
	return a.Address6.Addr()
}

// Gateway6 is the relay's inner IPv6 address, the next hop of IPv6 from
// Address6 (invalid when Address6 is).
func (c *EncapClient) Gateway6() netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.addr6.IsValid() {
		return netip.Addr{}
	}
	return c.alloc.Gateway6
}

// Address6 is the tunnel's inner IPv6 address (invalid when the relay
// granted none or it could not be configured): IPv6 subflows from it use
// the tunnel.
func (c *EncapClient) Address6() netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addr6
}
