package tunnel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/destination"
)

// TableName is the relay's nftables table for tunnel detours (family ip,
// and family ip6 beside it when the tunnel has an IPv6 subnet). A fixed
// name lets a restarted relay find and delete what a crashed one left.
const TableName = "mpdetour_tunnel"

// Destinations is the destination policy for traffic leaving the tunnel, with the
// NAT-detour policy's semantics (internal/relay): Deny is refused always,
// Restricted (private, loopback, link-local, multicast, the relay's own
// networks, ...) is refused unless Allow covers it. The relay passes the
// lists its NAT-detour policy uses, so one definition governs both kinds of
// detour. Each family's table takes that family's entries (IPv6 ones only
// matter with an IPv6 tunnel subnet).
type Destinations struct {
	Deny       []netip.Prefix
	Restricted []netip.Prefix
	Allow      []netip.Prefix
}

// Validate names the first bad entry.
func (p Destinations) Validate() error {
	for _, l := range []struct {
		name string
		ps   []netip.Prefix
	}{{"deny", p.Deny}, {"restricted", p.Restricted}, {"allow", p.Allow}} {
		for i, pr := range l.ps {
			if !pr.IsValid() {
				return fmt.Errorf("tunnel policy: %s entry %d is not a valid prefix", l.name, i)
			}
		}
	}
	return nil
}

func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// matchIface loads iifname/oifname and compares it with name.
func matchIface(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

// newFlow matches a packet whose connection is neither established nor
// related (ct state ! established,related): the first packet of a flow.
func newFlow() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
}

// matchAddr compares the address at offset (of p's family) under p's
// mask.
func matchAddr(offset uint32, p netip.Prefix) []expr.Any {
	p = p.Masked()
	a := p.Addr().AsSlice()
	n := uint32(len(a))
	mask := net.CIDRMask(p.Bits(), len(a)*8)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a},
	}
}

// tableFamily is what differs between the tunnel's ip and ip6 tables.
type tableFamily struct {
	family       nftables.TableFamily
	saddr, daddr uint32 // address offsets in the network header
	headers      int    // IP + TCP header bytes (MSS = MTU - headers)
	// reject for what is not TCP: ICMP type and code (administratively
	// prohibited / filtered)
	icmpType uint8
	icmpCode uint8
}

var (
	tableIPv4 = tableFamily{family: nftables.TableFamilyIPv4, saddr: 12, daddr: 16, headers: 40,
		icmpType: unix.NFT_REJECT_ICMP_UNREACH, icmpCode: 13} // ICMP_PKT_FILTERED
	tableIPv6 = tableFamily{family: nftables.TableFamilyIPv6, saddr: 8, daddr: 24, headers: 60,
		icmpType: unix.NFT_REJECT_ICMP_UNREACH, icmpCode: 1} // ICMPV6_ADM_PROHIBITED
)

// matchSYN: tcp flags syn / syn,rst (SYN and SYN-ACK, not RST).
func matchSYN() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x06}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}},
	}
}

// setMSS writes register 1 (host order for rt, network order for a
// constant) into the TCP MSS option. The kernel only ever lowers an MSS
// with this, so it acts as a clamp.
func writeMSS() expr.Any {
	return &expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2, SourceRegister: 1}
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// installTable (re)creates the relay's tunnel tables atomically: one
// netlink batch deletes any previous table of that name (both families) and
// adds the new ones (ip for subnet, ip6 for subnet6 when valid), so a
// failure leaves the old state and never a half-built table.
func installTable(c *nftables.Conn, iface string, subnet, subnet6 netip.Prefix, mtu int, pol Destinations) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	addTable(c, tableIPv4, iface, subnet, mtu, pol)
	if subnet6.IsValid() {
		t6 := &nftables.Table{Family: nftables.TableFamilyIPv6, Name: TableName}
		c.AddTable(t6)
		c.DelTable(t6)
		addTable(c, tableIPv6, iface, subnet6, mtu, pol)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables table %s: %w", TableName, err)
	}
	return nil
}

