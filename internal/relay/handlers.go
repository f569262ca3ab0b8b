package relay

import (
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// answer is a handler's result: the reason, with OK the reply body, and
// for a grant the mapping the reply announces.
type answer struct {
	reason  proto.Reason
	body    proto.ReplyBody
	granted *lease.Mapping
}

func success(body proto.ReplyBody) answer { return answer{body: body} }
func refused(reason proto.Reason) answer  { return answer{reason: reason} }
func failed(err error, fallback proto.Reason) answer {
	r := proto.ReasonOf(err)
	if r == proto.OK {
		r = fallback
	}
	return answer{reason: r}
}

// handler serves one operation on an authenticated session.
type handler struct {
	serve func(s *Server, ses *session, req proto.RequestBody) answer
	// beforeCertificate: allowed on a collective relay's session whose key
	// has not presented a valid certificate yet.
	beforeCertificate bool
}

// handle adapts a handler of one request type (the codec guarantees the
// body's type for its operation).
func handle[Req proto.RequestBody](f func(s *Server, ses *session, req Req) answer) func(*Server, *session, proto.RequestBody) answer {
	return func(s *Server, ses *session, req proto.RequestBody) answer { return f(s, ses, req.(Req)) }
}

// handlers is the table from operation to handler: a new operation is its
// message types (internal/proto), a handler here and a client method
// (internal/relayclient).
var handlers = map[proto.Op]handler{
	proto.OpPing:    {serve: handle((*Server).servePing), beforeCertificate: true},
	proto.OpCertify: {serve: handle((*Server).certify), beforeCertificate: true},
	proto.OpRotate:  {serve: handle((*Server).serveRotate), beforeCertificate: true},
	proto.OpGrant:   {serve: handle((*Server).serveGrant)},
	proto.OpRenew:   {serve: handle((*Server).serveRenew)},
	proto.OpRelease: {serve: handle((*Server).serveRelease)},
	proto.OpTunnel:  {serve: handle((*Server).serveTunnel)},
	proto.OpEncap:   {serve: handle((*Server).serveEncap)},
	proto.OpConvert: {serve: handle((*Server).serveConvert)},
	proto.OpReceipt: {serve: handle((*Server).serveReceipt)},
	proto.OpRoster:  {serve: handle((*Server).serveRoster)},
	proto.OpQuota:   {serve: handle((*Server).serveQuota)},
}

func (s *Server) servePing(*session, *proto.PingRequest) answer { return success(&proto.PingReply{}) }

func (s *Server) serveGrant(ses *session, req *proto.GrantRequest) answer {
	o := lease.Owner{Key: ses.peer, Name: ses.name}
	client := ses.addr.Addr()
	if r := s.admit(o, client, req.Server); r != proto.OK {
		return refused(r)
	}
	detour := s.detourAddr(ses)
	m, r := s.grant(o, client, req.Server, req.Port, s.set.Lease, s.set.QuotaPerMember)
	if r != proto.OK {
		return refused(r)
	}
	a := success(&proto.GrantReply{Detour: netip.AddrPortFrom(detour, m.Key.Port), Lease: m.Expires.Sub(s.now())})
	a.granted = m
	return a
}

func (s *Server) serveRenew(ses *session, req *proto.RenewRequest) answer {
	m := s.leases.ByKey[dataplane.Key{Client: ses.addr.Addr(), Port: req.Port}]
	if m == nil || !s.owns(ses.peer, m) {
		return refused(proto.ReasonNotFound)
	}
	now := s.now()
	m.Expires = now.Add(s.set.Lease)
	s.logAttr(mappingEvent("renew", m, now))
	return success(&proto.RenewReply{Lease: s.set.Lease})
}

func (s *Server) serveRelease(ses *session, req *proto.ReleaseRequest) answer {
	m := s.leases.ByKey[dataplane.Key{Client: ses.addr.Addr(), Port: req.Port}]
	if m == nil || m.Owner.Key != ses.peer {
		return refused(proto.ReasonNotFound)
	}
	rep := &proto.ReleaseReply{}
	if cnt, err := s.dp.CountersOf([]dataplane.Key{m.Key}); err == nil {
		rep.Bytes = cnt[m.Key].Bytes
	}
	if err := s.close([]*lease.Mapping{m}, "release"); err != nil {
		return refused(proto.ReasonInternal)
	}
	return success(rep)
}

func (s *Server) serveTunnel(ses *session, req *proto.TunnelRequest) answer {
	if s.tunnels == nil {
		return refused(proto.ReasonUnsupported)
	}
	g, lease, err := s.tunnels.Allocate(ses.peer, ses.addr.Addr(), s.detourAddr(ses))
	if err != nil {
		s.log.Warn("tunnel allocation", "member", ses.name, "err", err)
		return failed(err, proto.ReasonInternal)
	}
	if !req.IPv6 {
		// Clients that did not ask parse only the IPv4 shape.
		g.ClientPrefix6 = netip.Prefix{}
	}
	return success(&proto.TunnelReply{Tunnel: g, Lease: lease})
}

func (s *Server) serveQuota(ses *session, _ *proto.QuotaRequest) answer {
	used := s.leases.QuotaUsed(lease.Owner{Key: ses.peer, Name: ses.name}, ses.addr.Addr())
	return success(&proto.QuotaReply{Used: uint32(used), Quota: uint32(s.set.QuotaPerMember)})
}
