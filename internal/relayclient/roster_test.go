package relayclient

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// The roster digest against fake relays: one that knows digests (a held
// roster is answered "unchanged"; a roster that changes between pages
// is read again from the start) and an older one that refuses a digest
// as malformed (the source reads it whole from then on, without asking
// with a digest again). Entries are signed by relays of the authority
// (tunnel kind only: the source does not dial them); garbage ones are
// refused and counted.
func TestRosterDigest(t *testing.T) {
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var entries [][]byte
	for i := range 10 {
		k := memberKey(t)
		cert, err := auth.Issue(k.Public(), fmt.Sprintf("relay%d", i), collective.RoleRelay, now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		e := &roster.Entry{Issued: now.Add(-time.Second).Truncate(time.Millisecond), Capacity: 10, Kinds: roster.KindTunnel,
			Addrs: []netip.AddrPort{netip.MustParseAddrPort(fmt.Sprintf("192.0.2.%d:45673", i+1))}, Cert: cert}
		if err := e.Sign(k); err != nil {
			t.Fatal(err)
		}
		b, err := e.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, b)
	}
	newer := func(digest *atomic.Uint64, withDigest, without *atomic.Int32) func(proto.Request, int32) proto.Reply {
		return func(req proto.Request, _ int32) proto.Reply {
			rq, isRoster := req.Body.(*proto.RosterRequest)
			if !isRoster {
				return proto.Reply{Reason: proto.ReasonUnsupported}
			}
			if !rq.HasDigest {
				without.Add(1)
			} else {
				withDigest.Add(1)
			}
			d := digest.Load()
			p := proto.RosterPage{Total: uint16(len(entries)), Start: rq.Start}
			if rq.HasDigest {
				p.Digest = d
				if rq.Have == d {
					return proto.Reply{Body: &proto.RosterReply{Roster: p}}
				}
			}
			p.Entries = page(entries, int(rq.Start))
			return proto.Reply{Body: &proto.RosterReply{Roster: p}}
		}
	}

	t.Run("unchanged", func(t *testing.T) {
		m := memberKey(t)
		r := newFakeRelay(t, m.Public())
		var digest atomic.Uint64
		var with, without atomic.Int32
		digest.Store(77)
		r.mu.Lock()
		r.answer = newer(&digest, &with, &without)
		r.mu.Unlock()
		s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()},
			Discovery: &Discovery{Trust: collective.NewTrust(auth.Public()), Every: 20 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitFor(t, "five unchanged reads", func() bool { _, u := s.RosterReads(); return u >= 5 })
		full, _ := s.RosterReads()
		if full != 1 || s.RosterRefused() != 0 || without.Load() != 0 {
			t.Fatalf("roster unchanged: %d whole reads, %d entries refused, %d requests without digest; want 1, 0, 0", full, s.RosterRefused(), without.Load())
		}
		digest.Store(78) // the roster changes: read whole once more
		waitFor(t, "a second whole read", func() bool { f, _ := s.RosterReads(); return f == 2 })
	})

	t.Run("refused entry", func(t *testing.T) {
		// An entry refused (here garbage; in life also one "issued in
		// the future" on this host's clock) makes every read whole: it
		// may verify later.
		m := memberKey(t)
		r := newFakeRelay(t, m.Public())
		var digest atomic.Uint64
		digest.Store(90)
		entries := append(slices.Clone(entries[:9]), []byte{1, 2, 3})
		r.mu.Lock()
		r.answer = func(req proto.Request, _ int32) proto.Reply {
			rq, isRoster := req.Body.(*proto.RosterRequest)
			if !isRoster {
				return proto.Reply{}
			}
			p := proto.RosterPage{Total: uint16(len(entries)), Start: rq.Start, Digest: digest.Load()}
			if rq.Have == p.Digest {
				return proto.Reply{Body: &proto.RosterReply{Roster: p}}
			}
			p.Entries = page(entries, int(rq.Start))
			return proto.Reply{Body: &proto.RosterReply{Roster: p}}
		}
		r.mu.Unlock()
		s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()},
			Discovery: &Discovery{Trust: collective.NewTrust(auth.Public()), Every: 20 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitFor(t, "five whole reads", func() bool { f, _ := s.RosterReads(); return f >= 5 })
		if _, u := s.RosterReads(); u != 0 || s.RosterRefused() < 4 {
			t.Fatalf("with a refused entry: %d unchanged reads, %d refusals; want 0 and one per read", u, s.RosterRefused())
		}
	})

	t.Run("changes between pages", func(t *testing.T) {
		m := memberKey(t)
		r := newFakeRelay(t, m.Public())
		var digest atomic.Uint64
		var with, without atomic.Int32
		digest.Store(5)
		inner := newer(&digest, &with, &without)
		var pages atomic.Int32
		r.mu.Lock()
		r.answer = func(req proto.Request, n int32) proto.Reply {
			rep := inner(req, n)
			if req.Op != proto.OpRoster {
				return rep
			}
			if pages.Add(1) == 1 {
				digest.Store(6) // after the first page went out
			}
			return rep
		}
		r.mu.Unlock()
		c, ctx := dialFake(t, r, m, relayconn.Options{})
		got, err := c.RosterSince(ctx, 256, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Entries) != len(entries) || got.Digest != 6 || pages.Load() != 4 {
			t.Fatalf("read across a change: %d entries, digest %d, %d pages; want %d, 6, 4 (2 pages, then 2 again)", len(got.Entries), got.Digest, pages.Load(), len(entries))
		}
	})

	t.Run("older relay", func(t *testing.T) {
		m := memberKey(t)
		r := newFakeRelay(t, m.Public())
		var digest atomic.Uint64
		var with, without atomic.Int32
		digest.Store(9)
		inner := newer(&digest, &with, &without)
		r.mu.Lock()
		r.answer = func(req proto.Request, n int32) proto.Reply {
			if rq, ok := req.Body.(*proto.RosterRequest); ok && rq.HasDigest {
				with.Add(1)
				return proto.Reply{Reason: proto.ReasonMalformed}
			}
			rep := inner(req, n)
			if rr, ok := rep.Body.(*proto.RosterReply); ok {
				rr.Roster.Digest = 0
			}
			return rep
		}
		r.mu.Unlock()
		s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()},
			Discovery: &Discovery{Trust: collective.NewTrust(auth.Public()), Every: 20 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitFor(t, "five whole reads", func() bool { f, _ := s.RosterReads(); return f >= 5 })
		if _, u := s.RosterReads(); u != 0 || with.Load() != 1 {
			t.Fatalf("older relay: %d unchanged reads, %d requests with a digest; want 0 and 1", u, with.Load())
		}
	})
}

