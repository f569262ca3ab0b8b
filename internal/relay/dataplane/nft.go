// Package dataplane is the relay's kernel side of NAT detours: one
// nftables table per address family the relay owns (`ip` and `ip6`, both
// named TableName: DNAT map, per-mapping counters, optional flowtable fast
// path with conntrack accounting), behind the DataPlane interface. Fake is the in-memory implementation the relay's unit tests
// use; the nftables one (NewNFT) keeps namespace tests of its own.
package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table the relay owns, once in family ip (IPv4
// detours) and once in family ip6 (IPv6 detours, DNAT66 and masquerade).
// Nothing else should put anything in them: the relay deletes both at start
// and at exit (with a state_file, a stop leaves them for the next start:
// handover.go). Both are created, replaced and deleted in one transaction.
//
// Two tables rather than one inet table: the IPv4 table keeps the layout
// (and the `nft list table ip mpdetour_relay` view) of relays before IPv6,
// so an upgrade's handover adopts it unchanged, and each family's map keys
// have that family's address type (an inet table would need two maps too).
// A mapping never crosses families: conntrack NAT cannot translate IPv4 to
// IPv6, so a client reaches an IPv6 server through the relay's IPv6 address.
const TableName = "mpdetour_relay"

// Names inside the table (tests and docs refer to them).
const (
	DNATMapName = "detours" // client . detour port : server . port ("dnat", "fwd" are nft keywords)
	AcctSetName = "acct"    // client . detour port, with a counter per element
	// natMark is the packet-mark bit that tells postrouting to masquerade a
	// connection our prerouting rule DNATed (and nothing else).
	natMark uint32 = 0x4d500000
)

// Registers: a concatenation fills consecutive 32-bit registers (an IPv6
// address takes four: NFT_REG32_00..03, its port NFT_REG32_04).
const (
	reg32x0 = 8  // NFT_REG32_00
	regMark = 14 // NFT_REG32_06: past the key of either family
	regAux  = 1  // NFT_REG_1 (overlaps reg32x0..3; used before the key is loaded)
)

// family is what differs between the IPv4 and the IPv6 table.
type family struct {
	table   nftables.TableFamily
	nfproto uint8  // NFPROTO_IPV4 / NFPROTO_IPV6 (NAT expression)
	afinet  uint8  // AF_INET / AF_INET6 (raw netlink requests)
	alen    uint32 // address length
	saddr   uint32 // source address offset in the network header
	daddr   uint32 // destination address offset
	regPort uint32 // register after the address registers
	keyType nftables.SetDatatype
}

var families = [2]family{
	{table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4, afinet: unix.AF_INET, alen: 4, saddr: 12, daddr: 16,
		regPort: reg32x0 + 1, keyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)},
	{table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6, afinet: unix.AF_INET6, alen: 16, saddr: 8, daddr: 24,
		regPort: reg32x0 + 4, keyType: nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService)},
}

// familyOf returns the index in families of a's family.
func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// tables are one family's objects in the kernel.
type tables struct {
	tab  *nftables.Table
	dnat *nftables.Set
	acct *nftables.Set
	fwd  *nftables.Chain
	ft   *nftables.Flowtable // nil: fast path off or refused
}

// Key identifies a mapping in the data plane: the client's address and
// the detour port it connects to.
type Key struct {
	Client netip.Addr
	Port   uint16
}

func (k Key) String() string { return netip.AddrPortFrom(k.Client, k.Port).String() }

// Counter is what the kernel counted on a mapping (both directions).
type Counter struct{ Packets, Bytes uint64 }

// Mapping is what the data plane needs of a granted detour: connections of
// Key.Client to the relay's port Key.Port go to Server.
type Mapping struct {
	Key    Key
	Server netip.AddrPort
}

