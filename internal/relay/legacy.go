package relay

import (
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// handleLegacy serves the original prototype's 12-byte request. There is no
// identity: the mapping is attributed to the source address, which anyone
// can spoof; quotas and rate limits are per source address. v1 has no error
// codes, so a refusal is a response whose dpt is 0.
func (s *Server) handleLegacy(p packet) {
	m, err := proto.ParseLegacy(p.data)
	if err != nil || m.Response {
		s.count("legacy", proto.ReasonMalformed)
		return
	}
	if !s.addrAllowed(p.from.Addr()) {
		s.count("legacy", proto.ReasonRateLimited)
		return
	}
	mp, r := s.grant(lease.LegacyOwner, p.from.Addr(), m.Server, m.Port, s.set.LegacyLease, s.set.LegacyPerClient)
	s.count("legacy", r)
	resp := proto.LegacyMsg{Response: true, Server: m.Server}
	if r == proto.OK {
		resp.Port = mp.Key.Port
	} else {
		mp = nil
	}
	s.out.replies = append(s.out.replies, deferred{legacy: resp, to: p.from, m: mp, rep: proto.Reply{Op: proto.OpGrant}, at: p.at})
}