// page is what a relay fits in one roster reply from start (docs/collective.md).
func page(entries [][]byte, start int) [][]byte {
	size := 8 + 5 + 8
	var out [][]byte
	for _, e := range entries[min(start, len(entries)):] {
		if len(out) == proto.MaxRosterPage || size+2+len(e) > proto.MaxReplyLen {
			break
		}
		size += 2 + len(e)
		out = append(out, e)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Agents that list the same relays start reading the roster at a relay
// chosen at random and keep to it while it answers (its digest saves
// whole reads): the reads of many agents spread over the relays. 20
// agents against 3 relays: each reads from one relay only, and not all
// from the same one (all 20 on one relay by chance: 3^-19).
func TestRosterReadsSpreadOverRelays(t *testing.T) {
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	const agents = 20
	var keys []proto.Key
	for range agents {
		keys = append(keys, memberKey(t))
	}
	var mu sync.Mutex
	reads := map[proto.Key]map[int]int{} // agent -> relay -> roster reads
	var conf []relayconn.Relay
	for i := range 3 {
		r := newFakeRelay(t, keys[0].Public())
		r.mu.Lock()
		r.members = map[proto.Key]bool{}
		for _, k := range keys {
			r.members[k.Public()] = true
		}
		r.answerFrom = func(req proto.Request, peer proto.Key) proto.Reply {
			rq, ok := req.Body.(*proto.RosterRequest)
			if !ok {
				return proto.Reply{Reason: proto.ReasonUnsupported}
			}
			mu.Lock()
			if reads[peer] == nil {
				reads[peer] = map[int]int{}
			}
			reads[peer][i]++
			mu.Unlock()
			return proto.Reply{Body: &proto.RosterReply{Roster: proto.RosterPage{Start: rq.Start, Digest: 1}}}
		}
		r.mu.Unlock()
		conf = append(conf, r.relay())
	}
	chosen := map[int]int{}
	for agent, k := range keys {
		s, err := NewSource(SourceConfig{PrivateKey: k, Relays: conf,
			Discovery: &Discovery{Trust: collective.NewTrust(auth.Public()), Every: 10 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "three roster reads", func() bool { f, u := s.RosterReads(); return f+u >= 3 })
		mu.Lock()
		used := maps.Clone(reads[k.Public()]) // before Close: a read cut short by it may go on to another relay
		mu.Unlock()
		s.Close()
		if len(used) != 1 {
			t.Fatalf("agent %d read the roster from relays %v (relay: reads); want one relay", agent, used)
		}
		for i := range used {
			chosen[i]++
		}
	}
	if len(chosen) < 2 {
		t.Fatalf("%d agents read the roster from relays %v (relay: agents); want reads spread over more than one relay", agents, chosen)
	}
	t.Logf("agents per relay: %v", chosen)
}
