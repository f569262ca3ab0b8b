package relay

import (
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/fairshare"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
	"github.com/mpdetour/mpdetour/internal/relay/trust"
)

// A collective relay (config `collective:`) accepts any member whose
// certificate the collective's authority signed, besides the static
// `members` list: a key that is not listed may hand shake, and its session
// may only ping or present its certificate (OpCertify) until one verifies
// (signature, dates, revocation list, role client). The key is then
// remembered until its certificate expires or is revoked: its later
// sessions are members from the handshake on. The revocation list file is
// re-read when it changes (checked every 2 s): a revoked or expired member
// loses its sessions, mappings, tunnel, converter tickets and running
// conversions at once.

// certifiedOK says whether key holds a certificate that is still valid.
func (s *Server) certifiedOK(key proto.Key, now time.Time) bool { return s.trust.CertifiedOK(key, now) }

// isMember: a static member or a currently certified one.
func (s *Server) isMember(key proto.Key, now time.Time) bool {
	_, ok := s.set.Members[key]
	return ok || s.certifiedOK(key, now)
}

// certify handles OpCertify.
func (s *Server) certify(ses *session, req *proto.CertifyRequest) answer {
	if s.trust.Live == nil {
		return refused(proto.ReasonUnsupported)
	}
	s.noteRelayCert(ses.peer, req.Cert) // fair sharing: its relay's receipts count here
	if _, static := s.set.Members[ses.peer]; static {
		return success(&proto.CertifyReply{}) // listed: served whatever its certificate says; the static name stays
	}
	now := s.now()
	c, err := s.trust.Live.CheckBytes(req.Cert, ses.peer, collective.RoleClient, now)
	if err != nil {
		s.count("certify", proto.ReasonUnauthorized)
		s.lim.refusals.note(s.log, now, proto.ReasonUnauthorized, ses.addr, "certificate of "+ses.peer.ID()+": "+err.Error())
		return refused(proto.ReasonUnauthorized)
	}
	first := s.trust.Certified[ses.peer].Serial != c.Serial
	s.trust.Certified[ses.peer] = trust.Member{Name: c.Name, Serial: c.Serial, NotBefore: c.NotBefore, NotAfter: c.NotAfter}
	for _, id := range s.ses.byMember[ses.peer] {
		if o := s.ses.all[id]; o != nil && o.pending {
			o.pending, o.name = false, c.Name
			// Now a member: its handshake timestamps count for replays.
			if last, ok := s.trust.LastTS[o.peer]; !ok || o.ts.After(last) {
				s.trust.NoteTimestamp(o.peer, o.ts)
			}
		}
	}
	if first {
		s.log.Info("certified member", "member", c.Name, "key", ses.peer.ID(), "serial", c.Serial, "until", c.NotAfter.Format(time.RFC3339))
	}
	return success(&proto.CertifyReply{})
}

// checkCollective re-reads the revocation list when its file changed and
// drops certified members that are revoked or expired.
func (s *Server) checkCollective(now time.Time) {
	if s.trust.Live == nil {
		return
	}
	if s.set.CRLFile != "" {
		if fi, err := os.Stat(s.set.CRLFile); err == nil && !fi.ModTime().Equal(s.trust.CRLMod) {
			s.trust.CRLMod = fi.ModTime()
			var l *collective.RevocationList
			installed := false
			b, err := os.ReadFile(s.set.CRLFile)
			if err == nil {
				l, err = collective.ParseRevocationList(string(b), s.trust.Live.Authority())
			}
			if err == nil {
				installed, err = s.trust.Live.Install(l)
			}
			switch {
			case err != nil:
				s.log.Error("revocation list not applied, keeping the previous one", "file", s.set.CRLFile, "err", err)
			case installed:
				s.log.Info("revocation list applied", "file", s.set.CRLFile, "seq", l.Seq, "serials", len(l.Serials))
				if s.gossip.node != nil {
					s.gossip.node.PublishCRL() // to every relay of the cluster
				}
			}
		}
	}
	if l := s.trust.Live.CRL(); l != nil {
		s.met.crlSeq.Set(float64(l.Seq))
	}
	var gone []proto.Key
	for k, cm := range s.trust.Certified {
		if !s.certifiedOK(k, now) {
			gone = append(gone, k)
			s.log.Info("certified member dropped", "member", cm.Name, "key", k.ID(), "serial", cm.Serial,
				"revoked", s.trust.Live.Revoked(cm.Serial), "expired", !now.Before(cm.NotAfter))
		}
	}
	if len(gone) == 0 {
		return
	}
	n := s.revokeKeys(func(k proto.Key) bool { return s.isMember(k, now) }, "revoked")
	for _, k := range gone {
		delete(s.trust.Certified, k)
		delete(s.trust.LastTS, k)
		if s.tunnels != nil {
			s.tunnels.Release(k) // also when no session of it is left
		}
	}
	s.log.Info("revoked certified members", "members", len(gone), "mappings", n)
}

