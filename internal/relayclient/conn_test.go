package relayclient

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// fakeRelay is a minimal relay on loopback built from the protocol's own
// responder pieces (no nftables, no root): it hand shakes, keeps sessions by
// index, and answers requests with answer (default: grants port 40000+n,
// renew and release ok). forget drops every session (a restarted relay).
type fakeRelay struct {
	t      *testing.T
	priv   proto.Key
	pc     *net.UDPConn
	mu     sync.Mutex
	ses    map[uint32]*proto.Session
	next   uint32
	inits  atomic.Int32
	reqs   atomic.Int32
	ops    sync.Map // proto.Op -> *atomic.Int32
	answer func(req proto.Request, n int32) proto.Reply
	silent atomic.Bool
	grants atomic.Int32
	member proto.Key
	// dropOnce: the next request of this op (if non-zero) is dropped
	// unanswered, as a lost packet (the client retransmits it).
	dropOnce atomic.Int32
	// Rotation tests: members (any key in it may handshake; nil: only
	// member), peers (session index -> member key), answerFrom (like
	// answer, with the session's member key; wins over answer) and
	// swallow (the request was handled but its reply is lost).
	members    map[proto.Key]bool
	peers      map[uint32]proto.Key
	answerFrom func(req proto.Request, peer proto.Key) proto.Reply
	swallow    func(req proto.Request, peer proto.Key) bool
}

func newFakeRelay(t *testing.T, member proto.Key) *fakeRelay {
	t.Helper()
	priv, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return newFakeRelayAt(t, member, priv, net.IPv4(127, 0, 0, 1))
}

// newFakeRelayAt is a fake relay with the key priv on a loopback address
// (127.0.0.1 or ::1).
func newFakeRelayAt(t *testing.T, member, priv proto.Key, ip net.IP) *fakeRelay {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRelay{t: t, priv: priv, pc: pc, ses: map[uint32]*proto.Session{}, member: member}
	t.Cleanup(func() { pc.Close() })
	go r.serve()
	return r
}

func (r *fakeRelay) relay() relayconn.Relay {
	return relayconn.Relay{Name: "fake", Addr: r.pc.LocalAddr().(*net.UDPAddr).AddrPort(), PublicKey: r.priv.Public()}
}

func (r *fakeRelay) count(op proto.Op) int32 {
	v, _ := r.ops.LoadOrStore(op, new(atomic.Int32))
	return v.(*atomic.Int32).Load()
}

func (r *fakeRelay) forget() {
	r.mu.Lock()
	r.ses = map[uint32]*proto.Session{}
	r.mu.Unlock()
}

