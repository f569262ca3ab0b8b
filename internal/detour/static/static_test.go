package static

import (
	"net/netip"
	"testing"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// A NAT detour serves its one server:port; a tunnel detour serves the
// servers of its prefixes in its address family, with the server as its
// remote end; All lists both.
func TestSetDetours(t *testing.T) {
	srv := netip.MustParseAddrPort("10.0.3.2:5201")
	nat := Entry{Detour: detour.Detour{Kind: detour.NAT, Relay: "r1", Remote: netip.MustParseAddrPort("10.0.2.2:40000")},
		Servers: []netip.Prefix{netip.MustParsePrefix("10.0.3.2/32")}, Port: 5201}
	tun := Entry{Detour: detour.Detour{Kind: detour.Tunnel, Relay: "r2", Local: netip.MustParseAddr("10.9.0.2")},
		Servers: []netip.Prefix{netip.MustParsePrefix("10.0.3.0/24")}}
	s := New([]Entry{nat, tun})
	got := s.Detours(srv)
	if len(got) != 2 || got[0] != nat.Detour || got[1].Kind != detour.Tunnel || got[1].Remote != srv {
		t.Fatalf("Detours(%s) = %+v, want the NAT detour and the tunnel to the server", srv, got)
	}
	if got := s.Detours(netip.MustParseAddrPort("10.0.3.2:80")); len(got) != 1 || got[0].Kind != detour.Tunnel {
		t.Errorf("another port: %+v, want the tunnel only", got)
	}
	if got := s.Detours(netip.MustParseAddrPort("10.0.4.2:5201")); len(got) != 0 {
		t.Errorf("a server outside every prefix: %+v, want none", got)
	}
	if got := s.Detours(netip.MustParseAddrPort("[2001:db8::1]:5201")); len(got) != 0 {
		t.Errorf("an IPv6 server: %+v, want none (the tunnel is IPv4)", got)
	}
	if all := s.All(); len(all) != 2 {
		t.Errorf("All = %+v", all)
	}
}
