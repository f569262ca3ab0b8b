package memberlist

// mpdetour patch (not upstream; see PATCHES.md): incarnation numbers are
// compared in serial number arithmetic (RFC 1982) instead of as plain
// integers. Upstream, refute() beats an accusation at incarnation
// math.MaxUint32 with accusedInc+1, which wraps to 0, and every other node
// then ignores the refutation as older: one forged "dead" or "suspect"
// message at the highest incarnation removes a live node for good
// (hashicorp/memberlist issue 358). In serial arithmetic accusedInc+1 is
// always newer than accusedInc, wrapped or not, so a refutation is never
// ignored.

// incarnationNewer reports whether incarnation a is newer than b: a is
// ahead of b by 1 .. 2^31-1 modulo 2^32 (exactly 2^31 apart is neither).
func incarnationNewer(a, b uint32) bool {
	return a != b && int32(a-b) > 0
}
