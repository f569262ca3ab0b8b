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
}