// revokeKeys closes the mappings, sessions, tunnels, converter tickets and
// running conversions of every key keep refuses, and forgets rotations from or to such a key;
// it returns how many mappings it closed.
func (s *Server) revokeKeys(keep func(proto.Key) bool, reason string) int {
	var revoked []*lease.Mapping
	for _, m := range s.leases.ByKey {
		if !m.Owner.Key.IsZero() && !keep(m.Owner.Key) {
			revoked = append(revoked, m)
		}
	}
	for key, ids := range s.ses.byMember {
		if keep(key) {
			continue
		}
		pendingOnly := len(ids) > 0
		for _, id := range ids {
			if ses := s.ses.all[id]; ses == nil || !ses.pending {
				pendingOnly = false
			}
		}
		if pendingOnly && s.trust.Live != nil {
			continue // still presenting its certificate
		}
		for _, id := range ids {
			delete(s.ses.all, id)
		}
		delete(s.ses.byMember, key)
		if s.tunnels != nil {
			s.tunnels.Release(key)
		}
	}
	for old, successor := range s.ses.rotated {
		if !keep(old) || !keep(successor) {
			delete(s.ses.rotated, old) // no renewal through a key that is no member
		}
	}
	_ = s.close(revoked, reason)
	if s.conv != nil {
		s.conv.tickets.revoke(keep)
		if s.conv.srv != nil {
			// Running conversions end too: a revoked member moves no
			// more bytes through the converter.
			if n := s.conv.srv.End(func(tag any) bool { k, ok := tag.(proto.Key); return ok && !keep(k) }); n > 0 {
				s.log.Info("conversions of revoked members ended", "conversions", n)
			}
		}
	}
	return len(revoked)
}

// crlFromGossip runs in the event loop after the roster installed a newer
// revocation list learned from another relay: the list is written to
// crl_file (so that a restart, even with no other relay up, keeps it) and
// applied exactly as a new file would be.
func (s *Server) crlFromGossip(now time.Time) {
	if s.trust.Live == nil {
		return
	}
	l := s.trust.Live.CRL()
	if l == nil {
		return
	}
	if s.set.CRLFile != "" {
		s.writeBackCRL(l)
	}
	s.checkCollective(now)
}

// writeBackCRL replaces crl_file with l unless the file holds a list at
// least as new (atomically: temporary file in the same directory, fsync,
// rename, as the ledger; mode 0600). A failure (a read-only file, say) is logged; the list stays
// applied in memory.
func (s *Server) writeBackCRL(l *collective.RevocationList) {
	f := s.set.CRLFile
	if b, err := os.ReadFile(f); err == nil {
		if cur, err := collective.ParseRevocationList(string(b), s.trust.Live.Authority()); err == nil && cur.Seq >= l.Seq {
			return
		}
	}
	mod, err := fairshare.WriteFileAtomic(f, []byte(l.String()+"\n"))
	if err != nil {
		s.log.Warn("revocation list from gossip applied but not written to crl_file", "file", f, "seq", l.Seq, "err", err)
		return
	}
	s.trust.CRLMod = mod // our own write: nothing to re-read (an operator's newer file has another mtime)
	s.log.Info("revocation list from gossip written to crl_file", "file", f, "seq", l.Seq)
}
