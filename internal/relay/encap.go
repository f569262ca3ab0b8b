package relay

import (
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// EncapAllocator serves the control protocol's "encap" request: an
// unencrypted VXLAN tunnel for members in a trusted network (opt-in in the
// tunnel section, docs/tunnel.md). The relay's TunnelAllocator implements it
// when the section enables the vxlan kind. member is authenticated by the
// control protocol; client is the session's source address, the only
// address the relay then accepts encapsulated packets from; relay is the
// address the request arrived at (the VXLAN endpoint).
type EncapAllocator interface {
	Encap(member proto.Key, client, relay netip.Addr) (proto.EncapGrant, time.Duration, error)
	EncapRelease(member proto.Key) error
}

// serveEncap answers an encap request (open/renew or release).
func (s *Server) serveEncap(ses *session, client netip.Addr, req proto.Request, rep *proto.Reply) {
	ea, ok := s.tunnels.(EncapAllocator)
	if !ok {
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
