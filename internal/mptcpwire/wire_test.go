package mptcpwire

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
)

func probe() *Segment {
	return &Segment{
		Src: netip.MustParseAddr("10.0.1.1"), Dst: netip.MustParseAddr("10.0.3.2"), TTL: 3, ID: 7,
		SrcPort: 40000, DstPort: 80, Seq: 0x01020304, Flags: SYN, Window: 64240,
		Options: []Option{
			{Kind: OptMSS, Data: []byte{0x05, 0xb4}}, {Kind: OptSACKPerm}, {Kind: OptNOP},
			{Kind: OptWScale, Data: []byte{7}}, CapableSYN(),
		},
	}
}

func TestRoundTrip(t *testing.T) {
	s := probe()
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// Checksums verify (the sum over a header with its checksum is 0xffff).
	if sum(b[:20], 0) != 0xffff {
		t.Fatalf("IP checksum does not verify")
	}
	if sum(b[20:], pseudo(s.Src, s.Dst, len(b)-20)) != 0xffff {
		t.Fatalf("TCP checksum does not verify")
	}
	got, trunc, err := ParseIPv4(b, false)
	if err != nil || trunc {
		t.Fatalf("parse: %v trunc %v", err, trunc)
	}
	if got.Src != s.Src || got.Dst != s.Dst || got.SrcPort != 40000 || got.DstPort != 80 || got.Seq != s.Seq || got.Flags != SYN || got.TTL != 3 {
		t.Fatalf("fields: %+v", got)
	}
	m := Meaningful(got.Options)
	if len(m) != 4 || !m[3].Equal(CapableSYN()) {
		t.Fatalf("options: %v", got.Options)
	}
	if _, ok := Find(got.Options, MPCapable); !ok {
		t.Fatal("MP_CAPABLE not found")
	}
	// A quote cut after 8 TCP bytes keeps ports and sequence number.
	q, trunc, err := ParseIPv4(b[:28], true)
	if err != nil || !trunc || q.Seq != s.Seq || q.SrcPort != 40000 {
		t.Fatalf("quote: %+v %v %v", q, trunc, err)
	}
	// Not as a full packet.
	if _, _, err := ParseIPv4(b[:28], false); err == nil {
		t.Fatal("a truncated packet parsed")
	}
	// A quote cut inside the options keeps the whole ones before the cut.
	q, trunc, err = ParseIPv4(b[:len(b)-3], true)
	if err != nil || !trunc || len(Meaningful(q.Options)) != 3 {
		t.Fatalf("quote cut in options: %v %v %v", q.Options, trunc, err)
	}
}