// DataPlane is the kernel side of mappings. The nftables implementation is
// the only one in product code (Fake is the tests'); keeping the interface
// small keeps the lease logic testable on its own.
type DataPlane interface {
	// Map installs mappings (DNAT element + accounting element) in one
	// transaction: all or none.
	Map(ms []Mapping) error
	// Unmap removes the DNAT elements: new connections stop, established
	// ones continue through conntrack and stay counted until Forget.
	Unmap(keys []Key) error
	// Counters dumps every per-mapping counter (cost grows with the
	// number of mappings: seconds at 100,000).
	Counters() (map[Key]Counter, error)
	// CountersOf reads the counters of the given (existing) mappings only.
	CountersOf(keys []Key) (map[Key]Counter, error)
	// Forget removes accounting elements.
	Forget(keys []Key) error
	// Exists says whether the table is still installed (someone may
	// delete it: nft flush ruleset, another tool, a second relay).
	Exists() (bool, error)
	// Recreate installs the table afresh with ms mapped.
	Recreate(ms []Mapping) error
	// Close removes the table.
	Close() error
	// Leave closes the data plane's sockets but leaves the table and its
	// mappings in the kernel, for the next start to adopt (a graceful
	// restart: established connections keep their NAT).
	Leave() error
}

type nftDataPlane struct {
	mu   sync.Mutex
	log  *slog.Logger
	conn *nftables.Conn
	get  *netlink.Conn // element reads (nftget.go), conntrack dumps (ctacct.go)
	fam  [2]tables     // by familyOf

	// fast path (fastpath.go); zero when off
	fast  bool
	ct    *ctAccount // attribution through conntrack accounting
	devs  []string   // the flowtables' devices
	links *linkWatch
}

// Options are the data plane's settings.
type Options struct {
	// FastPath offloads established detour connections to a software
	// flowtable and counts them through conntrack (docs/relay.md).
	FastPath bool
	Log      *slog.Logger // nil: discard
}

// NewNFT deletes whatever an earlier run left (crash, kill -9, a graceful
// stop's Leave) and creates the table afresh, in one atomic transaction: the
// NAT hooks stay registered throughout, so connections the earlier table
// translated keep their translation (conntrack holds it).
func NewNFT(opt Options) (*nftDataPlane, error) {
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	get, err := dialNetfilter()
	if err != nil {
		_ = conn.CloseLasting()
		return nil, fmt.Errorf("nftables: %w", err)
	}
	d := &nftDataPlane{conn: conn, get: get, log: opt.Log, fast: opt.FastPath}
	if d.fast {
		if err := d.startFastPath(); err != nil {
			_ = conn.CloseLasting()
			get.Close()
			return nil, err
		}
	}
	if err := d.install(); err != nil {
		d.stopFastPath()
		_ = conn.CloseLasting()
		get.Close()
		return nil, err
	}
	return d, nil
}

// Exists implements DataPlane.
func (d *nftDataPlane) Exists() (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Both tables must be there: a missing one is recreated with both.
	for i, f := range families {
		if !d.has(i) {
			continue
		}
		tabs, err := d.conn.ListTablesOfFamily(f.table)
		if err != nil {
			return false, fmt.Errorf("nftables: listing tables: %w", err)
		}
		if !slices.ContainsFunc(tabs, func(t *nftables.Table) bool { return t.Name == TableName }) {
			return false, nil
		}
	}
	return true, nil
}

// Recreate implements DataPlane.
func (d *nftDataPlane) Recreate(ms []Mapping) error {
	d.mu.Lock()
	err := d.install()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return d.Map(ms)
}

// install deletes the tables if present and creates them afresh, in one
// atomic transaction. Called with d.mu held (or before d is shared).
func (d *nftDataPlane) install() error {
	for i, f := range families {
		d.fam[i] = d.addTable(f)
	}
	if err := d.conn.Flush(); err != nil {
		// A kernel without nftables for IPv6 (CONFIG_NF_TABLES_IPV6)
		// refuses the whole batch: the relay still serves IPv4.
		d.fam[0], d.fam[1] = d.addTable(families[0]), tables{}
		if err4 := d.conn.Flush(); err4 != nil {
			return fmt.Errorf("nftables: creating table %s: %w", TableName, err4)
		}
		d.log.Warn("nftables: the kernel refused the ip6 table: IPv6 NAT detours unavailable, IPv4 ones served", "err", err)
		d.dropLeftover(families[1])
	}
	if d.fast {
		d.installFlowtables()
	}
	return nil
}

