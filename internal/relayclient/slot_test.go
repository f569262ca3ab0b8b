package relayclient

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// A grant over a discovered session that closed while the grant was in
// flight, its slot taken by another relay's session meanwhile: the grant
// the old relay answers goes back to the old relay, whether or not the new
// session waits for a grant toward the same server (the slot's entry is
// the new relay's: it does not stand for the old relay's mapping), and no
// release through the old session is recorded under the slot (a grant of
// the new session would wait for it).
func TestGrantOverReusedSlotReleasesOldSession(t *testing.T) {
	for _, newEntry := range []bool{true, false} {
		m := memberKey(t)
		r1, r2 := newFakeRelay(t, m.Public()), newFakeRelay(t, m.Public())
		boot := newFakeRelay(t, m.Public())
		s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{boot.relay()}})
		if err != nil {
			t.Fatal(err)
		}
		c1, _ := dialFake(t, r1, m, relayconn.Options{})
		c2, _ := dialFake(t, r2, m, relayconn.Options{})
		server := netip.MustParseAddrPort("192.0.2.10:5201")
		s.mu.Lock()
		s.conns = append(s.conns, c1) // a discovered session in slot 1
		k := entryKey{len(s.conns) - 1, server}
		e := &entry{pending: true}
		s.entries[k] = e
		s.mu.Unlock()
		var once sync.Once
		releasedUnderSlot := make(chan bool, 1)
		r1.mu.Lock()
		r1.answer = func(req proto.Request, _ int32) proto.Reply {
			switch req.Op {
			case proto.OpGrant:
				// While the grant is in flight the relay is dropped
				// (dropLocked) and its slot taken by r2's session.
				once.Do(func() {
					s.mu.Lock()
					delete(s.entries, k)
					s.conns[k.relay] = c2
					if newEntry {
						s.entries[k] = &entry{pending: true}
					}
					s.mu.Unlock()
				})
				return proto.Reply{Body: &proto.GrantReply{Detour: netip.MustParseAddrPort("127.0.0.1:40001"), Lease: time.Minute}}
			case proto.OpRelease:
				s.mu.Lock()
				_, under := s.releasing[k]
				s.mu.Unlock()
				select {
				case releasedUnderSlot <- under:
				default:
				}
			}
			return proto.Reply{}
		}
		r1.mu.Unlock()
		s.wg.Add(1)
		go s.grant(k, e, c1)
		select {
		case under := <-releasedUnderSlot:
			if under {
				t.Errorf("new entry %v: the old session's release is recorded under the slot now holding another relay's session", newEntry)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("new entry %v: the old relay's grant was never released (relay saw %d releases)", newEntry, r1.count(proto.OpRelease))
		}
		s.Close()
	}
}

// A renewal the relay answers "not found" re-grants; when the entry was
// released while that grant was in flight, the new mapping goes back to
// the relay (before, nobody ever released it: it stayed until its lease
// ran out).
func TestRenewRegrantAfterReleaseGivenBack(t *testing.T) {
	m := memberKey(t)
	r1 := newFakeRelay(t, m.Public())
	s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r1.relay()}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	s.mu.Lock()
	c1 := s.conns[0]
	k := entryKey{0, server}
	e := &entry{pending: true, detour: netip.MustParseAddrPort("127.0.0.1:40001")}
	s.entries[k] = e
	s.mu.Unlock()
	released := make(chan proto.Request, 4)
	r1.mu.Lock()
	r1.answer = func(req proto.Request, _ int32) proto.Reply {
		switch req.Op {
		case proto.OpRenew:
			return proto.Reply{Reason: proto.ReasonNotFound}
		case proto.OpGrant:
			s.mu.Lock()
			delete(s.entries, k) // released while the re-grant is in flight
			s.mu.Unlock()
			return proto.Reply{Body: &proto.GrantReply{Detour: netip.MustParseAddrPort("127.0.0.1:40002"), Lease: time.Minute}}
		case proto.OpRelease:
			released <- req
		}
		return proto.Reply{}
	}
	r1.mu.Unlock()
	s.wg.Add(1)
	go s.renew(k, e, c1)
	select {
	case req := <-released:
		if rel, ok := req.Body.(*proto.ReleaseRequest); !ok || rel.Port != 40002 {
			t.Fatalf("released %+v, want the re-granted port 40002", req.Body)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("the re-granted mapping of a released entry was never given back (relay saw %d releases)", r1.count(proto.OpRelease))
	}
}