func (r *fakeRelay) serve() {
	buf := make([]byte, 2048)
	for {
		n, from, err := r.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		if r.silent.Load() {
			continue
		}
		b := append([]byte(nil), buf[:n]...)
		typ, err := proto.PacketType(b)
		if err != nil {
			continue
		}
		switch typ {
		case proto.TypeInit:
			in, err := proto.ParseInit(b)
			if err != nil {
				continue
			}
			acc, err := proto.ConsumeInitiation(r.priv, in)
			r.mu.Lock()
			allowed := acc.Peer == r.member || r.members[acc.Peer]
			r.mu.Unlock()
			if err != nil || !allowed {
				continue
			}
			r.inits.Add(1)
			r.mu.Lock()
			r.next++
			idx := r.next
			pkt, s, err := acc.Respond(idx)
			if err == nil {
				r.ses[idx] = s
				if r.peers == nil {
					r.peers = map[uint32]proto.Key{}
				}
				r.peers[idx] = acc.Peer
			}
			r.mu.Unlock()
			if err == nil {
				_, _ = r.pc.WriteToUDPAddrPort(pkt, from)
			}
		case proto.TypeTransport:
			tr, err := proto.ParseTransport(b)
			if err != nil {
				continue
			}
			r.mu.Lock()
			s := r.ses[tr.Receiver]
			r.mu.Unlock()
			if s == nil {
				_, _ = r.pc.WriteToUDPAddrPort(proto.MarshalError(proto.ErrorPacket{Reason: proto.ReasonNoSession, Index: tr.Receiver, Counter: tr.Counter}), from)
				continue
			}
			msg, err := s.Open(tr)
			if err != nil {
				continue
			}
			req, err := proto.ParseRequest(msg)
			if err != nil {
				continue
			}
			if op := r.dropOnce.Load(); op != 0 && int32(req.Op) == op && r.dropOnce.CompareAndSwap(op, 0) {
				continue
			}
			c := r.reqs.Add(1)
			v, _ := r.ops.LoadOrStore(req.Op, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
			rep := proto.Reply{Op: req.Op, ID: req.ID}
			r.mu.Lock()
			answer, answerFrom, swallow, peer := r.answer, r.answerFrom, r.swallow, r.peers[tr.Receiver]
			r.mu.Unlock()
			if answerFrom != nil {
				rep = answerFrom(req, peer)
				rep.Op, rep.ID = req.Op, req.ID
				if swallow != nil && swallow(req, peer) {
					continue
				}
			} else if answer != nil {
				rep = answer(req, c)
				rep.Op, rep.ID = req.Op, req.ID
			} else if req.Op == proto.OpGrant {
				g := r.grants.Add(1)
				rep.Body = &proto.GrantReply{Detour: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(40000+g)), Lease: 2 * time.Second}
			} else if req.Op == proto.OpRenew {
				rep.Body = &proto.RenewReply{Lease: 2 * time.Second}
			}
			if rep.Reason == proto.OK && (rep.Body == nil || rep.Body.Op() != req.Op) {
				rep.Body = proto.NewReplyBody(req.Op) // an answer without content of its own
			}
			out, err := proto.MarshalReply(rep)
			if err != nil {
				continue
			}
			sealed, err := s.Seal(out)
			if err == nil {
				_, _ = r.pc.WriteToUDPAddrPort(sealed, from)
			}
		}
	}
}