// dropLeftover deletes family f's table if an earlier run left one (a
// crash before this kernel refused the family, or a kernel that takes the
// table but not all of its chains), in a transaction of its own. Best
// effort: a kernel without the family has no such table, and its refusal
// is only logged.
func (d *nftDataPlane) dropLeftover(f family) {
	t := &nftables.Table{Name: TableName, Family: f.table}
	d.conn.AddTable(t)
	d.conn.DelTable(t)
	if err := d.conn.Flush(); err != nil {
		d.log.Debug("nftables: could not delete a leftover table of the refused family", "family", f.table, "err", err)
	}
}

// has says whether family i's table is installed (ip always; ip6 unless
// the kernel refused it).
func (d *nftDataPlane) has(i int) bool { return d.fam[i].tab != nil }

// addTable queues one family's table (replacing a leftover) in d.conn's
// transaction.
func (d *nftDataPlane) addTable(f family) tables {
	conn := d.conn
	t := tables{tab: &nftables.Table{Name: TableName, Family: f.table}}
	// add+delete removes a leftover table without failing when there is none.
	conn.AddTable(t.tab)
	conn.DelTable(t.tab)
	conn.AddTable(t.tab)
	t.dnat = &nftables.Set{Table: t.tab, Name: DNATMapName, IsMap: true, Concatenation: true,
		KeyType: f.keyType, DataType: f.keyType}
	t.acct = &nftables.Set{Table: t.tab, Name: AcctSetName, Concatenation: true, Counter: true,
		KeyType: f.keyType}
	// AddSet fails only on a set without a name or key type.
	_ = conn.AddSet(t.dnat, nil)
	_ = conn.AddSet(t.acct, nil)
	pre := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t.tab, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := conn.AddChain(&nftables.Chain{Name: "postrouting", Table: t.tab, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	t.fwd = conn.AddChain(&nftables.Chain{Name: "forward", Table: t.tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})

	// prerouting: meta l4proto tcp fib daddr type local
	//   meta mark set meta mark | natMark dnat ip to ip saddr . tcp dport map @dnat
	// (ip6: dnat ip6 to ip6 saddr . tcp dport map @dnat). The map lookup is a
	// hash lookup: O(1) whatever the number of mappings. In ip6, meta
	// l4proto and the transport header offset are those after any
	// extension headers (the kernel walks them, ipv6_find_hdr), so a TCP
	// segment behind hop-by-hop or destination options is matched like one
	// without; fragments are reassembled by conntrack before NAT.
	dnatRule := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regAux},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Fib{Register: regAux, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		&expr.Payload{DestRegister: reg32x0, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.alen},
		&expr.Payload{DestRegister: f.regPort, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg32x0, DestRegister: reg32x0, IsDestRegSet: true, SetName: t.dnat.Name, SetID: t.dnat.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regMark},
		&expr.Bitwise{SourceRegister: regMark, DestRegister: regMark, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^natMark), Xor: binaryutil.NativeEndian.PutUint32(natMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regMark},
	}
	if d.fast {
		// ... ct mark set ct mark | natMark: the connection stays
		// recognisable for the offload rule and the conntrack dump.
		dnatRule = append(dnatRule,
			&expr.Ct{Key: expr.CtKeyMARK, Register: regMark},
			&expr.Bitwise{SourceRegister: regMark, DestRegister: regMark, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(^natMark), Xor: binaryutil.NativeEndian.PutUint32(natMark)},
			&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: regMark})
	}
	dnatRule = append(dnatRule,
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.nfproto), RegAddrMin: reg32x0, RegProtoMin: f.regPort, Specified: true})
	conn.AddRule(&nftables.Rule{Table: t.tab, Chain: pre, Exprs: dnatRule})
	// postrouting: meta mark & natMark == natMark masquerade
	conn.AddRule(&nftables.Rule{Table: t.tab, Chain: post, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: regAux},
		&expr.Bitwise{SourceRegister: regAux, DestRegister: regAux, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(natMark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: binaryutil.NativeEndian.PutUint32(natMark)},
		&expr.Masq{},
	}})
	if d.fast {
		// Attribution through conntrack (ctacct.go): no per-packet
		// accounting rule. This rule never matches; reading "ct bytes" in
		// the ruleset turns conntrack accounting on in the namespace. In the
		// NAT chain it is evaluated once per connection.
		conn.AddRule(&nftables.Rule{Table: t.tab, Chain: post, Exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeyBYTES, Register: regAux},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
			&expr.Counter{},
		}})
		return t
	}
	// forward: every forwarded packet of a DNATed connection, both
	// directions, bumps the counter of its mapping's element:
	//   ct status dnat ct direction original ip saddr . ct original proto-dst @acct
	//   ct status dnat ct direction reply ip daddr . ct original proto-dst @acct
	// (Keyed on packet addresses rather than "ct original ip saddr" because
	// the nft CLI of Debian 12 aborts when listing a ct address in a concat.)
	for _, dir := range []struct {
		dir byte
		off uint32
	}{{0, f.saddr}, {1, f.daddr}} {
		conn.AddRule(&nftables.Rule{Table: t.tab, Chain: t.fwd, Exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeySTATUS, Register: regAux},
			&expr.Bitwise{SourceRegister: regAux, DestRegister: regAux, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: regAux, Data: make([]byte, 4)},
			&expr.Ct{Key: expr.CtKeyDIRECTION, Register: regAux},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: []byte{dir.dir}},
			&expr.Payload{DestRegister: reg32x0, Base: expr.PayloadBaseNetworkHeader, Offset: dir.off, Len: f.alen},
			&expr.Ct{Key: expr.CtKeyPROTODST, Direction: 0, Register: f.regPort},
			&expr.Lookup{SourceRegister: reg32x0, SetName: t.acct.Name, SetID: t.acct.ID},
		}})
	}
	return t
}

