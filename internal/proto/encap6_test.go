package proto

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func encapGrant(endpoint, member string) EncapGrant {
	return EncapGrant{ClientPrefix: netip.MustParsePrefix("100.81.0.7/16"), Gateway: netip.MustParseAddr("100.81.0.1"),
		Endpoint: netip.MustParseAddrPort(endpoint), Member: netip.MustParseAddr(member), VNI: 7, MTU: 1430}
}

// TestEncapReplyOuterFamilies: the IPv4 body is byte for byte what it was
// before VXLAN over IPv6 (family byte 4 + 4 address bytes everywhere); an
// IPv6 endpoint and member round-trip; mixed outer families, non-global
// IPv6 outer addresses and IPv6 inner addresses are refused on both ends.
func TestEncapReplyOuterFamilies(t *testing.T) {
	r4 := &EncapReply{Encap: encapGrant("198.18.1.1:4789", "198.18.1.2"), Lease: 5 * time.Minute}
	b, err := r4.appendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := hex.DecodeString("04645100071004645100010" + "4c6120101" + "12b5" + "04c6120102" + "00000007" + "0596" + "0000012c")
	if !bytes.Equal(b, want) {
		t.Fatalf("IPv4 body\n got %x\nwant %x", b, want)
	}
	r6 := &EncapReply{Encap: encapGrant("[2001:db8:1::1]:4789", "2001:db8:1::2"), Lease: 5 * time.Minute}
	b, err = r6.appendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	var back EncapReply
	if err := back.parse(b); err != nil || back != *r6 {
		t.Fatalf("IPv6 round trip: %+v %v, want %+v", back, err, *r6)
	}
	for _, c := range []struct {
		g    EncapGrant
		want string
	}{
		{encapGrant("[2001:db8:1::1]:4789", "198.18.1.2"), "different families"},
		{encapGrant("198.18.1.1:4789", "2001:db8:1::2"), "different families"},
		{encapGrant("[fe80::1]:4789", "fe80::2"), "endpoint"},
		{encapGrant("[2001:db8:1::1]:4789", "ff02::1"), "member"},
		{encapGrant("[::1]:4789", "2001:db8:1::2"), "endpoint"},
		{encapGrant("[::ffff:198.18.1.1]:4789", "198.18.1.2"), "endpoint"},
		{func() EncapGrant {
			g := encapGrant("[2001:db8:1::1]:4789", "2001:db8:1::2")
			g.ClientPrefix = netip.MustParsePrefix("fd00::7/64")
			return g
		}(), "client prefix"},
	} {
		if err := c.g.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.g, err, c.want)
		}
		if _, err := (&EncapReply{Encap: c.g}).appendTo(nil); err == nil {
			t.Errorf("%+v marshalled", c.g)
		}
	}
	// A mixed-family body from the wire is refused by the parser.
	mixed := append([]byte(nil), b...)
	mixed = append(append(mixed[:0:0], b[:len(b)-10-17]...), append([]byte{4, 198, 18, 1, 2}, b[len(b)-10:]...)...)
	if err := back.parse(mixed); err == nil || !strings.Contains(err.Error(), "different families") {
		t.Errorf("mixed-family body: %v", err)
	}
}
