package relay

import (
	"net/netip"
	"slices"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// Relay discovery (docs/collective.md, "Discovery"): with
// `collective.gossip` the relay joins the collective's roster cluster
// (internal/roster over hashicorp/memberlist), announces a signed entry
// (its control addresses, capacity, kinds, load, region) and serves the
// roster to members (OpRoster).

// GossipConfig are the validated section.
type GossipConfig struct {
	Bind, Advertise netip.AddrPort
	Join            []string
	Announce        []netip.AddrPort
	Region          string
	Capacity        uint32
	Secret          []byte
	ProbeInterval   time.Duration
	ProbeTimeout    time.Duration
	Tuning          GossipTuning
	Cert            *collective.Certificate // the relay's own (role relay)
}

// GossipTuning: memberlist's settings beyond the probe, for large
// collectives (0: the defaults; docs/collective.md, "Scale").
type GossipTuning struct {
	SuspicionMult, SuspicionMaxMult, GossipNodes, RetransmitMult int
	GossipInterval, PushPullInterval                             time.Duration
}

func (g *GossipConfig) same(o *GossipConfig) bool {
	if g == nil || o == nil {
		return g == o
	}
	return g.Bind == o.Bind && g.Advertise == o.Advertise && slices.Equal(g.Join, o.Join) && slices.Equal(g.Announce, o.Announce) &&
		g.Region == o.Region && g.Capacity == o.Capacity && string(g.Secret) == string(o.Secret) &&
		g.ProbeInterval == o.ProbeInterval && g.ProbeTimeout == o.ProbeTimeout && g.Tuning == o.Tuning && g.Cert.String() == o.Cert.String()
}

// rosterUpdateEvery is how often the relay re-signs its entry when its
// load changed (each update is gossiped to every relay).
const rosterUpdateEvery = 10 * time.Second

func (s *Server) kinds() roster.Kinds {
	k := roster.KindNAT
	if s.tunnels != nil {
		k |= roster.KindTunnel
		if !s.tunnels.WireGuardOffered() {
			k &^= roster.KindTunnel // VXLAN only: OpTunnel is refused
		}
	}
	if s.conv != nil {
		k |= roster.KindConvert
	}
	return k
}

func (s *Server) rosterInfo() roster.Info {
	return s.rosterInfoOf(s.gossip.cfg)
}

func (s *Server) rosterInfoOf(g *GossipConfig) roster.Info {
	return roster.Info{Addrs: g.Announce, Capacity: g.Capacity, Load: uint32(s.leases.Active()), Kinds: s.kinds(), Region: g.Region}
}

// startRoster joins the cluster (New).
func (s *Server) startRoster(set *Reloadable) error {
	if set.Gossip == nil {
		return nil
	}
	n, err := s.newRoster(set.PrivateKey, set.Gossip, s.rosterInfoOf(set.Gossip), s.trust.Live)
	if err != nil {
		return err
	}
	s.gossip.node, s.gossip.key, s.gossip.cfg = n, set.PrivateKey, set.Gossip
	return nil
}

// newRoster starts a roster node under key with the gossip settings g
// and the entry info, verifying entries against trust (safe off the event
// loop: it reads only its arguments).
func (s *Server) newRoster(key proto.Key, g *GossipConfig, info roster.Info, trust *collective.Trust) (*roster.Node, error) {
	n, err := roster.Start(roster.Config{
		Bind: g.Bind, Advertise: g.Advertise, Join: g.Join, Secret: g.Secret,
		ProbeInterval: g.ProbeInterval, ProbeTimeout: g.ProbeTimeout,
		SuspicionMult: g.Tuning.SuspicionMult, SuspicionMaxTimeoutMult: g.Tuning.SuspicionMaxMult, GossipNodes: g.Tuning.GossipNodes,
		GossipInterval: g.Tuning.GossipInterval, PushPullInterval: g.Tuning.PushPullInterval, RetransmitMult: g.Tuning.RetransmitMult,
		Key: key, Cert: g.Cert, Trust: trust,
		Log: s.log.With("part", "roster"), Now: s.now,
		OnRefused: func(reason string) { s.met.rosterRefused.WithLabelValues(reason).Inc() },
		OnCRL: func(*collective.RevocationList) {
			select { // the event loop writes crl_file and drops the revoked
			case s.gossip.crlKick <- struct{}{}:
			default:
			}
		},
		OnCRLRefused: func(reason string) { s.met.crlRefused.WithLabelValues(reason).Inc() },
	}, info)
	if err != nil {
		return nil, err
	}
	s.log.Info("gossip started", "bind", g.Bind, "advertise", g.Advertise, "join", g.Join, "announce", g.Announce, "region", g.Region)
	return n, nil
}

// gossipState is the relay's gossip part (event loop only): the roster
// node, when its entry was last signed, and its restarts off the loop.
type gossipState struct {
	node *roster.Node // nil: no gossip, or restarting
	at   time.Time    // entry last re-signed
	// done: a roster restarted off the loop (key rotation); restarting
	// while one is under way; key: the key the node runs (or is
	// restarting) under.
	done       chan rosterRestart
	restarting bool
	key        proto.Key
	cfg        *GossipConfig // the settings the node runs (or is restarting) with
	crlKick    chan struct{} // the roster installed a revocation list from gossip
}

// rosterRestart is the outcome of a roster restarted off the event loop.
type rosterRestart struct {
	n   *roster.Node
	err error
}

// restartRoster leaves the cluster under the old node (if any) and joins
// under key with the settings g, off the event loop: leaving waits up to a second and for the
// node's goroutines (a join to an unreachable address takes up to
// memberlist's 10 s TCP timeout), and joining again blocks on the join
// addresses; handshakes, grants and renewals must not wait for that. The
// new node reaches the loop through s.gossip.done; meanwhile the relay
// serves no roster.
func (s *Server) restartRoster(old *roster.Node, key proto.Key, g *GossipConfig) {
	s.gossip.node = nil
	s.gossip.restarting, s.gossip.key, s.gossip.cfg = true, key, g
	info, trust := s.rosterInfoOf(g), s.trust.Live // event-loop state: read here, not in the goroutine
	go func() {
		if old != nil {
			_ = old.Close() // the others drop the old identity at once
		}
		n, err := s.newRoster(key, g, info, trust)
		s.gossip.done <- rosterRestart{n, err}
	}()
}

// rosterRestarted installs a restarted roster node (event loop).
func (s *Server) rosterRestarted(r rosterRestart, stopping bool) {
	s.gossip.restarting = false
	switch {
	case r.err != nil:
		s.log.Error("reload: gossip with the new key failed; this relay is out of the roster until a reload that fixes it (or a restart)", "err", r.err)
	case stopping:
		_ = r.n.Close()
	default:
		s.gossip.node = r.n
		if s.trust.Live != nil {
			r.n.SetTrust(s.trust.Live) // a reload may have come meanwhile
		}
		if s.set.PrivateKey != s.gossip.key {
			// The key changed again meanwhile: join under it, with the
			// newest file's gossip settings (or the running ones if it has
			// none: gossip stops only on restart).
			g := s.set.Gossip
			if g == nil {
				g = s.gossip.cfg
			}
			s.restartRoster(s.gossip.node, s.set.PrivateKey, g)
		}
	}
}

// tickRoster re-signs the entry with the current load (event loop).
func (s *Server) tickRoster(now time.Time) {
	if s.gossip.node == nil || now.Sub(s.gossip.at) < rosterUpdateEvery {
		return
	}
	s.gossip.at = now
	if err := s.gossip.node.Update(s.rosterInfo()); err != nil {
		s.log.Warn("roster: updating this relay's entry", "err", err)
	}
	s.met.rosterSize.Set(float64(len(s.gossip.node.Entries())))
}

// reloadRoster: gossip settings apply at start, except with a new relay
// key (key rotation): the node is named for the key and its entry signed
// with it, so the relay leaves the cluster under the old key and joins
// under the new one, with the new gossip settings and certificate. A new
// authority applies to the entries at once.
func (s *Server) reloadRoster(set *Reloadable) {
	if s.gossip.restarting {
		// A key newer than the one the restart under way joins with: the
		// roster restarts again for it, with this file's gossip settings,
		// once this restart ends (rosterRestarted).
		return
	}
	if set.Gossip != nil && (s.gossip.node != nil && set.PrivateKey != s.gossip.key || s.gossip.node == nil && s.gossip.cfg != nil) {
		// A new relay key (the node is named for it), or a roster that a
		// failed restart left stopped: leave and join again, off the loop.
		s.restartRoster(s.gossip.node, set.PrivateKey, set.Gossip)
		return
	}
	if !set.Gossip.same(s.gossip.cfg) {
		s.log.Warn("reload: collective.gossip and certificate_file changed but apply only at start (or with a new relay key): restart the relay to apply them")
	}
	if s.gossip.node != nil && s.trust.Live != nil {
		s.gossip.node.SetTrust(s.trust.Live)
	}
}

// serveRoster answers OpRoster: a page of the verified roster, in the
// roster's order (by relay name), from req.Start.
func (s *Server) serveRoster(_ *session, req *proto.RosterRequest) answer {
	if s.gossip.node == nil {
		return refused(proto.ReasonUnsupported)
	}
	// From the snapshot built once per roster change (encoded once,
	// digest once; internal/roster/snapshot.go).
	return success(&proto.RosterReply{Roster: s.gossip.node.Snapshot().Page(req.Start, req.HasDigest, req.Have)})
}

// rosterStatus is the roster part of `mpdetour relay status`.
func (s *Server) rosterStatus() *RosterStatus {
	if s.gossip.node == nil {
		return nil
	}
	rs := &RosterStatus{Gossip: s.gossip.cfg.Advertise.String(), Members: s.gossip.node.Members(), Refused: s.gossip.node.Refused(), CRLRefused: s.gossip.node.CRLRefused()}
	if l := s.trust.Live.CRL(); l != nil {
		rs.CRLSeq, rs.CRLSerials = l.Seq, len(l.Serials)
	}
	for _, e := range s.gossip.node.Entries() {
		rs.Relays = append(rs.Relays, RosterRelay{Name: e.Name(), Key: e.Key().String(), Addrs: e.Addrs, Region: e.Region,
			Kinds: e.Kinds.String(), Capacity: e.Capacity, Load: e.Load, Issued: e.Issued, Self: e.Key() == s.set.PrivateKey.Public()})
	}
	return rs
}

// RosterStatus is the relay's view of the roster.
type RosterStatus struct {
	Gossip  string            `json:"gossip"`  // this relay's gossip address
	Members int               `json:"members"` // gossip members alive (verified or not)
	Relays  []RosterRelay     `json:"relays"`  // verified entries
	Refused map[string]uint64 `json:"refused"` // entries refused, by reason
	// The revocation list applied (seq 0: none) and gossiped lists refused
	// by reason.
	CRLSeq     uint64            `json:"crl_seq"`
	CRLSerials int               `json:"crl_serials"`
	CRLRefused map[string]uint64 `json:"crl_refused,omitempty"`
}

// RosterRelay is one verified roster entry.
type RosterRelay struct {
	Name     string           `json:"name"`
	Key      string           `json:"key"`
	Addrs    []netip.AddrPort `json:"addrs"`
	Region   string           `json:"region"`
	Kinds    string           `json:"kinds"`
	Capacity uint32           `json:"capacity"`
	Load     uint32           `json:"load"`
	Issued   time.Time        `json:"issued"`
	Self     bool             `json:"self,omitempty"`
}
