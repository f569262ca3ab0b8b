package proto

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func encapGrant6() EncapGrant {
	g := encapGrant("198.18.1.1:4789", "198.18.1.2")
	g.ClientPrefix6 = netip.MustParsePrefix("fd64:81::7/64")
	g.Gateway6 = netip.MustParseAddr("fd64:81::1")
	return g
}

// TestEncapInside6Wire: a grant with the IPv6 inside is the IPv4 body byte
// for byte plus a 35-byte tail (so an old client, which only ever gets it
// when it asked with the flag it does not know how to send, never sees
// it), and round-trips; a request with the flag is the old request plus
// one byte (an old relay answers it malformed and the client asks again
// without).
func TestEncapInside6Wire(t *testing.T) {
	g6 := encapGrant6()
	g4 := g6
	g4.ClientPrefix6, g4.Gateway6 = netip.Prefix{}, netip.Addr{}
	b4, err := (&EncapReply{Encap: g4, Lease: 5 * time.Minute}).appendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	b6, err := (&EncapReply{Encap: g6, Lease: 5 * time.Minute}).appendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b6, b4) || len(b6) != len(b4)+encapInside6Len {
		t.Fatalf("IPv6 inside body is not the IPv4 body plus %d bytes:\n v4 %x\n v6 %x", encapInside6Len, b4, b6)
	}
	var back EncapReply
	if err := back.parse(b6); err != nil || back.Encap != g6 || back.Lease != 5*time.Minute {
		t.Fatalf("round trip: %+v %v, want %+v", back, err, g6)
	}
	back = EncapReply{}
	if err := back.parse(b4); err != nil || back.Encap != g4 {
		t.Fatalf("IPv4-only round trip: %+v %v", back, err)
	}

	for _, c := range []struct {
		r    EncapRequest
		want []byte
	}{
		{EncapRequest{Action: EncapOpen}, []byte{EncapOpen}},
		{EncapRequest{Action: EncapRelease}, []byte{EncapRelease}},
		{EncapRequest{Action: EncapOpen, IPv6: true}, []byte{EncapOpen, EncapWantIPv6}},
	} {
		b, err := c.r.appendTo(nil)
		if err != nil || !bytes.Equal(b, c.want) {
			t.Errorf("%+v: % x %v, want % x", c.r, b, err, c.want)
		}
		var back EncapRequest
		if err := back.parse(b); err != nil || back != c.r {
			t.Errorf("%+v: parsed back %+v %v", c.r, back, err)
		}
	}
	if _, err := (&EncapRequest{Action: EncapRelease, IPv6: true}).appendTo(nil); err == nil {
		t.Error("release with the IPv6 flag marshalled")
	}
	for _, b := range [][]byte{{EncapRelease, EncapWantIPv6}, {EncapOpen, 2}, {EncapOpen, 3}, {EncapOpen, 1, 0}, {EncapOpen, 0}} {
		var r EncapRequest
		if err := r.parse(b); err == nil {
			t.Errorf("request % x parsed as %+v", b, r)
		}
	}
}

// TestEncapInside6Refused: grants whose IPv6 inside is of the wrong family,
// half present, not unicast, outside its prefix, or on an MTU IPv6 cannot
// use are refused by Validate and by the marshaller; bodies from the
// wire with a bad tail are refused by the parser with an error naming it.
func TestEncapInside6Refused(t *testing.T) {
	with := func(f func(*EncapGrant)) EncapGrant {
		g := encapGrant6()
		f(&g)
		return g
	}
	for _, c := range []struct {
		name string
		g    EncapGrant
		want string
	}{
		{"IPv4 prefix6", with(func(g *EncapGrant) { g.ClientPrefix6 = netip.MustParsePrefix("100.82.0.7/16") }), "IPv6 client prefix"},
		{"mapped prefix6", with(func(g *EncapGrant) { g.ClientPrefix6 = netip.MustParsePrefix("::ffff:100.82.0.7/120") }), "IPv6 client prefix"},
		{"link-local prefix6", with(func(g *EncapGrant) {
			g.ClientPrefix6, g.Gateway6 = netip.MustParsePrefix("fe80::7/64"), netip.MustParseAddr("fe80::1")
		}), "IPv6 client prefix"},
		{"multicast prefix6", with(func(g *EncapGrant) { g.ClientPrefix6 = netip.MustParsePrefix("ff05::7/64") }), "IPv6 client prefix"},
		{"/128", with(func(g *EncapGrant) { g.ClientPrefix6 = netip.MustParsePrefix("fd64:81::7/128") }), "IPv6 client prefix"},
		{"prefix6 without gateway6", with(func(g *EncapGrant) { g.Gateway6 = netip.Addr{} }), "IPv6 gateway"},
		{"gateway6 without prefix6", with(func(g *EncapGrant) { g.ClientPrefix6 = netip.Prefix{} }), "IPv6 client prefix"},
		{"IPv4 gateway6", with(func(g *EncapGrant) { g.Gateway6 = netip.MustParseAddr("100.81.0.1") }), "IPv6 gateway"},
		{"gateway6 outside", with(func(g *EncapGrant) { g.Gateway6 = netip.MustParseAddr("fd64:82::1") }), "IPv6 gateway"},
		{"gateway6 = client", with(func(g *EncapGrant) { g.Gateway6 = g.ClientPrefix6.Addr() }), "IPv6 gateway"},
		{"MTU below 1280", with(func(g *EncapGrant) { g.MTU = 1200 }), "1280"},
	} {
		if err := c.g.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
		if _, err := (&EncapReply{Encap: c.g}).appendTo(nil); err == nil {
			t.Errorf("%s: marshalled", c.name)
		}
	}

	good, err := (&EncapReply{Encap: encapGrant6(), Lease: time.Minute}).appendTo(nil)
	if err != nil {
		t.Fatal(err)
	}
	tail := len(good) - encapInside6Len
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"truncated tail", good[:len(good)-1], "IPv6 inside"},
		{"tail plus a byte", append(append([]byte(nil), good...), 0), "IPv6 inside"},
		{"family 4 in the tail", func() []byte {
			b := append([]byte(nil), good...)
			b[tail] = 4
			return b
		}(), "IPv6 inner address"},
		{"family 4 gateway6", func() []byte {
			b := append([]byte(nil), good...)
			b[tail+18] = 4
			return b
		}(), "IPv6 inner gateway"},
		{"prefix length 200", func() []byte {
			b := append([]byte(nil), good...)
			b[tail+17] = 200
			return b
		}(), "prefix length"},
	} {
		var r EncapReply
		if err := r.parse(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}
