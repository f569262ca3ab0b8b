package relayclient

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// Discovery configures a NATSource to use relays of the collective's roster
// besides its configured ones: it reads the roster from a configured relay
// every Every, verifies every entry (the authority's certificate with the
// role relay, the relay's signature), and asks up to Max of the listed
// relays per address family (least loaded first) for grants as well, each
// over a session of the servers' family opened when first needed. A relay
// that leaves the roster is dropped, the grants of both its sessions
// released.
type Discovery struct {
	Trust *collective.Trust
	Max   int           // discovered relays in use per address family (default 4)
	Every time.Duration // roster poll period (default DefaultDiscoveryEvery)
	Fetch int           // entries read per poll at most (default 256)
}

// DefaultDiscoveryEvery is how often an agent reads the roster by
// default. An unchanged roster costs one small page (its digest), so the
// agent can afford to look often: a relay that died is out of the relays'
// rosters within 4 s (docs/collective.md), and out of the agents' use at
// most one period later.
const DefaultDiscoveryEvery = 500 * time.Millisecond

// discovered is a relay of the roster in use: picked per family (up to
// Discovery.Max relays per family), its session of a family opened only
// when a server of that family is prepared (openFor), so that an agent
// without IPv6 holds no failing IPv6 session to each relay.
type discovered struct {
	entry *roster.Entry
	addrs [2]netip.AddrPort // the entry's control address per family (IPv4, IPv6) when picked
	// picked: used for servers of the family; idx: the open session in
	// NATSource.conns (-1: none); retryAt, backoff: a session whose
	// handshake failed is closed and not opened again before retryAt
	// (backoff doubles from RetryAfter up to MaxSessionBackoff).
	picked  [2]bool
	idx     [2]int
	retryAt [2]time.Time
	backoff [2]time.Duration
}

// relay is dr's session of family f: named roster:NAME/v4 and
// roster:NAME/v6 when the entry lists both families (as a configured
// relay's FileRelay.Addresses), roster:NAME when it lists one.
func (dr *discovered) relay(f int) relayconn.Relay {
	r := relayconn.Relay{Name: "roster:" + dr.entry.Name(), Entry: "roster:" + dr.entry.Name(), Addr: dr.addrs[f], PublicKey: dr.entry.Key()}
	if dr.addrs[0].IsValid() && dr.addrs[1].IsValid() {
		r.Name += "/v" + [2]string{"4", "6"}[f]
	}
	return r
}

// MaxSessionBackoff bounds the wait before a discovered relay's session
// whose handshake failed is opened again (for a server of its family).
const MaxSessionBackoff = 5 * time.Minute