func TestStrippedLooksMissing(t *testing.T) {
	s := probe()
	b, _ := s.Marshal()
	// Overwrite MP_CAPABLE with NOPs as nftables' reset does.
	i := bytes.Index(b[40:], []byte{OptMPTCP, 4})
	if i < 0 {
		t.Fatal("option not found in bytes")
	}
	copy(b[40+i:], []byte{1, 1, 1, 1})
	got, _, err := ParseIPv4(b, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := Find(got.Options, MPCapable); ok {
		t.Fatal("stripped option still found")
	}
	if len(Meaningful(got.Options)) != 3 {
		t.Fatalf("options: %v", got.Options)
	}
}

func TestOptions(t *testing.T) {
	j, err := ParseJoin(JoinSYN(3, true, 0xdeadbeef, 42))
	if err != nil || j.Stage != "SYN" || j.Token != 0xdeadbeef || j.Nonce != 42 || !j.Backup || j.AddrID != 3 {
		t.Fatalf("join: %+v %v", j, err)
	}
	j, err = ParseJoin(JoinACK([20]byte{1, 2}))
	if err != nil || j.Stage != "ACK" || len(j.MAC) != 20 || j.MAC[1] != 2 {
		t.Fatalf("join ack: %+v %v", j, err)
	}
	a := netip.MustParseAddr("10.9.9.9")
	for _, c := range []struct {
		port uint16
		echo bool
	}{{0, false}, {8080, false}, {0, true}, {8080, true}} {
		o := AddAddrOpt(5, a, c.port, c.echo, 0x1122334455667788)
		got, err := ParseAddAddr(o)
		if err != nil || got.Addr != a || got.Port != c.port || got.Echo != c.echo || got.HasHMAC == c.echo || (!c.echo && got.HMAC != 0x1122334455667788) {
			t.Fatalf("%+v: %+v %v", c, got, err)
		}
	}
	if o := RemoveAddrOpt(1, 2); o.Subtype() != RemoveAddr || o.Len() != 5 {
		t.Fatalf("remove: %v", o)
	}
	syn := make([]byte, 10)
	syn[0] = 1
	binary.BigEndian.PutUint64(syn[2:], 99)
	c, err := ParseCapable(Option{Kind: OptMPTCP, Data: syn})
	if err != nil || len(c.Keys) != 1 || c.Keys[0] != 99 || c.Version != 1 {
		t.Fatalf("capable: %+v %v", c, err)
	}
	if _, err := ParseCapable(Option{Kind: OptMPTCP, Data: []byte{0, 0, 1}}); err == nil {
		t.Fatal("bad MP_CAPABLE length accepted")
	}
}

func TestBadInput(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":        nil,
		"v6":           append([]byte{0x60}, make([]byte, 39)...),
		"udp":          func() []byte { b, _ := probe().Marshal(); b[9] = 17; return b }(),
		"short tcp":    func() []byte { b, _ := probe().Marshal(); return b[:30] }(),
		"bad offset":   func() []byte { b, _ := probe().Marshal(); b[32] = 0x10; return b }(),
		"opt len 0":    func() []byte { b, _ := probe().Marshal(); b[41] = 0; return b }(),
		"opt past end": func() []byte { b, _ := probe().Marshal(); b[41] = 40; return b }(),
		"total < ihl":  func() []byte { b, _ := probe().Marshal(); b[2], b[3] = 0, 10; return b }(),
	} {
		if _, _, err := ParseIPv4(b, false); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	if _, err := MarshalOptions([]Option{{Kind: 99, Data: make([]byte, 39)}}); err == nil {
		t.Error("oversize option marshalled")
	}
	if _, err := (&Segment{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("::1")}).Marshal(); err == nil {
		t.Error("mixed families marshalled")
	}
}

func probe6() *Segment {
	s := probe()
	s.Src, s.Dst = netip.MustParseAddr("fd00:1::1"), netip.MustParseAddr("fd00:3::2")
	s.TOS = 0xb8
	return s
}

// withExt puts IPv6 extension headers (next-header chain ending in TCP)
// between the IPv6 header of b and its TCP segment.
func withExt(b []byte, hdrs ...[]byte) []byte {
	out := append([]byte(nil), b[:40]...)
	out[6] = hdrs[0][0]
	for i, h := range hdrs {
		h = append([]byte(nil), h...)
		if i+1 < len(hdrs) {
			h[0] = hdrs[i+1][0]
		} else {
			h[0] = 6
		}
		out = append(out, h...)
	}
	out = append(out, b[40:]...)
	binary.BigEndian.PutUint16(out[4:], uint16(len(out)-40))
	return out
}

// ext returns an extension header of type kind (its first byte, the
// chain's next header, is filled in by withExt) of n 8-byte units.
func ext(kind byte, n int) []byte {
	h := make([]byte, 8*n)
	h[0] = kind
	h[1] = byte(n - 1)
	return h
}

func TestRoundTripIPv6(t *testing.T) {
	s := probe6()
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if b[0]>>4 != 6 || b[6] != 6 || b[7] != 3 || len(b) != 40+int(binary.BigEndian.Uint16(b[4:])) {
		t.Fatalf("IPv6 header: % x", b[:40])
	}
	if sum(b[40:], pseudo(s.Src, s.Dst, len(b)-40)) != 0xffff {
		t.Fatalf("TCP checksum does not verify")
	}
	tcp, err := s.MarshalTCP()
	if err != nil || !bytes.Equal(tcp, b[40:]) {
		t.Fatalf("MarshalTCP differs from the packet's TCP part: %v", err)
	}
	got, trunc, err := ParseIPv6(b, false)
	if err != nil || trunc {
		t.Fatalf("parse: %v trunc %v", err, trunc)
	}
	if got.Src != s.Src || got.Dst != s.Dst || got.TOS != 0xb8 || got.TTL != 3 || got.Seq != s.Seq || !Meaningful(got.Options)[3].Equal(CapableSYN()) {
		t.Fatalf("fields: %+v", got)
	}
	if seg, err := ParseTCP(tcp, s.Src, s.Dst); err != nil || seg.Seq != s.Seq || seg.Src != s.Src {
		t.Fatalf("ParseTCP: %+v %v", seg, err)
	}
	// A quote cut inside the options.
	if q, trunc, err := ParseIPv6(b[:len(b)-3], true); err != nil || !trunc || len(Meaningful(q.Options)) != 3 {
		t.Fatalf("quote cut in options: %+v %v %v", q, trunc, err)
	}
	if _, _, err := ParseIPv4(b, false); err == nil {
		t.Fatal("an IPv6 packet parsed as IPv4")
	}
	// Mixed families and IPv4-mapped addresses are refused.
	for _, pair := range [][2]string{{"10.0.0.1", "fd00::1"}, {"::ffff:10.0.0.1", "::ffff:10.0.0.2"}} {
		m := probe6()
		m.Src, m.Dst = netip.MustParseAddr(pair[0]), netip.MustParseAddr(pair[1])
		if _, err := m.Marshal(); err == nil {
			t.Errorf("%s -> %s marshalled", pair[0], pair[1])
		}
	}
}

// IPv6 extension headers in front of TCP (issue 31, bad input): the
// walkable ones are skipped to the TCP header, the rest refused by name.
func TestIPv6ExtensionHeaders(t *testing.T) {
	b, _ := probe6().Marshal()
	ah := make([]byte, 16)
	ah[0], ah[1] = ipv6AH, 2 // (2+2)*4 = 16 bytes
	frag0 := make([]byte, 8)
	frag0[0] = ipv6Fragment
	for name, p := range map[string][]byte{
		"hop-by-hop":                   withExt(b, ext(ipv6HopByHop, 1)),
		"hop-by-hop, routing, dstopts": withExt(b, ext(ipv6HopByHop, 1), ext(ipv6Routing, 3), ext(ipv6DstOpts, 2)),
		"AH":                           withExt(b, ah),
		"first fragment":               withExt(b, frag0),
	} {
		s, _, err := ParseIPv6(p, false)
		if err != nil || s.Seq != probe6().Seq || len(Meaningful(s.Options)) != 4 {
			t.Errorf("%s: %+v %v", name, s, err)
		}
	}
	frag := append([]byte(nil), frag0...)
	frag[3] = 8 // offset 1 (8 bytes)
	many := make([][]byte, maxExtHeaders+1)
	for i := range many {
		many[i] = ext(ipv6DstOpts, 1)
	}
	esp := withExt(b, ext(ipv6DstOpts, 1))
	esp[40] = ipv6ESP
	for name, c := range map[string]struct {
		p    []byte
		want string
	}{
		"later fragment":   {withExt(b, frag), "fragment other than the first"},
		"ESP":              {esp, "ESP"},
		"too many":         {withExt(b, many...), "more than 16"},
		"ext past the end": {func() []byte { p := withExt(b, ext(ipv6Routing, 1)); p[41] = 200; return p }(), "extension header 43"},
		"UDP":              {func() []byte { c := append([]byte(nil), b...); c[6] = 17; return c }(), "next header 17"},
	} {
		_, _, err := ParseIPv6(c.p, false)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}

// FuzzParseIP feeds arbitrary packets and ICMP quotes to both parsers,
// IPv4 and IPv6 (one target: the fuzz lane's time is per target): no
// panic, and what parses as a full packet marshals back to a packet that
// parses to the same fields (IPv6: without its extension headers).
func FuzzParseIP(f *testing.F) {
	b, _ := probe().Marshal()
	f.Add(b, false)
	f.Add(b[:28], true)
	f.Add(b[:len(b)-3], true)
	s := probe()
	s.Options = []Option{JoinSYN(1, false, 1, 2), {Kind: OptNOP}, {Kind: OptNOP}}
	b2, _ := s.Marshal()
	f.Add(b2, false)
	s.Options = []Option{AddAddrOpt(1, netip.MustParseAddr("1.2.3.4"), 80, false, 5)}
	b3, _ := s.Marshal()
	f.Add(b3, false)
	b6, _ := probe6().Marshal()
	f.Add(b6, false)
	f.Add(b6[:48], true)
	f.Add(withExt(b6, ext(ipv6HopByHop, 1), ext(ipv6Routing, 3)), false)
	frag := make([]byte, 8)
	frag[0] = ipv6Fragment
	f.Add(withExt(b6, frag), true)
	f.Fuzz(func(t *testing.T, b []byte, quote bool) {
		for _, parse := range []func([]byte, bool) (*Segment, bool, error){ParseIPv4, ParseIPv6} {
			s, trunc, err := parse(b, quote)
			if err != nil {
				continue
			}
			for _, o := range s.Options {
				_ = o.String()
				_, _ = ParseCapable(o)
				_, _ = ParseJoin(o)
				_, _ = ParseAddAddr(o)
			}
			if quote || trunc || s.Src.Is4In6() || s.Dst.Is4In6() {
				continue
			}
			// Options with End stop early; compare what the parser kept.
			out, err := s.Marshal()
			if err != nil {
				continue // e.g. oversize option data
			}
			s2, _, err := parse(out, false)
			if err != nil {
				t.Fatalf("re-marshalled packet does not parse: %v", err)
			}
			if s2.Seq != s.Seq || s2.SrcPort != s.SrcPort || s2.Src != s.Src || s2.TOS != s.TOS || len(Meaningful(s2.Options)) != len(Meaningful(s.Options)) {
				t.Fatalf("round trip changed the segment: %+v vs %+v", s, s2)
			}
		}
	})
}

// FuzzParseOptions: no panic, lengths add up.
func FuzzParseOptions(f *testing.F) {
	ob, _ := MarshalOptions(probe().Options)
	f.Add(ob)
	f.Add([]byte{30, 12, 0x10, 1, 0, 0, 0, 1, 0, 0, 0, 2})
	f.Add([]byte{30, 1})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		opts, err := ParseOptions(b)
		n := 0
		for _, o := range opts {
			n += o.Len()
		}
		if err == nil && n > len(b) {
			t.Fatalf("options take %d bytes of %d", n, len(b))
		}
	})
}
