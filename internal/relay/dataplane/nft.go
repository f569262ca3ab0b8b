// Package dataplane is the relay's kernel side of NAT detours: one
// nftables table the relay owns (DNAT map, per-mapping counters, optional
// flowtable fast path with conntrack accounting), behind the DataPlane
// interface. Fake is the in-memory implementation the relay's unit tests
// use; the nftables one (NewNFT) keeps namespace tests of its own.
package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table the relay owns (family ip). Nothing else
// should put anything in it: the relay deletes it at start and at exit
// (with a state_file, a stop leaves it for the next start: handover.go).
const TableName = "mpdetour_relay"

// Names inside the table (tests and docs refer to them).
const (
	DNATMapName = "detours" // client . detour port : server . port ("dnat", "fwd" are nft keywords)
	AcctSetName = "acct"    // client . detour port, with a counter per element
	// natMark is the packet-mark bit that tells postrouting to masquerade a
	// connection our prerouting rule DNATed (and nothing else).
	natMark uint32 = 0x4d500000
)

// Registers: a concatenation fills consecutive 32-bit registers.
const (
	reg32x0 = 8 // NFT_REG32_00
	reg32x1 = 9 // NFT_REG32_01
	regAux  = 1 // NFT_REG_1 (overlaps reg32x0..3; used before the key is loaded)
)

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
	tab  *nftables.Table
	dnat *nftables.Set
	acct *nftables.Set
	fwd  *nftables.Chain

	// fast path (fastpath.go); zero when off
	fast  bool
	ct    *ctAccount          // attribution through conntrack accounting
	ft    *nftables.Flowtable // nil: the kernel refused it (no nf_flow_table)
	devs  []string            // the flowtable's devices
	links *linkWatch
}

// Options are the data plane's settings.
type Options struct {
	// FastPath offloads established detour connections to a software
	// flowtable and counts them through conntrack (docs/relay.md).
	FastPath bool
	Log      *slog.Logger // nil: discard
}

var concatAddrPort = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)

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
	tabs, err := d.conn.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("nftables: listing tables: %w", err)
	}
	for _, t := range tabs {
		if t.Name == TableName {
			return true, nil
		}
	}
	return false, nil
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

// install deletes the table if present and creates it afresh, in one
// atomic transaction. Called with d.mu held (or before d is shared).
func (d *nftDataPlane) install() error {
	conn := d.conn
	d.tab = &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
	// add+delete removes a leftover table without failing when there is none.
	conn.AddTable(d.tab)
	conn.DelTable(d.tab)
	conn.AddTable(d.tab)
	d.dnat = &nftables.Set{Table: d.tab, Name: DNATMapName, IsMap: true, Concatenation: true,
		KeyType: concatAddrPort, DataType: concatAddrPort}
	d.acct = &nftables.Set{Table: d.tab, Name: AcctSetName, Concatenation: true, Counter: true,
		KeyType: concatAddrPort}
	if err := conn.AddSet(d.dnat, nil); err != nil {
		return fmt.Errorf("nftables: dnat map: %w", err)
	}
	if err := conn.AddSet(d.acct, nil); err != nil {
		return fmt.Errorf("nftables: acct set: %w", err)
	}
	pre := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: d.tab, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := conn.AddChain(&nftables.Chain{Name: "postrouting", Table: d.tab, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	d.fwd = conn.AddChain(&nftables.Chain{Name: "forward", Table: d.tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})

	// prerouting: meta l4proto tcp fib daddr type local
	//   meta mark set meta mark | natMark dnat ip to ip saddr . tcp dport map @dnat
	// The map lookup is a hash lookup: O(1) whatever the number of mappings.
	dnatRule := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regAux},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Fib{Register: regAux, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		&expr.Payload{DestRegister: reg32x0, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: reg32x1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg32x0, DestRegister: reg32x0, IsDestRegSet: true, SetName: d.dnat.Name, SetID: d.dnat.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 10},
		&expr.Bitwise{SourceRegister: 10, DestRegister: 10, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^natMark), Xor: binaryutil.NativeEndian.PutUint32(natMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 10},
	}
	if d.fast {
		// ... ct mark set ct mark | natMark: the connection stays
		// recognisable for the offload rule and the conntrack dump.
		dnatRule = append(dnatRule,
			&expr.Ct{Key: expr.CtKeyMARK, Register: 10},
			&expr.Bitwise{SourceRegister: 10, DestRegister: 10, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(^natMark), Xor: binaryutil.NativeEndian.PutUint32(natMark)},
			&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 10})
	}
	dnatRule = append(dnatRule,
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg32x0, RegProtoMin: reg32x1, Specified: true})
	conn.AddRule(&nftables.Rule{Table: d.tab, Chain: pre, Exprs: dnatRule})
	// postrouting: meta mark & natMark == natMark masquerade
	conn.AddRule(&nftables.Rule{Table: d.tab, Chain: post, Exprs: []expr.Any{
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
		conn.AddRule(&nftables.Rule{Table: d.tab, Chain: post, Exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeyBYTES, Register: regAux},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
			&expr.Counter{},
		}})
		if err := conn.Flush(); err != nil {
			return fmt.Errorf("nftables: creating table %s: %w", TableName, err)
		}
		d.installFlowtable()
		return nil
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
	}{{0, 12}, {1, 16}} {
		conn.AddRule(&nftables.Rule{Table: d.tab, Chain: d.fwd, Exprs: []expr.Any{
			&expr.Ct{Key: expr.CtKeySTATUS, Register: regAux},
			&expr.Bitwise{SourceRegister: regAux, DestRegister: regAux, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: regAux, Data: make([]byte, 4)},
			&expr.Ct{Key: expr.CtKeyDIRECTION, Register: regAux},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: []byte{dir.dir}},
			&expr.Payload{DestRegister: reg32x0, Base: expr.PayloadBaseNetworkHeader, Offset: dir.off, Len: 4},
			&expr.Ct{Key: expr.CtKeyPROTODST, Direction: 0, Register: reg32x1},
			&expr.Lookup{SourceRegister: reg32x0, SetName: d.acct.Name, SetID: d.acct.ID},
		}})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables: creating table %s: %w", TableName, err)
	}
	return nil
}

