package proto

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Addresses of both families on the wire: family 4 carries 4 bytes, family
// 6 carries 16; an IPv4 address is always written as family 4 (an
// IPv4-mapped IPv6 address is unmapped when marshalled and refused when
// received as family 6); a family byte that does not match the length that
// follows is malformed. The IPv4 encoding is unchanged since version 2, so
// agents and relays that know only IPv4 keep working.
func TestAddressFamiliesOnWire(t *testing.T) {
	for _, r := range []Request{
		NewRequest(1, &GrantRequest{Server: netip.MustParseAddrPort("[2606:4700::1111]:443"), Port: 40000}),
		NewRequest(2, &GrantRequest{Server: netip.MustParseAddrPort("198.51.100.7:443")}),
	} {
		b, err := MarshalRequest(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRequest(b)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip %+v: %+v %v", r, got, err)
		}
	}
	for _, r := range []Reply{
		{Op: OpGrant, ID: 1, Body: &GrantReply{Detour: netip.MustParseAddrPort("[2001:db8:1::5]:40001"), Lease: time.Minute}},
		{Op: OpTunnel, ID: 2, Body: &TunnelReply{Lease: time.Minute, Tunnel: TunnelGrant{
			ClientPrefix: netip.MustParsePrefix("fd64::2/64"), Endpoint: netip.MustParseAddrPort("[2001:db8:1::5]:51820")}}},
	} {
		b, err := MarshalReply(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseReply(b)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip %+v: %+v %v", r, got, err)
		}
	}
	// The IPv4 grant's bytes are those of version-2 agents: family 4, four
	// address bytes, port, proposed port.
	b, _ := MarshalRequest(NewRequest(7, &GrantRequest{Server: netip.MustParseAddrPort("198.51.100.7:443"), Port: 40000}))
	if want := "04c633640701bb9c40"; fmt.Sprintf("%x", b[len(b)-9:]) != want {
		t.Fatalf("IPv4 grant body % x, want %s", b[len(b)-9:], want)
	}
	// A mapped address is sent as IPv4.
	b, _ = MarshalRequest(NewRequest(7, &GrantRequest{Server: netip.MustParseAddrPort("[::ffff:198.51.100.7]:443"), Port: 40000}))
	if r, err := ParseRequest(b); err != nil || r.Body.(*GrantRequest).Server != netip.MustParseAddrPort("198.51.100.7:443") {
		t.Fatalf("mapped address: %+v %v", r, err)
	}

	v6, _ := MarshalRequest(NewRequest(9, &GrantRequest{Server: netip.MustParseAddrPort("[2606:4700::1111]:443")}))
	head := len(v6) - 21 // family byte of the address
	if v6[head] != 6 {
		t.Fatalf("family byte at %d is %d", head, v6[head])
	}
	mut := func(f func([]byte) []byte) []byte { return f(append([]byte(nil), v6...)) }
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"mapped in family 6": {mut(func(b []byte) []byte {
			a := netip.MustParseAddr("::ffff:10.0.0.1").As16()
			copy(b[head+1:], a[:])
			return b
		}), "IPv4-mapped"},
		"family 4 with 16 bytes": {mut(func(b []byte) []byte { b[head] = 4; return b }), "ports"},
		"family 6 truncated":     {v6[:head+10], "truncated IPv6"},
		"family 0":               {mut(func(b []byte) []byte { b[head] = 0; return b }), "family 0"},
		"family 10 (AF_INET6)":   {mut(func(b []byte) []byte { b[head] = 10; return b }), "family 10"},
	} {
		_, err := ParseRequest(c.b)
		if ReasonOf(err) != ReasonMalformed || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want malformed naming %q", name, err, c.want)
		}
	}
}

// Legacy v1 has four address bytes: an IPv6 server cannot be asked for.
func TestLegacyRefusesIPv6(t *testing.T) {
	for _, s := range []string{"[2606:4700::1111]:443", "[fe80::1%eth0]:80"} {
		_, err := MarshalLegacy(LegacyMsg{Server: netip.MustParseAddrPort(s)})
		if err == nil || !strings.Contains(err.Error(), "only IPv4") {
			t.Errorf("%s: %v, want a refusal naming IPv4", s, err)
		}
	}
}