// addTable queues one family's table in c's transaction.
func addTable(c *nftables.Conn, f tableFamily, iface string, subnet netip.Prefix, mtu int, pol Destinations) {
	is := func(p netip.Prefix) bool { return p.Addr().Is4() == (f.family == nftables.TableFamilyIPv4) }
	t := &nftables.Table{Family: f.family, Name: TableName}
	// Adding then deleting makes the delete valid whether or not the table
	// exists, within the same transaction.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	clamp := c.AddChain(&nftables.Chain{Name: "clamp", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	// Toward the client: the route MTU into the tunnel is the tunnel MTU.
	c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(
		matchIface(expr.MetaKeyOIFNAME, expr.CmpOpEq, iface), matchSYN(),
		[]expr.Any{
			&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
			writeMSS(),
		})})
	// From the client toward the server the route MTU is the uplink's, so
	// clamp to the tunnel MTU explicitly: the server must not send segments
	// that do not fit the tunnel back to the client.
	mss := mtu - f.headers
	c.AddRule(&nftables.Rule{Table: t, Chain: clamp, Exprs: concat(
		matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, iface), matchSYN(),
		[]expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(mss))},
			writeMSS(),
		})})

	filter := c.AddChain(&nftables.Chain{Name: "destinations", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// A destination the policy refuses is answered where the protocol can:
	// a TCP reset for TCP (the client's connect or MPTCP join fails at
	// once: "connection refused"), ICMP administratively prohibited for the
	// rest (EHOSTUNREACH). Rejected packets are counted (the counters
	// name the rule's prefix: nft list chain ip mpdetour_tunnel
	// destinations). Answers are not rate limited here: the kernel's
	// icmp_ratelimit bounds the ICMP ones and a reset answers a packet the
	// client sent through its own tunnel.
	drop := func(p netip.Prefix) {
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
			matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, iface), matchAddr(f.daddr, p),
			[]expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Counter{}, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})})
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
			matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, iface), matchAddr(f.daddr, p),
			[]expr.Any{&expr.Counter{}, &expr.Reject{Type: uint32(f.icmpType), Code: f.icmpCode}})})
	}
	// Client to client through the relay is not a detour.
	c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
		matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, iface),
		matchIface(expr.MetaKeyOIFNAME, expr.CmpOpEq, iface),
		[]expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})})
	// Nothing from outside opens a connection to a member: forwarded into
	// the tunnel are the replies of the members' own connections (and
	// ICMP errors about them), not new flows from whoever routes a
	// member's inner address to the relay's uplink.
	c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
		matchIface(expr.MetaKeyOIFNAME, expr.CmpOpEq, iface), newFlow(),
		[]expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})})
	for _, p := range pol.Deny {
		if is(p) {
			drop(p)
		}
	}
	if f.family == nftables.TableFamilyIPv6 {
		// An allowed NAT64 or 6to4 range must not lead to the IPv4
		// addresses the ip table refuses (destination.Check judges the
		// embedded IPv4 address; this table cannot recurse, so it drops
		// the embeddings of refused IPv4 prefixes before its accepts).
		for _, p := range destination.Embedded(append(append([]netip.Prefix(nil), pol.Deny...), pol.Restricted...), pol.Allow) {
			drop(p)
		}
	}
	// An accept only ends this chain: other tables' forward chains still
	// see the packet, as they would for a NAT detour.
	for _, p := range pol.Allow {
		if is(p) {
			c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: concat(
				matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, iface), matchAddr(f.daddr, p),
				[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
		}
	}
	for _, p := range pol.Restricted {
		if is(p) {
			drop(p)
		}
	}

	// The relay's own services (control port, ssh, ...) are not reachable
	// through the tunnel.
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(
		matchIface(expr.MetaKeyIIFNAME, expr.CmpOpEq, iface),
		[]expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})})

	nat := c.AddChain(&nftables.Chain{Name: "masquerade", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: concat(
		matchAddr(f.saddr, subnet),
		matchIface(expr.MetaKeyOIFNAME, expr.CmpOpNeq, iface),
		[]expr.Any{&expr.Counter{}, &expr.Masq{}})})
}

// deleteTable removes the tunnel tables (both families) if present. A
// kernel without nftables for IPv6 (CONFIG_NF_TABLES_IPV6) refuses the
// ip6 part: then only the ip table is deleted.
func deleteTable(c *nftables.Conn) error {
	del := func(fams ...nftables.TableFamily) error {
		for _, fam := range fams {
			t := &nftables.Table{Family: fam, Name: TableName}
			c.AddTable(t)
			c.DelTable(t)
		}
		if err := c.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete nftables table %s: %w", TableName, err)
		}
		return nil
	}
	if del(nftables.TableFamilyIPv4, nftables.TableFamilyIPv6) == nil {
		return nil
	}
	return del(nftables.TableFamilyIPv4)
}
