package tunnel

// IPv6 inside a WireGuard tunnel, client half. A relay with an IPv6 tunnel
// subnet grants an IPv6 tunnel address beside the IPv4 one
// (proto.TunnelGrant.ClientPrefix6, Allocation.Address6) to a client that
// asks for it; the client then puts the address on its tunnel interface
// (as a /128, like the IPv4 /32), adds ::/0 to the relay peer's allowed
// IPs, a default route ::/0 into its tunnel table and a rule sending
// packets from that address to the table: the IPv4 scheme, per family.
// Kept apart from client.go so that the IPv4 path reads as before.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// validate6 checks an allocation's IPv6 tunnel address (optional).
func validate6(p netip.Prefix) error {
	if p == (netip.Prefix{}) {
		return nil
	}
	a := p.Addr()
	switch {
	case !p.IsValid() || !a.Is6() || a.Is4In6() || a.Zone() != "":
		return fmt.Errorf("tunnel allocation: IPv6 address %s is not an IPv6 prefix", p)
	case a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast():
		return fmt.Errorf("tunnel allocation: IPv6 address %s is not a usable unicast address", a)
	}
	return nil
}

// allowedIPs is the relay peer's allowed IPs for allocation a: every IPv4
// address, and every IPv6 address when the tunnel carries IPv6.
func allowedIPs(a Allocation) []net.IPNet {
	out := []net.IPNet{{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
	if a.Address6.IsValid() {
		out = append(out, net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)})
	}
	return out
}

func (c *Client) route6(link netlink.Link) *netlink.Route {
	return &netlink.Route{LinkIndex: link.Attrs().Index, Table: c.table, Scope: netlink.SCOPE_UNIVERSE,
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
}

// apply6 moves the interface's IPv6 address, rule and route from allocation
// old to a (either may have no IPv6 address). On error nothing of a's IPv6
// part stays: the caller carries on with IPv4 alone.
func (c *Client) apply6(link netlink.Link, a, old Allocation) (err error) {
	newA, oldA := a.Address6.Addr(), old.Address6.Addr()
	if oldA.IsValid() && oldA != newA {
		_ = c.nl.RuleDel(c.rule(oldA))
		_ = c.nl.AddrDel(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(oldA, 128))})
	}
	if !newA.IsValid() {
		if oldA.IsValid() {
			_ = c.nl.RouteDel(c.route6(link))
		}
		return nil
	}
	defer func() {
		if err != nil {
			_ = c.nl.RuleDel(c.rule(newA))
			_ = c.nl.AddrDel(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(newA, 128))})
		}
	}()
	// A namespace whose default disables IPv6 (net.ipv6.conf.default.
	// disable_ipv6) created the interface without it: turn it on for
	// this interface only (it is ours).
	if err := enableIPv6(c.ns, c.iface); err != nil {
		return err
	}
	// No duplicate address detection: the address is the relay's grant,
	// on a point-to-point link, and DAD would hold it tentative (unusable
	// as a source) for a second.
	if err := c.nl.AddrReplace(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(newA, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on %s: %w", newA, c.iface, err)
	}
	if err := c.nl.RuleAdd(c.rule(newA)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("rule from %s lookup %d: %w", newA, c.table, err)
	}
	if err := c.nl.RouteReplace(c.route6(link)); err != nil {
		return fmt.Errorf("IPv6 default route in table %d: %w", c.table, err)
	}
	return nil
}

// setup6 applies a's IPv6 part; when that fails the tunnel carries IPv4
// alone (logged) and the returned allocation has no IPv6 address, so the
// peer is not given ::/0 and Detours offers no IPv6 detour.
func (c *Client) setup6(link netlink.Link, a, old Allocation) Allocation {
	if err := c.apply6(link, a, old); err != nil {
		c.log.Warn("tunnel carries IPv4 only: IPv6 tunnel address not configured", "address6", a.Address6, "err", err)
		a.Address6 = netip.Prefix{}
	}
	return a
}

// Address6 is the tunnel's local IPv6 address (invalid when the relay
// granted none): IPv6 subflows from it use the tunnel.
func (c *Client) Address6() netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Address6.Addr()
}

// removeTableState deletes family's rules pointing at table and the
// table's routes of that family (IPv4 and IPv6 alike; a kernel without
// IPv6 has no IPv6 state).
func removeTableState(nl *netlink.Handle, family, table int) error {
	var errs []error
	rules, err := nl.RuleList(family)
	if family == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	for i := range rules {
		if rules[i].Table == table {
			if err := nl.RuleDel(&rules[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete rule to table %d: %w", table, err))
			}
		}
	}
	routes, err := nl.RouteListFiltered(family, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err == nil {
		for i := range routes {
			if err := nl.RouteDel(&routes[i]); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route in table %d: %w", table, err))
			}
		}
	}
	return errors.Join(errs...)
}

// clientTables6 adds to tables the client tunnel tables (base..base+
// MaxClients-1: TableBase for WireGuard, EncapTableBase for VXLAN) that
// IPv6 rules point at (a crashed agent's embedded device vanished with
// it; its rules did not).
func clientTables6(nl *netlink.Handle, tables map[int]bool, base int) error {
	rules, err := nl.RuleList(netlink.FAMILY_V6)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list IPv6 rules: %w", err)
	}
	for _, r := range rules {
		if r.Table >= base && r.Table < base+MaxClients {
			tables[r.Table] = true
		}
	}
	return nil
}
