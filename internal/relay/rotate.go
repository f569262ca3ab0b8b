package relay

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// A member's key rotation in place (OpRotate, docs/collective.md "Key
// rotation"). The member hand shakes with its new key (Noise proves it
// holds it), certifies it if the relay does not list it, and sends
// OpRotate on that session with a statement signed by its old key
// (collective.SignRotation: old key, new key, time). The relay checks that
// the statement verifies under the old key and names this session's key,
// that its time is within collective.RotationSkew of the relay's clock,
// that the old key is a member here now (listed, or certified and neither
// expired nor revoked) and that both keys carry the same member name
// (listed names, or certificate names). The new key is a member by the time
// the request is served (a session that has not certified cannot send it).
// Then everything the relay holds for the old key is the new key's: NAT
// mappings (same detour ports, the kernel's elements untouched, so
// subflows through them continue), closing mappings, the WireGuard tunnel
// peer (same tunnel address), converter tickets and the ledger (credit).
// The old key's sessions stay until they end; the old key may be revoked
// afterwards without touching what moved.

// Rotation results (the label values of mpdetour_relay_rotations_total).
const (
	rotateOK          = "ok"
	rotateNewUncert   = "new-not-member"
	rotateSameKey     = "same-key"
	rotateForged      = "forged"
	rotateStale       = "stale"
	rotateNotMember   = "old-not-member"
	rotateNameDiffers = "name-mismatch"
	rotateInternal    = "internal" // the tunnel did not move (the rest did): answered internal, the member retries
)

var rotateResults = []string{rotateOK, rotateNewUncert, rotateSameKey, rotateForged, rotateStale, rotateNotMember, rotateNameDiffers, rotateInternal}

func newRotationsMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mpdetour_relay_rotations_total",
		Help: "Member key rotations (OpRotate) by result: ok, new-not-member, same-key, forged, stale, old-not-member, name-mismatch, internal (the tunnel did not move).",
	}, []string{"result"})
}

// serveRotate handles OpRotate on a member's (new key's) session.
func (s *Server) serveRotate(ses *session, req *proto.RotateRequest) answer {
	now := s.now()
	r := req.Rotate
	refuse := func(result string, reason proto.Reason, why string) answer {
		s.met.rotations.WithLabelValues(result).Inc()
		s.log.Warn("key rotation refused, nothing moved", "reason", result, "member", ses.name, "new_key", ses.peer.ID(),
			"old_key", r.Old.ID(), "from", ses.addr, "why", why)
		return refused(reason)
	}
	if ses.pending {
		// Any fresh key can get this far: counted, logged in the bounded
		// summary of refusals.
		s.met.rotations.WithLabelValues(rotateNewUncert).Inc()
		s.lim.refusals.note(s.log, now, proto.ReasonUnauthorized, ses.addr,
			"key rotation refused, nothing moved: reason="+rotateNewUncert+": new key "+ses.peer.ID()+" has presented no valid certificate (forged, another authority's, expired or revoked) and is not listed")
		return refused(proto.ReasonUnauthorized)
	}
	if r.Old == ses.peer {
		return refuse(rotateSameKey, proto.ReasonMalformed, "the old key is the session's own key")
	}
	if !collective.VerifyRotation(r, ses.peer) {
		return refuse(rotateForged, proto.ReasonUnauthorized, "the statement's signature does not verify under the old key for this session's key")
	}
	t := time.Unix(int64(min(r.Time, 1<<62)), 0)
	if d := now.Sub(t); d > collective.RotationSkew || d < -collective.RotationSkew {
		return refuse(rotateStale, proto.ReasonExpired, "the statement was made at "+t.UTC().Format(time.RFC3339)+", more than "+collective.RotationSkew.String()+" from now")
	}
	if !s.isMember(r.Old, now) {
		return refuse(rotateNotMember, proto.ReasonUnauthorized, "the old key is not a member here (unknown, expired or revoked)")
	}
	if oldName := s.memberName(r.Old); oldName != ses.name {
		return refuse(rotateNameDiffers, proto.ReasonUnauthorized, "the old key is member "+oldName+", the new one "+ses.name)
	}
	o := lease.Owner{Key: ses.peer, Name: ses.name}
	n := s.carryOver(r.Old, o, now)
	if len(s.ses.byMember[r.Old]) > 0 {
		// Renewals on the old key's sessions while they last (owns); the
		// entry goes with its last session (prune) or when the old key
		// stops being a member (revokeKeys).
		if s.ses.rotated == nil {
			s.ses.rotated = map[proto.Key]proto.Key{}
		}
		s.ses.rotated[r.Old] = ses.peer
	}
	if n.tunnelFailed {
		// What did move stays moved; the member's retry moves the tunnel
		// (a repeated statement moves nothing else).
		s.met.rotations.WithLabelValues(rotateInternal).Inc()
		s.log.Warn("member key rotation incomplete: the tunnel did not move, answered internal", "member", ses.name,
			"old_key", r.Old.ID(), "new_key", ses.peer.ID(), "mappings", n.mappings, "tickets", n.tickets)
		return refused(proto.ReasonInternal)
	}
	s.met.rotations.WithLabelValues(rotateOK).Inc()
	s.log.Info("member key rotated", "member", ses.name, "old_key", r.Old.ID(), "new_key", ses.peer.ID(),
		"mappings", n.mappings, "tunnel", n.tunnel, "tickets", n.tickets)
	return success(&proto.RotateReply{})
}

// owns says whether a session of key may renew m: its owner, or the key
// it rotated from (a renewal sent on the old key's session while the
// member switches sessions must not lose the mapping). Releases need the
// owner itself.
func (s *Server) owns(key proto.Key, m *lease.Mapping) bool {
	if m.Owner.Key == key {
		return true
	}
	to, ok := s.ses.rotated[key]
	return ok && to == m.Owner.Key
}

type carried struct {
	mappings, tickets int
	tunnel            bool
	tunnelFailed      bool // the allocator failed to move the old key's tunnel
}

// carryOver gives everything held for old to o.
func (s *Server) carryOver(old proto.Key, o lease.Owner, now time.Time) carried {
	var c carried
	if len(s.out.batch) > 0 {
		s.flush() // mappings granted in this batch reach the kernel under their first owner
	}
	for _, m := range s.leases.Rekey(old, o) {
		s.logAttr(mappingEvent("rotate", m, now))
		c.mappings++
	}
	if s.conv != nil {
		c.tickets = s.conv.tickets.rekey(old, o.Key, o.Name)
	}
	if s.tunnels != nil {
		if s.fair != nil {
			s.ledgerTunnels(now) // the old peer's bytes so far, before it goes
		}
		had, err := s.tunnels.Rekey(old, o.Key)
		if err != nil {
			s.log.Error("key rotation: moving the tunnel", "member", o.Name, "err", err)
		}
		c.tunnel = had && err == nil
		c.tunnelFailed = err != nil
		if c.tunnel && s.fair != nil {
			// Only a peer that moved starts over at zero; a failed
			// move keeps the old peer and its byte baseline.
			s.fair.led.TunnelMoved(old, o.Key)
		}
	}
	if s.fair != nil {
		s.fair.led.Merge(old, o.Key, o.Name)
	}
	return c
}

// rekey gives old's outstanding tickets to successor; it returns how many.
func (t *ticketStore) rekey(old, successor proto.Key, name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, ti := range t.tickets {
		if ti.key == old {
			t.perMember[ti.member]--
			ti.key, ti.member = successor, name
			t.perMember[name]++
			t.tickets[k] = ti
			n++
		}
	}
	return n
}
