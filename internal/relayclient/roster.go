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
// relays (least loaded first) for grants as well. A relay that leaves the
// roster is dropped, its grants released.
type Discovery struct {
	Trust *collective.Trust
	Max   int           // discovered relays in use at once (default 4)
	Every time.Duration // roster poll period (default DefaultDiscoveryEvery)
	Fetch int           // entries read per poll at most (default 256)
}

// DefaultDiscoveryEvery is how often an agent reads the roster by
// default. An unchanged roster costs one small page (its digest), so the
// agent can afford to look often: a relay that died is out of the relays'
// rosters within 4 s (docs/collective.md), and out of the agents' use at
// most one period later.
const DefaultDiscoveryEvery = 500 * time.Millisecond

type discovered struct {
	idx   int // in NATSource.conns
	entry *roster.Entry
}

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
			if _, ok := controlAddr(e); ok {
				listed[e.Key()] = e
			}
		}
	}
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	// Drop relays that left the roster (or moved: they come back below).
	for k, dr := range s.found {
		e := listed[k]
		if a, _ := controlAddr(e); e == nil || a != s.conns[dr.idx].Relay().Addr {
			s.dropLocked(k, dr)
		}
	}
	// Add the least loaded listed relays up to Max.
	var cand []*roster.Entry
	for k, e := range listed {
		if _, ok := s.found[k]; ok {
			s.found[k].entry = e
			continue
		}
		cand = append(cand, e)
	}
	rand.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
	slices.SortStableFunc(cand, func(a, b *roster.Entry) int {
		return cmp.Compare(float64(a.Load)/float64(a.Capacity), float64(b.Load)/float64(b.Capacity))
	})
	var added []int
	for _, e := range cand {
		if len(s.found) >= d.Max {
			break
		}
		addr, _ := controlAddr(e)
		r := relayconn.Relay{Name: "roster:" + e.Name(), Addr: addr, PublicKey: e.Key()}
		c, err := relayconn.Dial(r, s.cfg.PrivateKey, s.cfg.Options)
		if err != nil {
			s.log.Warn("roster: dialling a discovered relay", "relay", e.Name(), "err", err)
			continue
		}
		s.conns = append(s.conns, c)
		s.found[e.Key()] = &discovered{idx: len(s.conns) - 1, entry: e}
		added = append(added, len(s.conns)-1)
		s.log.Info("roster: using discovered relay", "relay", e.Name(), "addr", addr, "region", e.Region, "load", e.Load, "capacity", e.Capacity)
	}
	// Servers already in use get grants from the new relays at once.
	if len(added) > 0 {
		servers := map[netip.AddrPort]bool{}
		for k := range s.entries {
			servers[k.server] = true
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
				go s.grant(k, e)
			}
		}
	}
	s.mu.Unlock()
}

// dropLocked stops using a discovered relay: its detours disappear now,
// its grants are released in the background (a relay that is gone does
// not answer: bounded by RequestTimeout), then its connection closes.
func (s *NATSource) dropLocked(k proto.Key, dr *discovered) {
	c := s.conns[dr.idx]
	var ports []uint16
	for ek, e := range s.entries {
		if ek.relay == dr.idx {
			delete(s.entries, ek)
			if e.detour.IsValid() {
				ports = append(ports, e.detour.Port())
			}
		}
	}
	s.conns[dr.idx] = nil
	delete(s.found, k)
	s.log.Info("roster: relay left the roster, dropped", "relay", c.Relay().Name, "released", len(ports))
	s.notify()
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

// controlAddr is the first IPv4 control address of an entry: a
// discovered relay is used over IPv4 only, so it grants toward IPv4
// servers only (configured relays may have an IPv6 session too:
// FileRelay.Addresses). A session per family for discovered relays is not
// built: an IPv4-only client would hold a failing IPv6 session to each.
func controlAddr(e *roster.Entry) (netip.AddrPort, bool) {
	if e == nil {
		return netip.AddrPort{}, false
	}
	for _, a := range e.Addrs {
		if a.Addr().Unmap().Is4() {
			return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()), true
		}
	}
	return netip.AddrPort{}, false
}

// Discovered lists the roster relays in use now (name, control address).
func (s *NATSource) Discovered() []relayconn.Relay {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []relayconn.Relay
	for _, dr := range s.found {
		out = append(out, s.conns[dr.idx].Relay())
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
