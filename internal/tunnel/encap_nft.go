package tunnel

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/destination"
)

// encapRule is what the table needs to know of one member.
type encapRule struct {
	iface  string
	member netip.Addr // underlay source the relay accepts
	inner  netip.Addr // the member's inner address
	inner6 netip.Addr // the member's inner IPv6 address (invalid: none)
	vni    uint32
	mtu    int // the member's inner MTU (smaller over an IPv6 underlay)
}

// matchIfacePrefix compares the first len(prefix) bytes of iifname/oifname
// (nft's `iifname "mpdtvr*"`).
func matchIfacePrefix(key expr.MetaKey, op expr.CmpOp, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(prefix)},
	}
}

// matchUDPDport: meta l4proto udp, udp dport port.
func matchUDPDport(port int) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
	}
}

// matchVNI compares the VXLAN header's VNI (UDP payload bytes 4-6, i.e.
// transport header offset 12).
func matchVNI(vni uint32) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 12, Len: 3},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(vni >> 16), byte(vni >> 8), byte(vni)}},
	}
}

// installEncapTable (re)creates the relay's VXLAN table atomically (delete
// and add in one batch):
//
//   - input: VXLAN (udp dport port) is accepted only from a member's address
//     with that member's VNI, everything else to the port is dropped (the
//     encapsulation is unauthenticated: this source filter is all that
//     stands between the relay and injected packets); nothing arriving
//     through a VXLAN device reaches the relay's own services (with a
//     subnet6, but for IPv6 neighbour discovery: the devices are
//     Ethernet-like and the member resolves the relay's inner address);
//   - forward: a member's device only carries its own inner address
//     (no inner spoofing), no member-to-member traffic, no new flow from
//     outside into a member's device, and the destination policy of the
//     WireGuard kind;
//   - MSS clamping both ways, masquerade of the subnet to the uplink;
//   - the ip6 table does the input filter for members reached over IPv6
//     (same rules on the IPv6 header) and, with a subnet6, the forward
//     part for the IPv6 inside (the ip table's rules on IPv6 headers, the
//     member's inner IPv6 address, subnet6's masquerade); without one it
//     drops IPv6 arriving through a VXLAN device.
//
// Both tables are replaced in the same batch.
func installEncapTable(c *nftables.Conn, subnet, subnet6 netip.Prefix, port, mtu int, pol Destinations, members []encapRule) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	const devs = EncapServerIfacePrefix
	accept := nftables.ChainPolicyAccept
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	// Before the usual filter priority so that another table's accept
	// cannot come first; policy accept leaves other traffic alone.
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10)
	for _, fam := range []tableFamily{tableIPv6, tableIPv4} {
		inside := subnet
		if fam.family == nftables.TableFamilyIPv6 {
			inside = subnet6
		}
		t := &nftables.Table{Family: fam.family, Name: EncapTableName}
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
		input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: prio, Policy: &accept})
		for _, m := range members {
			if m.member.Is4() != (fam.family == nftables.TableFamilyIPv4) {
				continue
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(
				matchAddr(fam.saddr, netip.PrefixFrom(m.member, m.member.BitLen())), matchUDPDport(port), matchVNI(m.vni),
				[]expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}})})
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(matchUDPDport(port), drop)})
		if fam.family == nftables.TableFamilyIPv6 && inside.IsValid() {
			for _, typ := range []byte{ndNeighborSolicit, ndNeighborAdvert} {
				c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(
					matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), matchND(typ),
					[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
			}
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(
			matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), drop)})
		if !inside.IsValid() {
			// No IPv6 inside: nothing IPv6 from a VXLAN device is forwarded.
			fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
			c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: concat(
				matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), drop)})
			continue
		}
		addEncapInside(c, t, fam, inside, mtu, pol, members)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables table %s: %w", EncapTableName, err)
	}
	return nil
}

// ICMPv6 neighbour discovery types (RFC 4861).
const (
	ndNeighborSolicit = 135
	ndNeighborAdvert  = 136
)

// matchND: ICMPv6 of type typ with hop limit 255 (RFC 4861 receivers drop
// anything else: it proves the packet was not forwarded).
func matchND(typ byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{typ}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{255}},
	}
}

// addEncapInside queues the forwarding of one family's inside (inner
// prefix inside) in table t: MSS clamps (MTU minus that family's headers,
// a member's own lower MTU too), the forward filter (no member to member,
// per member only its own inner address of the family, the destination
// policy: deny, the IPv6 embeddings of refused IPv4 ranges, allow,
// restricted) and the masquerade to the uplink. Drops are counted.
func addEncapInside(c *nftables.Conn, t *nftables.Table, f tableFamily, inside netip.Prefix, mtu int, pol Destinations, members []encapRule) {
	const devs = EncapServerIfacePrefix
	accept := nftables.ChainPolicyAccept
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	v4 := f.family == nftables.TableFamilyIPv4
	is := func(p netip.Prefix) bool { return p.Addr().Is4() == v4 }
	clamp := c.AddChain(&nftables.Chain{Name: "clamp", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	clampTo := func(iface []expr.Any, m int) {
		c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(iface, matchSYN(),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(m - f.headers))},
				writeMSS(),
			})})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq, devs), matchSYN(),
		[]expr.Any{
			&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
			writeMSS(),
		})})
	clampTo(matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), mtu)
	// A member over an IPv6 underlay has a smaller MTU: its own (lower)
	// clamp; the kernel only ever lowers an MSS, so both rules may match.
	for _, m := range members {
		if m.mtu != 0 && m.mtu != mtu {
			clampTo(matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, m.iface), m.mtu)
		}
	}

	filter := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
		matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs),
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq, devs), drop)})
	// Nothing from outside opens a connection to a member (as in the
	// WireGuard kind's table, nft.go): into the devices go the replies of
	// the members' own connections and ICMP errors about them.
	c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq, devs), newFlow(), drop)})
	for _, m := range members {
		own := m.inner
		if !v4 {
			own = m.inner6
		}
		if !own.IsValid() {
			// A member without an inner address of this family sends none.
			c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
				matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, m.iface), drop)})
			continue
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
			matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, m.iface),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: uint32(own.BitLen() / 8)},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: own.AsSlice()},
			}, drop)})
	}
	dropDst := func(p netip.Prefix) {
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
			matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), matchAddr(f.daddr, p), drop)})
	}
	for _, p := range pol.Deny {
		if is(p) {
			dropDst(p)
		}
	}
	if !v4 {
		// As in the WireGuard kind's ip6 table (nft.go): an allowed NAT64
		// or 6to4 range must not lead to IPv4 addresses the ip table
		// refuses.
		for _, p := range destination.Embedded(append(append([]netip.Prefix(nil), pol.Deny...), pol.Restricted...), pol.Allow) {
			dropDst(p)
		}
	}
	for _, p := range pol.Allow {
		if is(p) {
			c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
				matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), matchAddr(f.daddr, p),
				[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
		}
	}
	for _, p := range pol.Restricted {
		if is(p) {
			dropDst(p)
		}
	}

	nat := c.AddChain(&nftables.Chain{Name: "masquerade", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: concat(
		matchAddr(f.saddr, inside),
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpNeq, devs),
		[]expr.Any{&expr.Counter{}, &expr.Masq{}})})
}

// deleteEncapTables removes the ip and ip6 tables if present.
func deleteEncapTables(c *nftables.Conn) error {
	for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		t := &nftables.Table{Family: f, Name: EncapTableName}
		c.AddTable(t)
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete nftables tables %s: %w", EncapTableName, err)
	}
	return nil
}