// IPS_DST_NAT from linux/netfilter/nf_conntrack_common.h.
const ipsDstNAT = 1 << 5

func encodeAddrPort(a netip.Addr, port uint16) []byte {
	b := make([]byte, 8)
	v := a.As4()
	copy(b, v[:])
	binary.BigEndian.PutUint16(b[4:], port)
	return b
}

func decodeAddrPort(b []byte) (netip.Addr, uint16, bool) {
	if len(b) < 6 {
		return netip.Addr{}, 0, false
	}
	return netip.AddrFrom4([4]byte(b[:4])), binary.BigEndian.Uint16(b[4:]), true
}

func (d *nftDataPlane) Map(ms []Mapping) error {
	if len(ms) == 0 {
		return nil
	}
	dn := make([]nftables.SetElement, 0, len(ms))
	ac := make([]nftables.SetElement, 0, len(ms))
	for _, m := range ms {
		if !m.Key.Client.Is4() || !m.Server.Addr().Is4() {
			return fmt.Errorf("mapping %v -> %v: the data plane is IPv4 only", m.Key, m.Server)
		}
		k := encodeAddrPort(m.Key.Client, m.Key.Port)
		dn = append(dn, nftables.SetElement{Key: k, Val: encodeAddrPort(m.Server.Addr(), m.Server.Port())})
		ac = append(ac, nftables.SetElement{Key: k})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.conn.SetAddElements(d.dnat, dn); err != nil {
		return err
	}
	if d.fast {
		if err := d.conn.Flush(); err != nil {
			return err
		}
		keys := make([]Key, len(ms))
		for i, m := range ms {
			keys[i] = m.Key
		}
		d.ct.add(keys)
		return nil
	}
	if err := d.conn.SetAddElements(d.acct, ac); err != nil {
		return err
	}
	return d.conn.Flush()
}

func keyElems(keys []Key) []nftables.SetElement {
	el := make([]nftables.SetElement, 0, len(keys))
	for _, k := range keys {
		el = append(el, nftables.SetElement{Key: encodeAddrPort(k.Client, k.Port)})
	}
	return el
}

func (d *nftDataPlane) Unmap(keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.conn.SetDeleteElements(d.dnat, keyElems(keys)); err != nil {
		return err
	}
	return d.conn.Flush()
}

func (d *nftDataPlane) Forget(keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	if d.fast {
		d.ct.forget(keys)
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.conn.SetDeleteElements(d.acct, keyElems(keys)); err != nil {
		return err
	}
	return d.conn.Flush()
}

func (d *nftDataPlane) Counters() (map[Key]Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast {
		return d.ct.counters(d.get, nil)
	}
	els, err := d.conn.GetSetElements(d.acct)
	if err != nil {
		return nil, fmt.Errorf("nftables: reading counters: %w", err)
	}
	out := make(map[Key]Counter, len(els))
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
	return out, nil
}

func (d *nftDataPlane) CountersOf(keys []Key) (map[Key]Counter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fast {
		return d.ct.counters(d.get, keys)
	}
	return countersOf(d.get, keys)
}

func (d *nftDataPlane) Close() error {
	d.stopFastPath()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.get.Close()
	d.conn.DelTable(d.tab)
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
