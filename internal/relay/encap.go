package relay

import (
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// serveEncap answers an encap request (open/renew or release).
func (s *Server) serveEncap(ses *session, client netip.Addr, req proto.Request, rep *proto.Reply) {
	ea := s.tunnels
	if ea == nil {
		rep.Reason = proto.ReasonUnsupported
		return
	}
	if req.Action == proto.EncapRelease {
		if err := ea.EncapRelease(ses.peer); err != nil {
			rep.Reason = proto.ReasonOf(err)
			if rep.Reason == proto.OK {
				rep.Reason = proto.ReasonInternal
			}
		}
		return
	}
	g, lease, err := ea.Encap(ses.peer, client, s.detourAddr(ses))
	if err != nil {
		rep.Reason = proto.ReasonOf(err)
		if rep.Reason == proto.OK {
			rep.Reason = proto.ReasonInternal
		}
		s.log.Warn("encap allocation", "member", ses.name, "err", err)
		return
	}
	rep.Encap, rep.Lease = g, lease
}
