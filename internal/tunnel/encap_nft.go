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
)

// encapRule is what the table needs to know of one member.
type encapRule struct {
	iface  string
	member netip.Addr // underlay source the relay accepts
	inner  netip.Addr // the member's inner address
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
//     through a VXLAN device reaches the relay's own services;
//   - forward: a member's device only carries its own inner address
//     (no inner spoofing), no member-to-member traffic, and the destination
//     policy of the WireGuard kind;
//   - MSS clamping both ways, masquerade of the subnet to the uplink;
//   - the ip6 table does the input filter for members reached over IPv6
//     (same rules on the IPv6 header) and drops IPv6 arriving through a
//     VXLAN device (the inside is IPv4 only).
//
// Both tables are replaced in the same batch.
func installEncapTable(c *nftables.Conn, subnet netip.Prefix, port, mtu int, pol Destinations, members []encapRule) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	const devs = EncapServerIfacePrefix
	accept := nftables.ChainPolicyAccept
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	// Before the usual filter priority so that another table's accept
	// cannot come first; policy accept leaves other traffic alone.
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10)
	var t *nftables.Table
	for _, fam := range []tableFamily{tableIPv6, tableIPv4} {
		t = &nftables.Table{Family: fam.family, Name: EncapTableName}
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
		c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(
			matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), drop)})
		if fam.family == nftables.TableFamilyIPv6 {
			fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
			c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: concat(
				matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), drop)})
		}
	}
	// t is the ip table from here on: the inside is IPv4.

	clamp := c.AddChain(&nftables.Chain{Name: "clamp", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq, devs), matchSYN(),
		[]expr.Any{
			&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
			writeMSS(),
		})})
	c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(
		matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), matchSYN(),
		[]expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(mtu - 40))},
			writeMSS(),
		})})
	// A member over an IPv6 underlay has a smaller MTU: its own (lower)
	// clamp; the kernel only ever lowers an MSS, so both rules may match.
	for _, m := range members {
		if m.mtu != 0 && m.mtu != mtu {
			c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(
				matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, m.iface), matchSYN(),
				[]expr.Any{
					&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(m.mtu - 40))},
					writeMSS(),
				})})
		}
	}

	filter := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
		matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs),
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq, devs), drop)})
	for _, m := range members {
		a := m.inner.As4()
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
			matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, m.iface),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a[:]},
			}, drop)})
	}
	dropDst := func(p netip.Prefix) {
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
			matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), matchAddr(16, p), drop)})
	}
	for _, p := range pol.Deny {
		if p.Addr().Is4() {
			dropDst(p)
		}
	}
	for _, p := range pol.Allow {
		if p.Addr().Is4() {
			c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
				matchIfacePrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq, devs), matchAddr(16, p),
				[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
		}
	}
	for _, p := range pol.Restricted {
		if p.Addr().Is4() {
			dropDst(p)
		}
	}

	nat := c.AddChain(&nftables.Chain{Name: "masquerade", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: concat(
		matchAddr(12, subnet),
		matchIfacePrefix(expr.MetaKeyOIFNAME, expr.CmpOpNeq, devs),
		[]expr.Any{&expr.Counter{}, &expr.Masq{}})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables table %s: %w", EncapTableName, err)
	}
	return nil
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
