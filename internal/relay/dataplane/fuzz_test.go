package dataplane

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ctMessage builds a ctnetlink message body (nfgenmsg + attributes) of one
// connection: original source addr, destination port, mark, counters.
func ctMessage(af uint8, src netip.Addr, port uint16, mark uint32) []byte {
	ipType := uint16(ctaIPv4Src)
	if af == unix.AF_INET6 {
		ipType = ctaIPv6Src
	}
	ip, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: ipType, Data: src.AsSlice()}})
	pr, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: ctaProtoDst, Data: binary.BigEndian.AppendUint16(nil, port)}})
	tup, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NLA_F_NESTED | ctaTupleIP, Data: ip}, {Type: unix.NLA_F_NESTED | ctaTupleProto, Data: pr}})
	cnt, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: ctaCountersPackets, Data: binary.BigEndian.AppendUint64(nil, 3)},
		{Type: ctaCountersBytes, Data: binary.BigEndian.AppendUint64(nil, 300)}})
	body, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NLA_F_NESTED | ctaTupleOrig, Data: tup},
		{Type: unix.NLA_F_NESTED | ctaCountersOrig, Data: cnt},
		{Type: ctaMark, Data: binary.BigEndian.AppendUint32(nil, mark)},
		{Type: ctaID, Data: binary.BigEndian.AppendUint32(nil, 7)},
	})
	return append([]byte{af, unix.NFNETLINK_V0, 0, 0}, body...)
}

func TestParseCTFlowFamilies(t *testing.T) {
	for _, c := range []struct {
		af  uint8
		src string
	}{{unix.AF_INET, "10.0.1.1"}, {unix.AF_INET6, "fd00:1::1"}} {
		f, ok := parseCTFlow(ctMessage(c.af, netip.MustParseAddr(c.src), 40000, natMark))
		if !ok || f.Key != (Key{netip.MustParseAddr(c.src), 40000}) || f.Mark != natMark || f.Cnt != (Counter{3, 300}) || f.ID != 7 {
			t.Fatalf("%s: %+v %v", c.src, f, ok)
		}
	}
	// An IPv6 source in an AF_INET message (or the other way round) is no flow.
	b := ctMessage(unix.AF_INET6, netip.MustParseAddr("10.0.1.1"), 40000, natMark)
	if f, ok := parseCTFlow(b); ok {
		t.Fatalf("4-byte address under CTA_IP_V6_SRC accepted: %+v", f)
	}
	if _, ok := parseCTFlow(append([]byte{unix.AF_BRIDGE}, b[1:]...)); ok {
		t.Fatal("bridge family accepted")
	}
}

// FuzzParseCTFlow: conntrack messages (dumps and destroy events) of either
// family never crash the parser, and what it accepts names a valid key.
func FuzzParseCTFlow(f *testing.F) {
	f.Add(ctMessage(unix.AF_INET, netip.MustParseAddr("10.0.1.1"), 40000, natMark))
	f.Add(ctMessage(unix.AF_INET6, netip.MustParseAddr("fd00:1::1"), 40000, natMark))
	f.Add(ctMessage(unix.AF_INET6, netip.MustParseAddr("::ffff:10.0.1.1"), 1, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, ok := parseCTFlow(b)
		if ok && !fl.Key.Client.IsValid() {
			t.Fatalf("accepted a flow without a client address: %+v", fl)
		}
	})
}

// FuzzDecodeAddrPort: set keys read back from the kernel round-trip, of
// either family, and other lengths are refused.
func FuzzDecodeAddrPort(f *testing.F) {
	f.Add(encodeAddrPort(netip.MustParseAddr("10.0.1.1"), 40000))
	f.Add(encodeAddrPort(netip.MustParseAddr("fd00:1::1"), 40000))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, p, ok := decodeAddrPort(b)
		if !ok {
			if len(b) == 8 || len(b) == 20 {
				t.Fatalf("refused a key of %d bytes", len(b))
			}
			return
		}
		again := encodeAddrPort(a, p)
		if len(again) != len(b) || string(again[:len(again)-2]) != string(b[:len(b)-2]) {
			t.Fatalf("% x decodes to %v %d, re-encodes to % x", b, a, p, again)
		}
	})
}

// FuzzParseLink: rtnetlink link messages (the fast path's device list)
// never crash the parser, and an accepted link has a name.
func FuzzParseLink(f *testing.F) {
	name, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.IFLA_IFNAME, Data: []byte("r0\x00")}})
	ifi := make([]byte, unix.SizeofIfInfomsg)
	ifi[2] = unix.ARPHRD_ETHER
	f.Add(uint16(unix.RTM_NEWLINK), append(ifi, name...))
	f.Add(uint16(unix.RTM_DELLINK), append(ifi, name...))
	f.Fuzz(func(t *testing.T, typ uint16, b []byte) {
		l, ok := parseLink(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ)}, Data: b})
		if ok && l.name == "" {
			t.Fatalf("accepted a link without a name: %+v", l)
		}
	})
}
