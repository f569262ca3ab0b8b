package relayclient

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// The roster digest against fake relays: one that knows digests (a held
// roster is answered "unchanged"; a roster that changes between pages
// is read again from the start) and an older one that refuses a digest
// as malformed (the source reads it whole from then on, without asking
// with a digest again). Entries are garbage here: refused and counted,
// which also shows whether a read delivered them.
func TestRosterDigest(t *testing.T) {
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	entries := [][]byte{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}}
	newer := func(digest *atomic.Uint64, withDigest, without *atomic.Int32) func(proto.Request, int32) proto.Reply {
		return func(req proto.Request, _ int32) proto.Reply {
			if req.Op != proto.OpRoster {
				return proto.Reply{Reason: proto.ReasonUnsupported}
			}
			if !req.HasDigest {
				without.Add(1)
			} else {
				withDigest.Add(1)
			}
			d := digest.Load()
			p := proto.RosterPage{Total: uint16(len(entries)), Start: req.Start}
			if req.HasDigest {
				p.Digest = d
				if req.Have == d {
					return proto.Reply{Roster: p}
				}
			}
			p.Entries = entries[req.Start:min(int(req.Start)+proto.MaxRosterPage, len(entries))]
			return proto.Reply{Roster: p}
		}
	}

	t.Run("unchanged", func(t *testing.T) {
		m := memberKey(t)
		r := newFakeRelay(t, m.Public())
		var digest atomic.Uint64
		var with, without atomic.Int32
		digest.Store(77)
		r.answer = newer(&digest, &with, &without)
		s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []Relay{r.relay()},
			Discovery: &Discovery{Trust: collective.NewTrust(auth.Public()), Every: 20 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waitFor(t, "five unchanged reads", func() bool { _, u := s.RosterReads(); return u >= 5 })
		full, _ := s.RosterReads()
		if full != 1 || s.RosterRefused() != uint64(len(entries)) || without.Load() != 0 {
			t.Fatalf("roster unchanged: %d whole reads, %d entries refused, %d requests without digest; want 1, %d, 0", full, s.RosterRefused(), without.Load(), len(entries))
		}
		digest.Store(78) // the roster changes: read whole once more
		waitFor(t, "a second whole read", func() bool { f, _ := s.RosterReads(); return f == 2 })
		if got := s.RosterRefused(); got != 2*uint64(len(entries)) {
			t.Fatalf("%d entries refused after the change, want %d", got, 2*len(entries))
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
		c, ctx := dialFake(t, r, m, Options{})
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
		r.answer = func(req proto.Request, n int32) proto.Reply {
			if req.HasDigest {
				with.Add(1)
				return proto.Reply{Reason: proto.ReasonMalformed}
			}
			rep := inner(req, n)
			rep.Roster.Digest = 0
			return rep
		}
		s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []Relay{r.relay()},
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
