package doctor

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/mpdetour/mpdetour/internal/agent"
)

// FamilyInput is what the per-family checks look at; fields left zero are
// skipped.
type FamilyInput struct {
	// DefaultRoute says whether the namespace has a default route of a
	// family (v6: IPv6) and through which device (DefaultRoute below).
	DefaultRoute func(v6 bool) (dev string, ok bool, err error)
	// Relays are the agent config's relay addresses (nil: no agent config).
	Relays []netip.AddrPort
	// OtherFamily is how many servers the agent config maps to an address
	// of the other family (cross-family detours).
	OtherFamily int
	// Running is a running agent's status (nil: none answers).
	Running *agent.Status
}

// Families checks each address family on its own: IPv6 switched on, a
// default route of the family, relays reachable in it (a relay serves
// connections of its control session's family), a running agent's detours
// of the family, and how the other family's detours can be reached
// (docs/agent.md, Dual stack).
func Families(p Paths, in FamilyInput) Report {
	var r Report
	v6off := false
	if v, err := readSysctl(p, "net.ipv6.conf.all.disable_ipv6"); err != nil {
		v6off = true
		r.add("family", "IPv6", Info, "no net.ipv6 sysctls: kernel without IPv6; IPv4 only", "")
	} else if v == "1" {
		v6off = true
		r.add("family", "IPv6", Info, "IPv6 disabled in this namespace (net.ipv6.conf.all.disable_ipv6 = 1): IPv4 only", "sysctl -w net.ipv6.conf.all.disable_ipv6=0 to use IPv6 servers and detours")
	}
	relays := [2]int{}
	for _, a := range in.Relays {
		relays[fam(a.Addr())]++
	}
	for i, name := range []string{"IPv4", "IPv6"} {
		v6 := i == 1
		if v6 && v6off {
			continue
		}
		if in.DefaultRoute != nil {
			dev, ok, err := in.DefaultRoute(v6)
			switch {
			case err != nil:
				r.add("family", name+" default route", Warn, err.Error(), "")
			case !ok:
				st := Info
				if !v6 {
					st = Warn
				}
				r.add("family", name+" default route", st, "none: "+name+" servers are reachable only through routes of their own", "")
			default:
				r.add("family", name+" default route", OK, "via "+dev, "")
			}
		}
		if in.Relays != nil {
			switch n := relays[i]; {
			case n == 0 && in.OtherFamily > 0:
				r.add("family", name+" relays", Info, fmt.Sprintf("none: %s connections get NAT detours only of the other family, toward the %d mapped servers (other_family), and only on AF_INET6 sockets", name, in.OtherFamily), "")
			case n == 0:
				r.add("family", name+" relays", Info, fmt.Sprintf("none: %s connections get no NAT detour", name), "list a relay by its "+name+" address under relays.servers (a relay with both families: addresses: [IPv4:PORT, '[IPv6]:PORT'] in its entry)")
			default:
				r.add("family", name+" relays", OK, fmt.Sprintf("%d", n), "")
			}
		}
		if st := in.Running; st != nil {
			for _, f := range st.Families {
				if f.Family != name {
					continue
				}
				r.add("family", name+" under the agent", OK, fmt.Sprintf("%d connections (%d on AF_INET6), %d subflows up (%d cross-family), %d detours (%d healthy)",
					f.Connections, f.OnInet6, f.Subflows, f.Cross, f.Detours, f.Healthy), "")
			}
		}
	}
	return r
}

// fam is 0 for IPv4 (mapped too), 1 for IPv6.
func fam(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 0
	}
	return 1
}

// DefaultRoute looks up the caller's namespace's default route of a
// family (netlink), for FamilyInput.DefaultRoute.
func DefaultRoute(v6 bool) (string, bool, error) {
	family := netlink.FAMILY_V4
	if v6 {
		family = netlink.FAMILY_V6
	}
	routes, err := netlink.RouteListFiltered(family, &netlink.Route{Table: unixRTTableMain}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return "", false, fmt.Errorf("list routes: %w", err)
	}
	for _, rt := range routes {
		if rt.Dst != nil {
			if ones, _ := rt.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		dev := fmt.Sprintf("ifindex %d", rt.LinkIndex)
		if l, err := netlink.LinkByIndex(rt.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		if rt.Gw != nil {
			dev = rt.Gw.String() + " dev " + dev
		}
		return dev, true, nil
	}
	return "", false, nil
}

const unixRTTableMain = 254