// discover polls the roster until the source closes.
func (s *NATSource) discover() {
	defer s.wg.Done()
	d := s.cfg.Discovery
	// Start at a configured relay chosen at random: agents that list the
	// same relays in the same order would otherwise all read the first
	// one, and a relay serves ~10,000 members' reads (docs/collective.md).
	if len(s.static) > 0 {
		s.rosterFrom = rand.IntN(len(s.static))
	}
	t := time.NewTicker(d.Every)
	defer t.Stop()
	for {
		s.discoverOnce()
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fetchRoster reads and verifies the roster from the first configured
// relay that answers, starting at the last one that did (at first a
// random one: discover). A roster
// whose digest is the one read last is not sent again (a few dozen bytes
// per poll) and its entries are not verified again.
func (s *NATSource) fetchRoster() ([]*roster.Entry, error) {
	d := s.cfg.Discovery
	var errs []error
	for i := range s.static {
		if err := s.ctx.Err(); err != nil {
			return nil, err // closing: do not try the other relays
		}
		j := (s.rosterFrom + i) % len(s.static)
		c := s.static[j]
		digest := !s.rosterNoDigest[j]
		have := s.rosterDigest
		if j != s.rosterFrom {
			have = 0
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
		r, err := c.RosterSince(ctx, d.Fetch, have, digest)
		if digest && proto.ReasonOf(err) == proto.ReasonMalformed {
			// A relay older than the roster digest: read it whole.
			s.log.Info("roster: relay does not know roster digests, reading the whole roster each time", "relay", c.Relay().Name)
			s.rosterNoDigest[j] = true
			r, err = c.RosterSince(ctx, d.Fetch, 0, false)
		}
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.rosterFrom = j
		if r.Unchanged {
			s.rosterReads[1].Add(1)
			// Verified at the whole read; their certificates may have
			// expired since (on this host's clock).
			now := time.Now()
			return slices.DeleteFunc(slices.Clone(s.rosterLast), func(e *roster.Entry) bool { return !now.Before(e.Cert.NotAfter) }), nil
		}
		s.rosterReads[0].Add(1)
		now := time.Now()
		var out []*roster.Entry
		for _, b := range r.Entries {
			e, err := roster.Parse(b)
			if err == nil {
				err = e.Verify(d.Trust, now)
			}
			if err != nil {
				s.log.Warn("roster entry refused", "from", c.Relay().Name, "reason", roster.Reason(err), "err", err)
				s.refused.Add(1)
				continue
			}
			out = append(out, e)
		}
		s.rosterDigest, s.rosterLast = r.Digest, out
		if len(out) < len(r.Entries) {
			// An entry was refused: read the roster whole again next
			// time (an entry refused for this host's clock, say issued
			// "in the future", may verify later).
			s.rosterDigest = 0
		}
		return out, nil
	}
	return nil, errors.Join(errs...)
}

func (s *NATSource) discoverOnce() {
	entries, err := s.fetchRoster()
	if err != nil {
		if s.ctx.Err() == nil {
			s.log.Info("roster: no configured relay answered", "err", err)
		}
		return // keep what we have: a roster we cannot read says nothing
	}
	d := s.cfg.Discovery
	s.mu.Lock() // Rotate changes the key
	own := s.cfg.PrivateKey.Public()
	s.mu.Unlock()
	skip := map[proto.Key]bool{own: true}
	for _, c := range s.static {
		skip[c.Relay().PublicKey] = true
	}
	listed := map[proto.Key]*roster.Entry{}
	for _, e := range entries {
		if !skip[e.Key()] && e.Kinds&roster.KindNAT != 0 {
			if a := controlAddrs(e); a[0].IsValid() || a[1].IsValid() {
				listed[e.Key()] = e
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	// Drop relays that left the roster (or moved: they come back below).
	for k, dr := range s.found {
		if e := listed[k]; e == nil || controlAddrs(e) != dr.addrs {
			s.dropLocked(k, dr)
		}
	}
	// Per family, add the least loaded listed relays up to Max.
	for f := range 2 {
		n := 0
		var cand []*roster.Entry
		for k, e := range listed {
			if dr := s.found[k]; dr != nil {
				dr.entry = e
				if dr.picked[f] {
					n++
					continue
				}
			}
			if controlAddrs(e)[f].IsValid() {
				cand = append(cand, e)
			}
		}
		rand.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
		slices.SortStableFunc(cand, func(a, b *roster.Entry) int {
			return cmp.Compare(float64(a.Load)/float64(a.Capacity), float64(b.Load)/float64(b.Capacity))
		})
		for _, e := range cand[:min(len(cand), max(d.Max-n, 0))] {
			dr := s.found[e.Key()]
			if dr == nil {
				dr = &discovered{entry: e, addrs: controlAddrs(e), idx: [2]int{-1, -1}}
				s.found[e.Key()] = dr
			}
			dr.picked[f] = true
			s.log.Info("roster: using discovered relay", "relay", e.Name(), "family", familyName[f], "addr", dr.addrs[f], "region", e.Region, "load", e.Load, "capacity", e.Capacity)
		}
	}
	// Servers already in use get grants from the new relays at once
	// (their sessions of the servers' families open now).
	servers := map[netip.AddrPort]bool{}
	for k := range s.entries {
		servers[k.server] = true
	}
	var fams [2]bool
	for srv := range servers {
		fams[family(srv.Addr())] = true
	}
	var added []int
	for f, used := range fams {
		if used {
			added = append(added, s.openLocked(f)...)
		}
	}
	for _, i := range added {
		for srv := range servers {
			if !grantsToward(s.conns[i], srv) {
				continue
			}
			k := entryKey{i, srv}
			e := &entry{pending: true}
			s.entries[k] = e
			s.wg.Add(1)
			go s.grant(k, e, s.conns[i])
		}
	}
}

var familyName = [2]string{"IPv4", "IPv6"}

// family is 0 for an IPv4 address (also IPv4-mapped), 1 for IPv6.
func family(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 0
	}
	return 1
}

// openFor opens the sessions of server's family of the discovered relays
// picked for it that have none (and are not backing off): Prepare calls
// it, so a family's sessions exist only once a server of it is used.
func (s *NATSource) openFor(server netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() == nil {
		s.openLocked(family(server.Addr()))
	}
}

// openLocked opens family f's sessions of the picked discovered relays
// that have none and are not backing off; it returns their indices in
// s.conns (sessions are named by discovered.relay).
func (s *NATSource) openLocked(f int) []int {
	now := time.Now()
	var out []int
	for _, dr := range s.found {
		if !dr.picked[f] || dr.idx[f] >= 0 || now.Before(dr.retryAt[f]) {
			continue
		}
		r := dr.relay(f)
		c, err := relayconn.Dial(r, s.cfg.PrivateKey, s.cfg.Options)
		if err != nil {
			s.log.Warn("roster: dialling a discovered relay", "relay", r.Name, "addr", r.Addr, "err", err)
			s.backOffLocked(dr, f, now)
			continue
		}
		dr.idx[f] = s.slotLocked(c)
		out = append(out, dr.idx[f])
		s.log.Debug("roster: session opened", "relay", r.Name, "addr", r.Addr)
	}
	return out
}

// slotLocked puts discovered session c into s.conns and returns its
// index: the first slot a closed discovered session left, if one is free
// (no entry names it, no release through it is in flight), else a new
// one. Without reuse a relay that keeps failing its handshake grew s.conns
// by a slot per retry (~1,150 a day for 4 relays), and every Prepare
// walks s.conns. Requests started for the slot's former session carry
// that session (grant, renew) and their entries, so they never act on the
// new one.
func (s *NATSource) slotLocked(c *relayconn.Conn) int {
	busy := map[int]bool{}
	for ek := range s.entries {
		busy[ek.relay] = true
	}
	for ek := range s.releasing {
		busy[ek.relay] = true
	}
	for i := len(s.static); i < len(s.conns); i++ {
		if s.conns[i] == nil && !busy[i] {
			s.conns[i] = c
			return i
		}
	}
	s.conns = append(s.conns, c)
	return len(s.conns) - 1
}

// backOffLocked: family f's session of dr failed; it is not opened again
// for a while (RetryAfter, doubling per failure in a row up to
// MaxSessionBackoff).
func (s *NATSource) backOffLocked(dr *discovered, f int, now time.Time) {
	dr.backoff[f] = min(max(2*dr.backoff[f], s.cfg.RetryAfter), MaxSessionBackoff)
	dr.retryAt[f] = now.Add(dr.backoff[f])
}

// sessionOf finds discovered session i: its relay and family (nil: i is
// not a discovered session).
func (s *NATSource) sessionOf(i int) (*discovered, int) {
	for _, dr := range s.found {
		for f := range 2 {
			if dr.idx[f] == i {
				return dr, f
			}
		}
	}
	return nil, 0
}

// handshakeFailedLocked: a grant over discovered session i failed before
// its first handshake completed (the relay does not answer on that
// family's address: say, no IPv6 route; or it refused the handshake).
// The session closes, its entries go (they hold no grant) and the family
// backs off; the relay's other family is untouched.
func (s *NATSource) handshakeFailedLocked(i int) {
	dr, f := s.sessionOf(i)
	if dr == nil {
		return
	}
	c := s.conns[i]
	for ek := range s.entries {
		if ek.relay == i {
			delete(s.entries, ek)
		}
	}
	s.conns[i], dr.idx[f] = nil, -1
	s.backOffLocked(dr, f, time.Now())
	s.log.Info("roster: no handshake with a discovered relay: session closed, backing off", "relay", c.Relay().Name, "addr", c.Relay().Addr, "retry_in", dr.backoff[f])
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = c.Close()
	}()
}

// grantedLocked: discovered session i got a grant; its family's backoff
// starts again from RetryAfter at the next failure.
func (s *NATSource) grantedLocked(i int) {
	if dr, f := s.sessionOf(i); dr != nil {
		dr.backoff[f] = 0
	}
}

// dropLocked stops using a discovered relay: the detours of both its
// sessions disappear now, their grants are released in the background (a
// relay that is gone does not answer: bounded by RequestTimeout), then
// the sessions close.
func (s *NATSource) dropLocked(k proto.Key, dr *discovered) {
	delete(s.found, k)
	for _, i := range dr.idx {
		if i < 0 {
			continue
		}
		c := s.conns[i]
		var ports []uint16
		for ek, e := range s.entries {
			if ek.relay == i {
				delete(s.entries, ek)
				if e.detour.IsValid() {
					ports = append(ports, e.detour.Port())
				}
			}
		}
		s.conns[i] = nil
		s.log.Info("roster: relay left the roster, dropped", "relay", c.Relay().Name, "released", len(ports))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
			defer cancel()
			for _, p := range ports {
				if err := c.Release(ctx, p); err != nil {
					break
				}
			}
			_ = c.Close()
		}()
	}
	s.notify()
}

// controlAddrs is an entry's first control address of each family
// (IPv4, IPv6; zero: none): a discovered relay has a session per family
// it lists, each granting toward servers of its own family.
func controlAddrs(e *roster.Entry) [2]netip.AddrPort {
	var out [2]netip.AddrPort
	for _, a := range e.Addrs {
		ip := a.Addr().Unmap()
		if f := family(ip); !out[f].IsValid() && ip.IsValid() && !ip.IsUnspecified() && ip.Zone() == "" {
			out[f] = netip.AddrPortFrom(ip, a.Port())
		}
	}
	return out
}

// Discovered lists the roster relays in use now, one per family each is
// used for (name, control address), whether its session of that family
// is open yet or not (sessions open when a server of their family is
// prepared).
func (s *NATSource) Discovered() []relayconn.Relay {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []relayconn.Relay
	for _, dr := range s.found {
		for f := range 2 {
			if !dr.picked[f] {
				continue
			}
			out = append(out, dr.relay(f))
		}
	}
	slices.SortFunc(out, func(a, b relayconn.Relay) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// RosterReads counts the roster reads that got the roster (the first, and
// those after a change) and those the relay answered "unchanged".
func (s *NATSource) RosterReads() (full, unchanged uint64) {
	return s.rosterReads[0].Load(), s.rosterReads[1].Load()
}

// RosterRefused counts roster entries this source refused (forged, expired,
// revoked, not a relay...).
func (s *NATSource) RosterRefused() uint64 { return s.refused.Load() }
