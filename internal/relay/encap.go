package relay

import (
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// serveEncap answers an encap request (open/renew or release).
func (s *Server) serveEncap(ses *session, req *proto.EncapRequest) answer {
	if s.tunnels == nil {
		return refused(proto.ReasonUnsupported)
	}
	if req.Action == proto.EncapRelease {
		if err := s.tunnels.EncapRelease(ses.peer); err != nil {
			return failed(err, proto.ReasonInternal)
		}
		return success(&proto.EncapReply{})
	}
	g, lease, err := s.tunnels.Encap(ses.peer, ses.addr.Addr(), s.detourAddr(ses))
	if err != nil {
		s.log.Warn("encap allocation", "member", ses.name, "err", err)
		return failed(err, proto.ReasonInternal)
	}
	if !req.IPv6 {
		// Clients that did not ask parse only the IPv4 shape.
		g.ClientPrefix6, g.Gateway6 = netip.Prefix{}, netip.Addr{}
	}
	return success(&proto.EncapReply{Encap: g, Lease: lease})
}
