package relayclient

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// A relay restarted without its state file no longer has the granted port:
// a refused subflow (Refused) makes the source ask again at once, long
// before the renewal at half the 60 s lease, and the agent hears of the new
// detour (Changed). Further refusals within RegrantGap, refusals of a port
// the grant no longer has, and tunnel detours start nothing.
func TestSourceRegrantsAtOnceOnRefusal(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	var restarted atomic.Bool
	var grants atomic.Int32
	r.mu.Lock()
	r.answer = func(req proto.Request, n int32) proto.Reply {
		switch req.Op {
		case proto.OpGrant:
			g := grants.Add(1)
			return proto.Reply{Body: &proto.GrantReply{Detour: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(40000+g)), Lease: time.Minute}}
		case proto.OpRenew:
			if restarted.Load() {
				return proto.Reply{Reason: proto.ReasonNotFound}
			}
			return proto.Reply{Body: &proto.RenewReply{Lease: time.Minute}}
		}
		return proto.Reply{}
	}
	r.mu.Unlock()
	s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()}, Options: relayconn.Options{Retransmit: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	s.Prepare(server)
	select {
	case <-s.Changed():
	case <-time.After(3 * time.Second):
		t.Fatal("no grant")
	}
	old := s.Detours(server)
	if len(old) != 1 || old[0].Remote.Port() != 40001 {
		t.Fatalf("detours %v", old)
	}
	// The relay restarts without state: sessions and mappings are gone.
	r.forget()
	restarted.Store(true)
	start := time.Now()
	s.Refused(server, old[0])
	select {
	case <-s.Changed():
	case <-time.After(3 * time.Second):
		t.Fatal("no new grant within 3 s of a refused subflow (the renewal is due only at 30 s)")
	}
	now := s.Detours(server)
	if len(now) != 1 || now[0].Remote.Port() != 40002 {
		t.Fatalf("detours %v after the re-grant, want port 40002", now)
	}
	t.Logf("new grant %v after %v", now[0].Remote, time.Since(start).Round(time.Millisecond))
	// Bounded: more refusals (other subflows of the same burst, the old
	// port, a tunnel detour of that relay) ask nothing more.
	renews, gs := r.count(proto.OpRenew), r.count(proto.OpGrant)
	for range 20 {
		s.Refused(server, now[0])
		s.Refused(server, old[0])
		s.Refused(server, detour.Detour{Kind: detour.Tunnel, Relay: "fake", Remote: server})
	}
	time.Sleep(300 * time.Millisecond)
	if r.count(proto.OpRenew) != renews || r.count(proto.OpGrant) != gs {
		t.Fatalf("refusals within %v asked the relay again: renews %d -> %d, grants %d -> %d",
			RegrantGap, renews, r.count(proto.OpRenew), gs, r.count(proto.OpGrant))
	}
	// After the gap a refusal is acted on again.
	time.Sleep(RegrantGap)
	s.Refused(server, now[0])
	deadline := time.Now().Add(3 * time.Second)
	for r.count(proto.OpRenew) == renews && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if r.count(proto.OpRenew) != renews+1 {
		t.Fatalf("renews %d -> %d after the gap, want one more", renews, r.count(proto.OpRenew))
	}
}
