package relay

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
)

// leaseLine is a relay core with the fake data plane and a clock the test
// moves, and one session of member alice.
type leaseLine struct {
	s       *Server
	dp      *dataplane.Fake
	now     time.Time
	ses     *session
	attrLog string
}

func newLeaseLine(t *testing.T) *leaseLine {
	t.Helper()
	l := &leaseLine{now: time.Unix(1_800_000_000, 0), attrLog: filepath.Join(t.TempDir(), "attr.jsonl")}
	alice := testKey(t).Public()
	set := fairConfig(t, 0, "")
	set.Members[alice] = "alice"
	set.Allow = []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}
	set.AttributionLog = l.attrLog
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	l.dp = dataplane.NewFake()
	l.s, err = New(Static{}, set, Deps{PacketConn: conn, DataPlane: l.dp, Clock: func() time.Time { return l.now },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.s.attr.Close() })
	l.ses = &session{peer: alice, name: "alice", addr: netip.MustParseAddrPort("10.0.1.1:5000"), created: l.now, confirmed: true}
	return l
}

// request serves req as the event loop does for one transport packet,
// then installs the batch: the reply as the member would get it.
func (l *leaseLine) request(req proto.Request) proto.Reply {
	rep, m := l.s.serveRequest(l.ses, req)
	l.s.out.replies = append(l.s.out.replies, deferred{ses: l.ses, rep: rep, to: l.ses.addr, m: m})
	l.s.install()
	rep = l.s.out.replies[len(l.s.out.replies)-1].rep
	clear(l.s.out.replies)
	l.s.out.replies = l.s.out.replies[:0]
	return rep
}

// Grant, renew, expiry and reaping of a mapping over the data-plane
// interface: the mapping reaches the data plane at flush, a renewal moves
// its expiry, expiry unmaps it, and reap logs its counter once it stood
// still, then forgets it.
func TestLeaseLifecycle(t *testing.T) {
	l := newLeaseLine(t)
	server := netip.MustParseAddrPort("10.0.2.2:5201")
	rep := l.request(proto.NewRequest(0, &proto.GrantRequest{Server: server}))
	if rep.Reason != proto.OK {
		t.Fatalf("grant: %v", rep.Reason)
	}
	key := dataplane.Key{Client: l.ses.addr.Addr(), Port: detourOf(rep).Port()}
	if got, ok := l.dp.Mapped(key); !ok || got != server {
		t.Fatalf("after flush: mapped %v %v, want %v", got, ok, server)
	}
	if again := l.request(proto.NewRequest(0, &proto.GrantRequest{Server: server})); detourOf(again) != detourOf(rep) {
		t.Fatalf("a repeated grant got %v, want the same %v", detourOf(again), detourOf(rep))
	}
	if r := l.request(proto.NewRequest(0, &proto.GrantRequest{Server: netip.MustParseAddrPort("192.168.7.1:80")})); r.Reason != proto.ReasonPolicyDenied {
		t.Fatalf("grant to a private address: %v, want policy-denied", r.Reason)
	}
	l.now = l.now.Add(l.s.set.Lease / 2)
	if r := l.request(proto.NewRequest(0, &proto.RenewRequest{Port: key.Port})); r.Reason != proto.OK || r.Body.(*proto.RenewReply).Lease != l.s.set.Lease {
		t.Fatalf("renew: %+v", r)
	}
	l.now = l.now.Add(l.s.set.Lease - time.Second)
	l.s.expire(l.now)
	if _, ok := l.dp.Mapped(key); !ok {
		t.Fatal("expired before the renewed lease ended")
	}
	l.now = l.now.Add(2 * time.Second)
	l.s.expire(l.now)
	if _, ok := l.dp.Mapped(key); ok {
		t.Fatal("still mapped after its lease ended")
	}
	if r := l.request(proto.NewRequest(0, &proto.RenewRequest{Port: key.Port})); r.Reason != proto.ReasonNotFound {
		t.Fatalf("renew after expiry: %v, want not-found", r.Reason)
	}
	// Connections still running through conntrack keep counting: the
	// closing mapping is logged once its counter stands still.
	l.dp.SetCounter(key, dataplane.Counter{Packets: 10, Bytes: 5000})
	l.s.reap(l.now, false)
	l.dp.SetCounter(key, dataplane.Counter{Packets: 12, Bytes: 7000})
	l.s.reap(l.now, false)
	if len(l.s.leases.Closing) != 1 {
		t.Fatal("a closing mapping whose counter still moves was forgotten")
	}
	l.s.reap(l.now, false)
	if len(l.s.leases.Closing) != 0 {
		t.Fatal("a closing mapping whose counter stood still was kept")
	}
	var expiry *attrEvent
	for _, ev := range readAttribution(t, l.attrLog) {
		if ev.Event == "expiry" {
			expiry = &ev
		}
	}
	if expiry == nil || expiry.Bytes == nil || *expiry.Bytes != 7000 || expiry.Member != "alice" {
		t.Fatalf("expiry line: %+v", expiry)
	}
}

// A batch the kernel refuses is answered "internal" for every grant in it
// (also a repeated grant of a mapping of the same batch), and none of its
// mappings stays in the lease table.
func TestFlushRefusedBatch(t *testing.T) {
	l := newLeaseLine(t)
	server := netip.MustParseAddrPort("10.0.2.2:5201")
	l.dp.FailMap(errors.New("injected: the kernel refused the transaction"))
	rep1, m1 := l.s.serveRequest(l.ses, proto.NewRequest(0, &proto.GrantRequest{Server: server}))
	rep2, m2 := l.s.serveRequest(l.ses, proto.NewRequest(0, &proto.GrantRequest{Server: server}))
	if rep1.Reason != proto.OK || m1 == nil || m2 != m1 {
		t.Fatalf("grants before flush: %v %p %p", rep1.Reason, m1, m2)
	}
	l.s.out.replies = append(l.s.out.replies, deferred{ses: l.ses, rep: rep1, to: l.ses.addr, m: m1}, deferred{ses: l.ses, rep: rep2, to: l.ses.addr, m: m2})
	l.s.install()
	var got []proto.Reason
	for _, d := range l.s.out.replies {
		got = append(got, d.rep.Reason)
	}
	if len(got) != 2 || got[0] != proto.ReasonInternal || got[1] != proto.ReasonInternal {
		t.Fatalf("replies after a refused batch: %v, want internal twice", got)
	}
	if l.s.leases.Active() != 0 || l.dp.Len() != 0 {
		t.Fatalf("after a refused batch: %d leases, %d mapped", l.s.leases.Active(), l.dp.Len())
	}
}

// A table someone removed is recreated with every active mapping.
func TestTableRecreated(t *testing.T) {
	l := newLeaseLine(t)
	rep := l.request(proto.NewRequest(0, &proto.GrantRequest{Server: netip.MustParseAddrPort("10.0.2.2:5201")}))
	key := dataplane.Key{Client: l.ses.addr.Addr(), Port: detourOf(rep).Port()}
	if l.s.ensureTable() {
		t.Fatal("recreated a table that was there")
	}
	l.dp.Remove()
	if !l.s.ensureTable() || l.dp.Recreated != 1 {
		t.Fatalf("removed table not recreated (%d)", l.dp.Recreated)
	}
	if _, ok := l.dp.Mapped(key); !ok {
		t.Fatal("the active mapping is not in the recreated table")
	}
}

// detourOf is a grant reply's detour (zero for any other reply).
func detourOf(r proto.Reply) netip.AddrPort {
	if g, ok := r.Body.(*proto.GrantReply); ok {
		return g.Detour
	}
	return netip.AddrPort{}
}