func memberKey(t *testing.T) proto.Key {
	t.Helper()
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestConnGrantRenewRelease(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	c, ctx := dialFake(t, r, m, relayconn.Options{})
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	d, lease, err := c.Grant(ctx, server, 0)
	if err != nil || d.Port() != 40001 || lease != 2*time.Second {
		t.Fatalf("grant: %v %v %v", d, lease, err)
	}
	if l, err := c.Renew(ctx, d.Port()); err != nil || l != 2*time.Second {
		t.Fatalf("renew: %v %v", l, err)
	}
	if err := c.Release(ctx, d.Port()); err != nil {
		t.Fatalf("release: %v", err)
	}
	if r.count(proto.OpGrant) != 1 || r.count(proto.OpRenew) != 1 || r.count(proto.OpRelease) != 1 {
		t.Fatalf("relay saw grant %d renew %d release %d", r.count(proto.OpGrant), r.count(proto.OpRenew), r.count(proto.OpRelease))
	}
}

// A relay that lost its sessions (restart) answers no-session: the client
// hand shakes again and the request goes through.
func TestConnRehandshakeAfterRelayRestart(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	c, ctx := dialFake(t, r, m, relayconn.Options{Retransmit: 50 * time.Millisecond})
	if _, _, err := c.Grant(ctx, netip.MustParseAddrPort("192.0.2.10:5201"), 0); err != nil {
		t.Fatal(err)
	}
	before := r.inits.Load()
	r.forget()
	if _, _, err := c.Grant(ctx, netip.MustParseAddrPort("192.0.2.10:5202"), 0); err != nil {
		t.Fatalf("grant after the relay forgot the session: %v", err)
	}
	if r.inits.Load() <= before {
		t.Fatal("no new handshake after no-session")
	}
}

// Refusals come back as *proto.Error with the relay's reason; a silent relay
// is a context error, not a hang.
func TestConnErrors(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	r.mu.Lock()
	r.answer = func(req proto.Request, n int32) proto.Reply {
		return proto.Reply{Reason: proto.ReasonPolicyDenied}
	}
	r.mu.Unlock()
	c, ctx := dialFake(t, r, m, relayconn.Options{Retransmit: 50 * time.Millisecond})
	_, _, err := c.Grant(ctx, netip.MustParseAddrPort("192.0.2.10:25"), 0)
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Reason != proto.ReasonPolicyDenied {
		t.Fatalf("refused grant: %v, want a proto.Error with policy-denied", err)
	}
	r.silent.Store(true)
	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	if err := c.Release(sctx, 40001); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent relay: %v, want the context's deadline", err)
	}
	// A relay that does not know the member never answers the handshake.
	stranger := newFakeRelay(t, memberKey(t).Public())
	c2, err := relayconn.Dial(stranger.relay(), m, relayconn.Options{Retransmit: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, _, err := c2.Grant(sctx, netip.MustParseAddrPort("192.0.2.10:5201"), 0); err == nil {
		t.Fatal("grant from a relay that refuses the member")
	}
}

// Prepare never waits for the relay: with a relay that never answers (it
// does not know the member), a blocking Prepare would wait for the request
// timeout (5 s here); it must return at once and the grant arrive later or
// never.
func TestSourcePrepareDoesNotBlockOnSilentRelay(t *testing.T) {
	stranger := newFakeRelay(t, memberKey(t).Public())
	s, err := NewSource(SourceConfig{PrivateKey: memberKey(t), Relays: []relayconn.Relay{stranger.relay()}, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	start := time.Now()
	s.Prepare(server)
	// Far below the 5 s a blocking Prepare would take, far above any
	// scheduling delay of a non-blocking one.
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Prepare blocked for %v on a silent relay", d)
	}
	if ds := s.Detours(server); len(ds) != 0 {
		t.Fatalf("detours from a silent relay: %v", ds)
	}
}

// The NATSource renews a grant at half its lease and releases it.
func TestSourceRenewsAndReleases(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	select {
	case <-s.Changed():
		t.Fatal("change notified before any grant")
	default:
	}
	s.Prepare(server)
	// The grant's arrival is notified (detour.Notifier): the agent fills
	// connections at once.
	select {
	case <-s.Changed():
	case <-time.After(3 * time.Second):
		t.Fatal("no change notified for the grant")
	}
	if ds := s.Detours(server); len(ds) != 1 || ds[0].Remote.Port() != 40001 {
		t.Fatalf("detours %v after the notification", ds)
	}
	deadline := time.Now().Add(3 * time.Second)
	// Lease 2 s: renewed at about 1 s.
	for r.count(proto.OpRenew) == 0 && time.Now().Before(deadline.Add(2*time.Second)) {
		time.Sleep(20 * time.Millisecond)
	}
	if r.count(proto.OpRenew) == 0 {
		t.Fatal("no renewal within the lease")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Release(ctx, server); err != nil {
		t.Fatal(err)
	}
	if r.count(proto.OpRelease) != 1 {
		t.Fatalf("%d releases", r.count(proto.OpRelease))
	}
}

// A connection that closes before its grant arrives: the
// grant is given back as soon as it arrives, not kept until its lease ends.
func TestSourceReleasesGrantThatArrivesAfterRelease(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	s.Prepare(server)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Release(ctx, server); err != nil { // before the grant's reply
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for r.count(proto.OpRelease) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r.count(proto.OpGrant) != 1 || r.count(proto.OpRelease) != 1 {
		t.Fatalf("relay saw %d grants and %d releases, want 1 and 1", r.count(proto.OpGrant), r.count(proto.OpRelease))
	}
	if ds := s.Detours(server); len(ds) != 0 {
		t.Fatalf("released server still has detours %v", ds)
	}
}

// Error packets are not authenticated: forged
// "address-changed" errors naming our session must not cut the client off.
// It hand shakes again (at most once a second) but keeps its session until
// the new one is up, so requests keep working throughout.
func TestForgedErrorsDoNotDropTheSession(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	// The client's socket, so that the attacker knows its port.
	var local *net.UDPConn
	listen := func() (net.PacketConn, error) {
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		local = pc
		return pc, err
	}
	c, ctx := dialFake(t, r, m, relayconn.Options{Retransmit: 50 * time.Millisecond, ListenPacket: listen})
	if _, err := c.Do(ctx, proto.NewRequest(0, &proto.PingRequest{})); err != nil {
		t.Fatal(err)
	}
	// An on-path attacker spoofs the relay's address: send from its socket.
	attacker := r.pc
	port := local.LocalAddr().(*net.UDPAddr).Port
	inits := r.inits.Load()
	slow := 0
	for i := 0; i < 200; i++ {
		// The attacker sees the current session's index on the wire (the
		// relay's newest).
		r.mu.Lock()
		cur := r.next
		r.mu.Unlock()
		forged := proto.MarshalError(proto.ErrorPacket{Reason: proto.ReasonAddressChanged, Index: cur})
		if _, err := attacker.WriteToUDP(forged, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		if i%20 == 10 {
			// A client that dropped its session would wait for a new
			// handshake (at most one a second): requests keep working
			// at once.
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			if _, err := c.Do(pctx, proto.NewRequest(0, &proto.PingRequest{})); err != nil {
				slow++
			}
			cancel()
		}
	}
	if slow > 0 {
		t.Errorf("%d of 10 requests during the forged errors got no answer within 300 ms (the session was dropped)", slow)
	}
	if _, err := c.Do(ctx, proto.NewRequest(0, &proto.PingRequest{})); err != nil {
		t.Fatalf("request after forged errors: %v", err)
	}
	if n := r.inits.Load() - inits; n < 1 || n > 3 {
		t.Fatalf("%d handshakes for 200 forged errors in ~0.5 s, want 1-3 (bounded)", n)
	}
}

// dialFake connects to the fake relay r as member m; the connection and a
// 5 s context end with the test.
func dialFake(t *testing.T, r *fakeRelay, m proto.Key, opt relayconn.Options) (*relayconn.Conn, context.Context) {
	t.Helper()
	c, err := relayconn.Dial(r.relay(), m, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c, ctx
}

// A release still in flight when a new connection asks for the same server
// (found by the attack suite's connection churn): the relay hands
// one mapping per member and server, so a grant answered before the
// release would return the very mapping the release then removes, and the
// agent would keep a detour to a port the relay no longer maps. The grant
// waits for the release.
func TestSourceGrantWaitsForReleaseInFlight(t *testing.T) {
	m := memberKey(t)
	r := newFakeRelay(t, m.Public())
	var mu sync.Mutex
	mapped := map[uint16]bool{}
	var port uint16
	next := uint16(40000)
	r.mu.Lock()
	r.answer = func(req proto.Request, _ int32) proto.Reply {
		mu.Lock()
		defer mu.Unlock()
		var rep proto.Reply
		switch req.Op {
		case proto.OpGrant: // one mapping per member and server, as the relay
			if port == 0 {
				next++
				port = next
				mapped[port] = true
			}
			rep.Body = &proto.GrantReply{Detour: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Lease: time.Minute}
		case proto.OpRelease:
			rel := req.Body.(*proto.ReleaseRequest)
			delete(mapped, rel.Port)
			if rel.Port == port {
				port = 0
			}
		}
		return rep
	}
	r.mu.Unlock()
	s, err := NewSource(SourceConfig{PrivateKey: m, Relays: []relayconn.Relay{r.relay()}, Options: relayconn.Options{Retransmit: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	server := netip.MustParseAddrPort("192.0.2.10:5201")
	waitDetour := func() netip.AddrPort {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if ds := s.Detours(server); len(ds) == 1 {
				return ds[0].Remote
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatal("no detour")
		return netip.AddrPort{}
	}
	s.Prepare(server)
	first := waitDetour()
	r.dropOnce.Store(int32(proto.OpRelease)) // the release is retransmitted 200 ms later
	released := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		released <- s.Release(ctx, server)
	}()
	for deadline := time.Now().Add(time.Second); len(s.Detours(server)) != 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	s.Prepare(server) // a new connection toward the same server
	second := waitDetour()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !mapped[second.Port()] {
		t.Fatalf("the detour handed out (%v, first %v) is not mapped on the relay (mapped: %v)", second, first, mapped)
	}
}