// IPS_DST_NAT from linux/netfilter/nf_conntrack_common.h.
const ipsDstNAT = 1 << 5

// encodeAddrPort is a set key or value: the address, then the port padded
// to a 32-bit register (8 bytes for IPv4, 20 for IPv6).
func encodeAddrPort(a netip.Addr, port uint16) []byte {
	b := append(a.AsSlice(), 0, 0, 0, 0)
	binary.BigEndian.PutUint16(b[len(b)-4:], port)
	return b
}

// decodeAddrPort reads what encodeAddrPort wrote (its length says the
// family).
func decodeAddrPort(b []byte) (netip.Addr, uint16, bool) {
	switch len(b) {
	case 8:
		return netip.AddrFrom4([4]byte(b[:4])), binary.BigEndian.Uint16(b[4:]), true
	case 20:
		return netip.AddrFrom16([16]byte(b[:16])), binary.BigEndian.Uint16(b[16:]), true
	}
	return netip.Addr{}, 0, false
}

// checkMapping refuses what the kernel tables cannot hold: a mapping must
// stay within one family, and IPv4 is written as IPv4 (an IPv4-mapped IPv6
// address would land in the ip6 table and lead nowhere).
func checkMapping(m Mapping) error {
	c, s := m.Key.Client, m.Server.Addr()
	switch {
	case !c.IsValid() || !s.IsValid():
		return fmt.Errorf("mapping %v -> %v: missing address", m.Key, m.Server)
	case c.Is4In6() || s.Is4In6():
		return fmt.Errorf("mapping %v -> %v: IPv4-mapped IPv6 address (use the IPv4 address)", m.Key, m.Server)
	case c.Zone() != "" || s.Zone() != "":
		return fmt.Errorf("mapping %v -> %v: address with a zone", m.Key, m.Server)
	case c.Is4() != s.Is4():
		return fmt.Errorf("mapping %v -> %v: client and server of different families (NAT cannot translate between IPv4 and IPv6)", m.Key, m.Server)
	}
	return nil
}

// byFamily splits keys by family (index as in families).
func byFamily(keys []Key) [2][]Key {
	var out [2][]Key
	for _, k := range keys {
		i := familyOf(k.Client)
		out[i] = append(out[i], k)
	}
	return out
}