// TestWriteFamilySeeds writes the fuzz seeds of the address-family shapes
// under testdata (run with MPDETOUR_WRITE_SEEDS=1 after a wire change; the
// files are committed and scripts/fuzz.sh runs them).
func TestWriteFamilySeeds(t *testing.T) {
	if os.Getenv("MPDETOUR_WRITE_SEEDS") == "" {
		t.Skip("set MPDETOUR_WRITE_SEEDS=1 to rewrite the seeds")
	}
	write := func(target, name string, b []byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g6, _ := MarshalRequest(NewRequest(1, &GrantRequest{Server: netip.MustParseAddrPort("[2606:4700::1111]:443"), Port: 40000}))
	write("FuzzParseRequest", "grant-ipv6", g6)
	m := append([]byte(nil), g6...)
	a := netip.MustParseAddr("::ffff:10.0.0.1").As16()
	copy(m[len(m)-20:], a[:])
	write("FuzzParseRequest", "grant-ipv6-mapped", m)
	w := append([]byte(nil), g6...)
	w[len(w)-21] = 4
	write("FuzzParseRequest", "grant-family4-16bytes", w)
	r6, _ := MarshalReply(Reply{Op: OpGrant, ID: 1, Body: &GrantReply{Detour: netip.MustParseAddrPort("[2001:db8:1::5]:40001"), Lease: time.Minute}})
	write("FuzzParseReply", "grant-ipv6", r6)
	t6, _ := MarshalReply(Reply{Op: OpTunnel, ID: 2, Body: &TunnelReply{Lease: time.Minute, Tunnel: TunnelGrant{
		ClientPrefix: netip.MustParsePrefix("fd64::2/64"), Endpoint: netip.MustParseAddrPort("[2001:db8:1::5]:51820")}}})
	write("FuzzParseReply", "tunnel-ipv6", t6)
	bad := append([]byte(nil), t6...)
	for i := range bad { // prefix length 129 for an IPv6 address
		if i > 0 && bad[i-1] == 0xfd && bad[i] == 0x64 {
			bad[i+15] = 129
			break
		}
	}
	write("FuzzParseReply", "tunnel-ipv6-bad-prefix", bad)
	tr, _ := MarshalRequest(NewRequest(4, &TunnelRequest{IPv6: true}))
	write("FuzzParseRequest", "tunnel-want-ipv6", tr)
	t46, _ := MarshalReply(Reply{Op: OpTunnel, ID: 3, Body: &TunnelReply{Lease: time.Minute, Tunnel: TunnelGrant{
		ClientPrefix: netip.MustParsePrefix("100.64.0.2/16"), ClientPrefix6: netip.MustParsePrefix("fd64::2/64"),
		Endpoint: netip.MustParseAddrPort("203.0.113.1:51820")}}})
	write("FuzzParseReply", "tunnel-with-ipv6-prefix", t46)
}

// A tunnel request may ask for an IPv6 tunnel address (one flag byte;
// without it the body is empty as in every earlier version), and the reply
// then carries the IPv6 prefix after the lease; a reply without it has the
// earlier length, so clients that never ask parse what they always did.
func TestTunnelIPv6Address(t *testing.T) {
	for _, r := range []*TunnelRequest{{}, {IPv6: true}} {
		b, err := MarshalRequest(NewRequest(3, r))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRequest(b)
		if err != nil || *got.Body.(*TunnelRequest) != *r {
			t.Fatalf("round trip %+v: %+v %v", r, got, err)
		}
	}
	b, _ := MarshalRequest(NewRequest(3, &TunnelRequest{IPv6: true}))
	for _, flags := range []byte{0, 2, 3, 0xff} {
		bad := append(append([]byte(nil), b[:len(b)-1]...), flags)
		if _, err := ParseRequest(bad); ReasonOf(err) != ReasonMalformed {
			t.Errorf("tunnel request flags %#x: %v, want malformed", flags, err)
		}
	}
	if _, err := ParseRequest(append(append([]byte(nil), b...), 0)); ReasonOf(err) != ReasonMalformed {
		t.Errorf("two flag bytes: %v, want malformed", err)
	}
	g := TunnelGrant{ClientPrefix: netip.MustParsePrefix("100.64.0.2/16"), ClientPrefix6: netip.MustParsePrefix("fd64::2/64"),
		Endpoint: netip.MustParseAddrPort("203.0.113.1:51820")}
	with, err := MarshalReply(Reply{Op: OpTunnel, ID: 1, Body: &TunnelReply{Tunnel: g, Lease: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseReply(with)
	if err != nil || got.Body.(*TunnelReply).Tunnel != g {
		t.Fatalf("reply with an IPv6 prefix: %+v %v", got, err)
	}
	g4 := g
	g4.ClientPrefix6 = netip.Prefix{}
	without, _ := MarshalReply(Reply{Op: OpTunnel, ID: 1, Body: &TunnelReply{Tunnel: g4, Lease: time.Minute}})
	if len(with)-len(without) != 18 {
		t.Fatalf("the IPv6 prefix adds %d bytes, want 18", len(with)-len(without))
	}
	for name, mut := range map[string]func([]byte) []byte{
		"prefix6 family 4":   func(b []byte) []byte { b[len(b)-18] = 4; return b },
		"prefix6 length 129": func(b []byte) []byte { b[len(b)-1] = 129; return b },
		"prefix6 truncated":  func(b []byte) []byte { return b[:len(b)-1] },
		"prefix6 IPv4-mapped": func(b []byte) []byte {
			a := netip.MustParseAddr("::ffff:1.2.3.4").As16()
			copy(b[len(b)-17:], a[:])
			return b
		},
	} {
		if _, err := ParseReply(mut(append([]byte(nil), with...))); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	if _, err := MarshalReply(Reply{Op: OpTunnel, Body: &TunnelReply{Tunnel: TunnelGrant{ClientPrefix: g.ClientPrefix,
		ClientPrefix6: netip.MustParsePrefix("100.65.0.2/16"), Endpoint: g.Endpoint}}}); err == nil {
		t.Error("an IPv4 prefix as ClientPrefix6 marshalled")
	}
}
