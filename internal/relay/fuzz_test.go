package relay

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Untrusted or external bytes the relay parses (issue 16 #14): its config
// file, the kernel's /proc/net/tcp, nftables element replies. Errors, never
// panics; what is accepted is consistent.

func FuzzRelayParseConfig(f *testing.F) {
	f.Add([]byte("listen: 0.0.0.0:45673\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nmembers:\n  - {name: a, public_key: mN2TeWHHug6AVNfO1hbb4+4npFJSyQH6lJZp/9ysN3s=}\n"))
	f.Add([]byte("members: []\nlegacy_v1: {enabled: true}\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nports: 1-2\nlease: 2s\n"))
	f.Add([]byte("tunnel: {subnet: 100.80.0.0/16}\nquota: {per_member: -1}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseConfig(b)
		if err != nil {
			return
		}
		if s.PortLo == 0 || s.PortLo > s.PortHi || s.Lease <= 0 || (len(s.Members) == 0 && !s.Legacy) {
			t.Fatalf("accepted an inconsistent config: %+v", s)
		}
	})
}

func FuzzParseProcNetTCP(f *testing.F) {
	f.Add([]byte("  sl  local_address rem_address   st\n   0: 00000000:1F90 00000000:0000 0A\n   1: 0100007F:0035 00000000:0000 0A\n"))
	f.Add([]byte("hdr\n 0: zz 0 0A\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ports := map[uint16]bool{}
		_ = parseProcNetTCP(bufio.NewScanner(bytes.NewReader(b)), ports)
	})
}

func FuzzParseElemReply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x02, 0, 0, 0, 0x08, 0, 0x01, 0, 'x', 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		out := map[mapKey]Counter{}
		_ = parseElemReply(b, out)
	})
}

// ctMessage builds a ctnetlink message body as the kernel sends it
// (nfgenmsg + attributes, nested ones flagged).
func ctMessage(t testing.TB, src [4]byte, dport uint16, mark uint32, bytesOrig, bytesReply uint64) []byte {
	t.Helper()
	m := func(as []netlink.Attribute) []byte {
		b, err := netlink.MarshalAttributes(as)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	be16 := binary.BigEndian.AppendUint16
	be32 := binary.BigEndian.AppendUint32
	be64 := binary.BigEndian.AppendUint64
	tuple := m([]netlink.Attribute{
		{Type: unix.NLA_F_NESTED | ctaTupleIP, Data: m([]netlink.Attribute{{Type: ctaIPv4Src, Data: src[:]}, {Type: 2, Data: []byte{10, 0, 1, 2}}})},
		{Type: unix.NLA_F_NESTED | ctaTupleProto, Data: m([]netlink.Attribute{{Type: 1, Data: []byte{6}}, {Type: 2, Data: be16(nil, 5555)}, {Type: ctaProtoDst, Data: be16(nil, dport)}})},
	})
	counters := func(b uint64) []byte {
		return m([]netlink.Attribute{{Type: ctaCountersPackets, Data: be64(nil, 3)}, {Type: ctaCountersBytes, Data: be64(nil, b)}})
	}
	body := m([]netlink.Attribute{
		{Type: unix.NLA_F_NESTED | ctaTupleOrig, Data: tuple},
		{Type: ctaMark, Data: be32(nil, mark)},
		{Type: unix.NLA_F_NESTED | ctaCountersOrig, Data: counters(bytesOrig)},
		{Type: unix.NLA_F_NESTED | ctaCountersReply, Data: counters(bytesReply)},
		{Type: ctaID, Data: be32(nil, 77)},
	})
	return append([]byte{unix.AF_INET, unix.NFNETLINK_V0, 0, 0}, body...)
}

func TestParseCTFlow(t *testing.T) {
	f, ok := parseCTFlow(ctMessage(t, [4]byte{10, 0, 1, 1}, 40000, natMark|1, 1000, 200))
	want := ctFlow{ID: 77, Key: mapKey{netip.MustParseAddr("10.0.1.1"), 40000}, Mark: natMark | 1, Cnt: Counter{Packets: 6, Bytes: 1200}}
	if !ok || f != want {
		t.Fatalf("parseCTFlow = %+v %v, want %+v", f, ok, want)
	}
	if _, ok := parseCTFlow([]byte{unix.AF_INET6, 0, 0, 0}); ok {
		t.Fatal("IPv6 message accepted")
	}
}

func FuzzParseCTFlow(f *testing.F) {
	f.Add(ctMessage(f, [4]byte{10, 0, 1, 1}, 40000, natMark, 1000, 200))
	f.Add([]byte{unix.AF_INET, 0, 0, 0, 4, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if fl, ok := parseCTFlow(b); ok && !fl.Key.Client.Is4() {
			t.Fatalf("accepted a flow without an IPv4 source: %+v", fl)
		}
	})
}

func FuzzParseLink(f *testing.F) {
	msg := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint16(msg[2:], unix.ARPHRD_ETHER)
	attrs, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.IFLA_IFNAME, Data: []byte("r0\x00")}})
	f.Add(uint16(unix.RTM_NEWLINK), append(msg, attrs...))
	f.Fuzz(func(t *testing.T, typ uint16, b []byte) {
		l, ok := parseLink(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ)}, Data: b})
		if ok && l.name == "" {
			t.Fatal("accepted a link without a name")
		}
	})
}
