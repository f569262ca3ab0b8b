package relay

import "net/netip"

// SpecialDestinations returns the destination ranges the NAT-detour policy
// refuses unless allow_destinations covers them. Integration point for tunnel
// detours (internal/tunnel/tunnelctl, issue 6): the tunnel's nftables policy
// is built from this list, so both kinds of detour share one definition.
func SpecialDestinations() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(special))
	for _, s := range special {
		out = append(out, s.p)
	}
	return out
}