func (d *nftDataPlane) Map(ms []Mapping) error {
	if len(ms) == 0 {
		return nil
	}
	var dn, ac [2][]nftables.SetElement
	for _, m := range ms {
		if err := checkMapping(m); err != nil {
			return err
		}
		i := familyOf(m.Key.Client)
		if !d.has(i) {
			return fmt.Errorf("mapping %v -> %v: no IPv6 data plane (the kernel refused the ip6 table)", m.Key, m.Server)
		}
		k := encodeAddrPort(m.Key.Client, m.Key.Port)
		dn[i] = append(dn[i], nftables.SetElement{Key: k, Val: encodeAddrPort(m.Server.Addr(), m.Server.Port())})
		ac[i] = append(ac[i], nftables.SetElement{Key: k})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// One transaction for both families: all or none.
	for i := range families {
		if len(dn[i]) == 0 {
			continue
		}
		if err := d.conn.SetAddElements(d.fam[i].dnat, dn[i]); err != nil {
			return err
		}
		if !d.fast {
			if err := d.conn.SetAddElements(d.fam[i].acct, ac[i]); err != nil {
				return err
			}
		}
	}
	if err := d.conn.Flush(); err != nil {
		return err
	}
	if d.fast {
		keys := make([]Key, len(ms))
		for i, m := range ms {
			keys[i] = m.Key
		}
		d.ct.add(keys)
	}
	return nil
}

func keyElems(keys []Key) []nftables.SetElement {
	el := make([]nftables.SetElement, 0, len(keys))
	for _, k := range keys {
		el = append(el, nftables.SetElement{Key: encodeAddrPort(k.Client, k.Port)})
	}
	return el
}

// deleteElems removes keys from the set of their family (dnat or acct) in
// one transaction.
func (d *nftDataPlane) deleteElems(keys []Key, set func(*tables) *nftables.Set) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, ks := range byFamily(keys) {
		if len(ks) == 0 || !d.has(i) {
			continue
		}
		if err := d.conn.SetDeleteElements(set(&d.fam[i]), keyElems(ks)); err != nil {
			return err
		}
	}
	return d.conn.Flush()
}

func (d *nftDataPlane) Unmap(keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	return d.deleteElems(keys, func(t *tables) *nftables.Set { return t.dnat })
}

func (d *nftDataPlane) Forget(keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	if d.fast {
		d.ct.forget(keys)
		return nil
	}
	return d.deleteElems(keys, func(t *tables) *nftables.Set { return t.acct })
}

func (d *nftDataPlane) Counters() (map[Key]Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast {
		return d.ct.counters(d.get, nil)
	}
	out := map[Key]Counter{}
	for i := range families {
		if !d.has(i) {
			continue
		}
		els, err := d.conn.GetSetElements(d.fam[i].acct)
		if err != nil {
			return nil, fmt.Errorf("nftables: reading counters: %w", err)
		}
		for _, e := range els {
			a, p, ok := decodeAddrPort(e.Key)
			if !ok {
				continue
			}
			var c Counter
			if e.Counter != nil {
				c = Counter{Packets: e.Counter.Packets, Bytes: e.Counter.Bytes}
			}
			out[Key{a, p}] = c
		}
	}
	return out, nil
}

func (d *nftDataPlane) CountersOf(keys []Key) (map[Key]Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast {
		return d.ct.counters(d.get, keys)
	}
	out := make(map[Key]Counter, len(keys))
	for i, ks := range byFamily(keys) {
		if len(ks) > 0 && !d.has(i) {
			return nil, fmt.Errorf("nftables: no ip6 table for %v", ks[0])
		}
		if err := countersOf(d.get, families[i], ks, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *nftDataPlane) Close() error {
	d.stopFastPath()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.get.Close()
	for i := range d.fam {
		if d.has(i) {
			d.conn.DelTable(d.fam[i].tab)
		}
	}
	err := d.conn.Flush()
	if errors.Is(err, unix.ENOENT) {
		err = nil
	}
	_ = d.conn.CloseLasting()
	return err
}

// Leave implements DataPlane.
func (d *nftDataPlane) Leave() error {
	d.stopFastPath()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.get.Close()
	return d.conn.CloseLasting()
}
