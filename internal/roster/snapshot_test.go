package roster

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// snapshotNode is a Node without memberlist (learn and forget called
// directly) holding n signed entries of f's authority.
func snapshotNode(t testing.TB, f *fixture, n int, now *atomic.Pointer[time.Time]) (*Node, []*Entry) {
	t.Helper()
	nd := &Node{cfg: Config{Now: func() time.Time { return *now.Load() }}, trust: f.trust, log: slog.New(slog.DiscardHandler), entries: map[string]*known{}, refused: map[string]uint64{}}
	var es []*Entry
	for i := range n {
		k, e := f.entry(t, fmt.Sprintf("relay%04d", i))
		b, _ := e.Bytes()
		nd.learn(&memberlist.Node{Name: NodeName(k.Public()), Meta: b})
		es = append(es, e)
	}
	return nd, es
}

func TestSnapshotCachedAndRebuilt(t *testing.T) {
	f := newFixture(t)
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	nd, es := snapshotNode(t, f, 20, &clock)
	s := nd.Snapshot()
	if len(s.Entries) != 20 || nd.Snapshot() != s {
		t.Fatalf("%d entries; the same snapshot twice: %v", len(s.Entries), nd.Snapshot() == s)
	}
	if !slices.IsSortedFunc(s.Entries, compareEntries) {
		t.Fatal("snapshot not in roster order")
	}
	for i, e := range s.Entries {
		b, _ := e.Bytes()
		if !bytes.Equal(b, s.Bytes[i]) {
			t.Fatalf("entry %d: cached bytes differ from its encoding", i)
		}
	}
	if s.Digest != RosterDigest(nd.Entries()) {
		t.Fatal("digest differs")
	}
	// A change (an entry leaves): rebuilt, other digest.
	nd.forget(&memberlist.Node{Name: NodeName(es[3].Key())})
	s2 := nd.Snapshot()
	if s2 == s || len(s2.Entries) != 19 || s2.Digest == s.Digest {
		t.Fatalf("after a leave: %d entries, digest changed %v", len(s2.Entries), s2.Digest != s.Digest)
	}
	// A newer revocation list revoking one: rebuilt without it.
	if _, err := f.trust.Install(f.auth.Revoke(nil, now, es[5].Cert.Serial)); err != nil {
		t.Fatal(err)
	}
	s3 := nd.Snapshot()
	if s3 == s2 || len(s3.Entries) != 18 {
		t.Fatalf("after the revocation: %d entries", len(s3.Entries))
	}
	// Certificates expire (the fixture's are valid 24 h): rebuilt, empty.
	later := now.Add(25 * time.Hour)
	clock.Store(&later)
	if s4 := nd.Snapshot(); len(s4.Entries) != 0 {
		t.Fatalf("after expiry: %d entries", len(s4.Entries))
	}
}

func TestSnapshotPages(t *testing.T) {
	f := newFixture(t)
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	nd, _ := snapshotNode(t, f, 20, &clock)
	s := nd.Snapshot()
	// Reading page by page yields every entry once, each page fits a reply.
	var got [][]byte
	for start := 0; start < 20; {
		p := s.Page(uint16(start), true, 0)
		if p.Digest != s.Digest || p.Total != 20 || int(p.Start) != start || len(p.Entries) == 0 {
			t.Fatalf("page from %d: %+v", start, p)
		}
		if _, err := proto.MarshalReply(proto.Reply{Op: proto.OpRoster, Body: &proto.RosterReply{Roster: p}}); err != nil {
			t.Fatalf("page from %d does not marshal: %v", start, err)
		}
		got = append(got, p.Entries...)
		start += len(p.Entries)
	}
	if !slices.EqualFunc(got, s.Bytes, bytes.Equal) {
		t.Fatal("pages do not add up to the roster")
	}
	if p := s.Page(0, true, s.Digest); len(p.Entries) != 0 || p.Digest != s.Digest || p.Total != 20 {
		t.Fatalf("unchanged: %+v", p)
	}
	if p := s.Page(0, false, 0); p.Digest != 0 || len(p.Entries) == 0 {
		t.Fatalf("without a digest: %+v", p)
	}
	if p := s.Page(500, true, 1); p.Start != 20 || len(p.Entries) != 0 {
		t.Fatalf("beyond the end: %+v", p)
	}
}

// BenchmarkRosterServe: one digest read ("unchanged") and one full page
// of a 1,000-relay roster, served from the snapshot against the way the
// relay served them before (sort, encode and hash every entry for each
// request: perRequest).
func BenchmarkRosterServe(b *testing.B) {
	f := newFixture(b)
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	nd, _ := snapshotNode(b, f, 1000, &clock)
	digest := nd.Snapshot().Digest
	for _, c := range []struct {
		name string
		have uint64
	}{{"unchanged", digest}, {"page", 0}} {
		b.Run("snapshot/"+c.name, func(b *testing.B) {
			for b.Loop() {
				_ = nd.Snapshot().Page(0, true, c.have)
			}
		})
		b.Run("perRequest/"+c.name, func(b *testing.B) {
			for b.Loop() {
				_ = perRequest(nd, c.have)
			}
		})
	}
}

// perRequest is the relay's roster serving before the snapshot (the
// benchmark's baseline).
func perRequest(nd *Node, have uint64) proto.RosterPage {
	now := nd.cfg.Now()
	nd.mu.Lock()
	all := make([]*Entry, 0, len(nd.entries))
	for _, k := range nd.entries {
		if now.Before(k.entry.Cert.NotAfter) && !nd.trust.Revoked(k.entry.Cert.Serial) {
			all = append(all, k.entry)
		}
	}
	nd.mu.Unlock()
	slices.SortFunc(all, compareEntries)
	p := proto.RosterPage{Total: uint16(len(all)), Digest: RosterDigest(all)}
	if p.Digest == have {
		return p
	}
	size := 5 + 8 + 8
	for _, e := range all {
		b, _ := e.Bytes()
		if len(p.Entries) == proto.MaxRosterPage || size+2+len(b) > proto.MaxReplyLen {
			break
		}
		size += 2 + len(b)
		p.Entries = append(p.Entries, b)
	}
	return p
}
