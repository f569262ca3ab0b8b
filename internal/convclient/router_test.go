package convclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fake struct {
	addr  netip.AddrPort
	delay time.Duration
	err   error
	mu    sync.Mutex
	asked int
	next  byte
	ns    []int // tickets asked per request
	maxN  int   // > 0: refuse larger requests as malformed (an old relay)
}

func (f *fake) Convert(ctx context.Context, n int) (netip.AddrPort, [][proto.TicketLen]byte, time.Duration, error) {
	time.Sleep(f.delay)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	f.ns = append(f.ns, n)
	if f.err != nil {
		return netip.AddrPort{}, nil, 0, f.err
	}
	if f.maxN > 0 && n > f.maxN {
		return netip.AddrPort{}, nil, 0, &proto.Error{Op: proto.OpConvert, Reason: proto.ReasonMalformed}
	}
	ts := make([][proto.TicketLen]byte, n)
	for i := range ts {
		f.next++
		ts[i][0] = f.next
	}
	return f.addr, ts, time.Minute, nil
}

func fill(t testing.TB, r *Router) {
	t.Helper()
	var wg sync.WaitGroup
	r.refill(context.Background(), &wg)
	wg.Wait()
}

func TestRouteLearnConvertExpire(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{TTL: time.Minute, Tickets: 4, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	if d := r.Route(Root, dst); d.Convert || !d.Learn || d.Why != "unknown" {
		t.Fatalf("unknown destination: %+v", d)
	}
	r.Learn(Root, dst, false)
	// No tickets yet: direct, the connection is not held up.
	if d := r.Route(Root, dst); d.Convert || d.Why != "no-converter" {
		t.Fatalf("without tickets: %+v", d)
	}
	fill(t, r)
	seen := map[byte]bool{}
	for i := 0; i < 4; i++ {
		d := r.Route(Root, dst)
		if !d.Convert || d.Converter != f.addr || d.Name != "a" || len(d.Ticket) != proto.TicketLen || seen[d.Ticket[0]] {
			t.Fatalf("conversion %d: %+v", i, d)
		}
		seen[d.Ticket[0]] = true // single use: never handed out twice
	}
	if d := r.Route(Root, dst); d.Convert {
		t.Fatalf("stock exhausted but converted: %+v", d)
	}
	fill(t, r)
	if !r.Route(Root, dst).Convert {
		t.Fatal("refilled stock not used")
	}
	// A destination that speaks MPTCP goes direct.
	native := netip.MustParseAddrPort("198.51.100.8:443")
	r.Learn(Root, native, true)
	if d := r.Route(Root, native); d.Convert || d.Learn || d.Why != "mptcp" {
		t.Fatalf("MPTCP destination: %+v", d)
	}
	// Expiry: unknown again.
	ck.add(time.Minute)
	if d := r.Route(Root, dst); d.Convert || !d.Learn {
		t.Fatalf("after the TTL: %+v", d)
	}
	// Tickets expire too (lease minus a margin).
	fill(t, r)
	r.Learn(Root, dst, false)
	ck.add(56 * time.Second)
	if d := r.Route(Root, dst); d.Convert {
		t.Fatalf("expired ticket handed out: %+v", d)
	}
}

func TestPickByRTTAndHold(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	slow := &fake{addr: netip.MustParseAddrPort("192.0.2.1:1"), delay: 30 * time.Millisecond}
	fast := &fake{addr: netip.MustParseAddrPort("192.0.2.2:1")}
	r := New(Config{Hold: 10 * time.Second, Now: ck.now}, nil, Converter{Name: "slow", Source: slow}, Converter{Name: "fast", Source: fast})
	fill(t, r)
	dst := netip.MustParseAddrPort("198.51.100.7:80")
	r.Learn(Root, dst, false)
	if d := r.Route(Root, dst); d.Name != "fast" {
		t.Fatalf("picked %q, want the converter with the lower RTT", d.Name)
	}
	r.Report(Root, dst, "fast", OutcomeConverterFailed, netip.AddrPort{}, "reset")
	if d := r.Route(Root, dst); d.Name != "slow" {
		t.Fatalf("picked %q while fast is held", d.Name)
	}
	r.Report(Root, dst, "slow", OutcomeConverterFailed, netip.AddrPort{}, "reset")
	if d := r.Route(Root, dst); d.Convert || d.Why != "no-converter" {
		t.Fatalf("both held: %+v", d)
	}
	ck.add(10 * time.Second)
	if d := r.Route(Root, dst); d.Name != "fast" {
		t.Fatalf("after the hold: %+v", d)
	}
	// Policy refusals stop conversions to that destination only.
	r.Report(Root, dst, "fast", OutcomePolicy, netip.AddrPort{}, "")
	if d := r.Route(Root, dst); d.Convert || d.Why != "not-convertible" {
		t.Fatalf("policy-refused destination: %+v", d)
	}
	st := r.Status()
	if st.Counters.ConverterFailed != 2 || st.Counters.PolicyRefused != 1 || len(st.Converters) != 2 {
		t.Fatalf("status: %+v", st)
	}
}

func TestTicketRefusedRefetches(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:1")}
	r := New(Config{Hold: 10 * time.Second, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	dst := netip.MustParseAddrPort("198.51.100.7:80")
	r.Learn(Root, dst, false)
	r.Route(Root, dst)
	r.Report(Root, dst, "a", OutcomeTicketRefused, netip.AddrPort{}, "ticket refused")
	if st := r.Status(); st.Converters[0].Tickets != 0 || !st.Converters[0].FailedUntil.IsZero() {
		t.Fatalf("after one refusal: %+v (want the stock dropped, no hold)", st.Converters[0])
	}
	fill(t, r)
	if d := r.Route(Root, dst); !d.Convert {
		t.Fatalf("fresh tickets not used: %+v", d)
	}
	r.Report(Root, dst, "a", OutcomeTicketRefused, netip.AddrPort{}, "ticket refused")
	if st := r.Status(); st.Converters[0].FailedUntil.IsZero() {
		t.Fatalf("a second refusal within the hold did not hold: %+v", st.Converters[0])
	}
}

func TestFetchErrorsBackOff(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{err: errors.New("relay: unsupported")}
	r := New(Config{Hold: 30 * time.Second, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	fill(t, r)
	if f.asked != 1 {
		t.Fatalf("asked %d times within the hold", f.asked)
	}
	ck.add(30 * time.Second)
	fill(t, r)
	if f.asked != 2 {
		t.Fatalf("asked %d times after the hold", f.asked)
	}
	if st := r.Status(); st.Converters[0].LastError == "" || st.Counters.TicketErrors != 2 {
		t.Fatalf("status: %+v", st)
	}
}

func TestCacheBounded(t *testing.T) {
	r := New(Config{MaxDestinations: 100}, nil)
	for i := range 1000 {
		r.Learn(Root, netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), 80), false)
	}
	if n := r.Status().Destinations; n > 100 {
		t.Fatalf("%d destinations kept, bound 100", n)
	}
}

func TestSocketProtocol(t *testing.T) {
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	path := filepath.Join(t.TempDir(), "c.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Serve(l, Users{}) }()
	defer func() {
		l.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if _, err := Listen(path); err == nil {
		t.Fatal("a second Listen on a live socket succeeded")
	}
	c := NewClient(path, time.Second)
	defer c.Close()
	dst := netip.MustParseAddrPort("[2001:db8::1]:443")
	d, err := c.Route(dst)
	if err != nil || !d.Learn || d.Convert {
		t.Fatalf("route: %+v %v", d, err)
	}
	if err := c.Learn(dst, false); err != nil {
		t.Fatal(err)
	}
	d, err = c.Route(dst)
	if err != nil || !d.Convert || d.Converter != f.addr || len(d.Ticket) != proto.TicketLen {
		t.Fatalf("route after learning: %+v %v", d, err)
	}
	if err := c.Report(dst, "a", OutcomeOK, netip.MustParseAddrPort("192.0.2.9:5000"), ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Report(dst, "a", "bogus", netip.AddrPort{}, ""); err == nil {
		t.Fatal("unknown outcome accepted")
	}
	st, err := FetchStatus(path)
	if err != nil || st.Counters.Converted != 1 || len(st.Recent) != 1 || st.Recent[0].Local != "192.0.2.9:5000" {
		t.Fatalf("status: %+v %v", st, err)
	}
	// Garbage gets an error answer, not a dropped agent.
	if _, err := c.do(request{Op: "route", Dst: "nonsense"}); err == nil {
		t.Fatal("bad destination accepted")
	}
	// No agent: direct, quickly, and no hang later.
	none := NewClient(filepath.Join(t.TempDir(), "none.sock"), 100*time.Millisecond)
	if d, err := none.Route(dst); err == nil || d.Convert || d.Learn {
		t.Fatalf("without agent: %+v %v", d, err)
	}
}

func TestConfigBuild(t *testing.T) {
	relays := []string{"r1", "r2"}
	if _, err := (File{Enabled: true}).Build(nil); err == nil {
		t.Error("no relays accepted")
	}
	if _, err := (File{Enabled: true, Relays: []string{"r3"}}).Build(relays); err == nil {
		t.Error("unknown relay accepted")
	}
	if _, err := (File{Enabled: true, Socket: "rel/x.sock"}).Build(relays); err == nil {
		t.Error("relative socket accepted")
	}
	if _, err := (File{Enabled: true, Tickets: proto.MaxTickets + 1}).Build(relays); err == nil {
		t.Errorf("%d tickets accepted", proto.MaxTickets+1)
	}
	s, err := (File{Enabled: true, Relays: []string{"r2"}}).Build(relays)
	if err != nil || s.Socket != DefaultSocket || len(s.Relays) != 1 {
		t.Fatalf("%+v %v", s, err)
	}
}

// FuzzRequest: whatever a local program writes to the socket gets an
// answer (or an error), never a panic.
func FuzzRequest(f *testing.F) {
	f.Add([]byte(`{"op":"route","dst":"192.0.2.1:80"}`))
	f.Add([]byte(`{"op":"learn","dst":"[::1]:1","native":true}`))
	f.Add([]byte(`{"op":"report","dst":"192.0.2.1:80","relay":"a","outcome":"ok","local":"x"}`))
	f.Add([]byte(`{"op":"status"}`))
	f.Add([]byte(`{"op":7}`))
	r := New(Config{MaxDestinations: 64}, nil, Converter{Name: "a", Source: &fake{addr: netip.MustParseAddrPort("192.0.2.1:1")}})
	fill(f, r)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req request
		if json.Unmarshal(b, &req) != nil {
			return
		}
		_ = r.answer(Root, req)
		_ = r.answer(1000, req) // another user's paths (per-uid state)
	})
}

// A stock that runs out grows (doubling up to MaxStock, requests of at
// most proto.MaxTickets), and shrinks back to Config.Tickets after
// shrinkAfter without running out.
func TestStockGrowsUnderLoad(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{TTL: time.Hour, Tickets: 4, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	r.Learn(Root, dst, false)
	fill(t, r)
	drain := func() int {
		n := 0
		for r.Route(Root, dst).Convert {
			n++
		}
		return n
	}
	var stocks []int
	for range 6 {
		fill(t, r)
		stocks = append(stocks, drain())
	}
	// A refill asks for at most proto.MaxTickets: 32 of the 48 at once.
	want := []int{4, 8, 16, 32, 32, 32}
	for i := range want {
		if stocks[i] != want[i] {
			t.Fatalf("stocks after refills %v, want %v", stocks, want)
		}
	}
	r.mu.Lock()
	grown := r.conv[0].want
	r.mu.Unlock()
	if grown != MaxStock {
		t.Fatalf("grown stock %d, want %d", grown, MaxStock)
	}
	for _, n := range f.ns {
		if n > proto.MaxTickets {
			t.Fatalf("asked for %d tickets in one request (requests %v)", n, f.ns)
		}
	}
	// Rare conversions: no growth; after shrinkAfter the stock halves.
	fill(t, r)
	fill(t, r)
	ck.add(shrinkAfter)
	r.Route(Root, dst)
	fill(t, r)
	ck.add(shrinkAfter)
	fill(t, r)
	r.mu.Lock()
	got := r.conv[0].want
	r.mu.Unlock()
	if got != 12 {
		t.Errorf("stock after two quiet periods: %d, want 12", got)
	}
}

// A relay that refuses more than proto.LegacyMaxTickets as malformed is
// asked for at most that many at once, without holding it back.
func TestLegacyRelayBatch(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674"), maxN: proto.LegacyMaxTickets}
	r := New(Config{TTL: time.Hour, Tickets: 4, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	r.Learn(Root, dst, false)
	r.mu.Lock()
	r.conv[0].want, r.conv[0].grownAt = MaxStock, ck.now() // as after growing
	r.mu.Unlock()
	fill(t, r)
	fill(t, r)
	if len(f.ns) != 2 || f.ns[0] != proto.MaxTickets || f.ns[1] != proto.LegacyMaxTickets {
		t.Fatalf("requests %v, want [%d %d]", f.ns, proto.MaxTickets, proto.LegacyMaxTickets)
	}
	if d := r.Route(Root, dst); !d.Convert {
		t.Fatalf("after the fallback: %+v", d)
	}
}

// What one local user tells the Router changes only its
// own decisions. Root's lessons and failure reports hold for everyone.
func TestUsersIsolated(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{TTL: time.Hour, Tickets: 32, Hold: 10 * time.Second, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	const mallory, alice uint32 = 1000, 1001
	dst := netip.MustParseAddrPort("198.51.100.7:443")

	// Poisoning: mallory says dst does not speak MPTCP.
	r.Learn(mallory, dst, false)
	for _, uid := range []uint32{Root, alice} {
		if d := r.Route(uid, dst); d.Convert || !d.Learn {
			t.Fatalf("uid %d after another user's lesson: %+v (want unknown, learn itself)", uid, d)
		}
	}
	if d := r.Route(mallory, dst); !d.Convert {
		t.Fatalf("mallory's own lesson not used for mallory: %+v", d)
	}
	// Mallory cannot overrule root's lesson for the others either.
	native := netip.MustParseAddrPort("198.51.100.8:443")
	r.Learn(Root, native, true)
	r.Learn(mallory, native, false)
	if d := r.Route(alice, native); d.Why != "mptcp" {
		t.Fatalf("alice after mallory contradicted root: %+v", d)
	}

	// Root's lesson answers every user.
	conv := netip.MustParseAddrPort("198.51.100.9:443")
	r.Learn(Root, conv, false)
	if d := r.Route(alice, conv); !d.Convert {
		t.Fatalf("alice does not use root's lesson: %+v", d)
	}

	// A report for a conversion mallory was not handed is ignored (it
	// would enter a made-up conversion into the status root reads).
	r.Report(mallory, conv, "a", OutcomeOK, netip.MustParseAddrPort("10.0.0.1:40000"), "")
	if st := r.Status(); len(st.Recent) != 0 || st.Counters.Unsolicited != 1 {
		t.Fatalf("unsolicited report taken: %+v", st)
	}
	// Mallory converts 4 times (to report on them).
	for range 4 {
		if d := r.Route(mallory, conv); !d.Convert {
			t.Fatalf("mallory with root's lesson: %+v", d)
		}
	}
	// Holding the converter: mallory's failure reports hold it for mallory.
	r.Report(mallory, conv, "a", OutcomeConverterFailed, netip.AddrPort{}, "reset")
	if d := r.Route(mallory, conv); d.Convert {
		t.Fatalf("mallory's own report did not hold the converter for mallory: %+v", d)
	}
	for _, uid := range []uint32{Root, alice} {
		if d := r.Route(uid, conv); !d.Convert {
			t.Fatalf("uid %d: converter held by another user's report: %+v", uid, d)
		}
	}
	// A ticket refusal by mallory does not drop the shared stock.
	before := r.Status().Converters[0].Tickets
	r.Report(mallory, conv, "a", OutcomeTicketRefused, netip.AddrPort{}, "ticket refused")
	r.Report(mallory, conv, "a", OutcomeTicketRefused, netip.AddrPort{}, "ticket refused")
	if st := r.Status(); st.Converters[0].Tickets != before || !st.Converters[0].FailedUntil.IsZero() {
		t.Fatalf("mallory's refusals changed the shared converter: %+v (stock was %d)", st.Converters[0], before)
	}
	if d := r.Route(alice, conv); !d.Convert {
		t.Fatalf("alice after mallory's ticket refusals: %+v", d)
	}
	// A policy refusal by mallory stops only mallory's conversions.
	r.Report(mallory, conv, "a", OutcomePolicy, netip.AddrPort{}, "")
	if d := r.Route(alice, conv); !d.Convert {
		t.Fatalf("alice after mallory's policy report: %+v", d)
	}
	ck.add(10 * time.Second) // mallory's hold is over
	if d := r.Route(mallory, conv); d.Why != "not-convertible" {
		t.Fatalf("mallory's own policy report: %+v", d)
	}
	// Root's report holds the converter for everyone.
	r.Report(Root, conv, "a", OutcomeConverterFailed, netip.AddrPort{}, "reset")
	if d := r.Route(alice, conv); d.Convert {
		t.Fatalf("root's report did not hold the converter for alice: %+v", d)
	}
}

// A user that had a ticket refused gets only tickets fetched after the
// refusal; the stock others use is kept.
func TestUserTicketRefusedTakesFreshTickets(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{TTL: time.Hour, Tickets: 4, Hold: 10 * time.Second, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	r.Learn(Root, dst, false)
	r.Route(1000, dst)
	r.Route(1000, dst)
	ck.add(time.Second)
	r.Report(1000, dst, "a", OutcomeTicketRefused, netip.AddrPort{}, "ticket refused")
	if d := r.Route(1000, dst); d.Convert {
		t.Fatalf("stale stock handed to the user that had it refused: %+v", d)
	}
	ck.add(time.Second)
	fill(t, r) // 2 left of 4: below half, refilled
	d := r.Route(1000, dst)
	if !d.Convert || d.Ticket[0] <= 4 {
		t.Fatalf("after a refill: %+v (want a ticket of the new batch)", d)
	}
	if d := r.Route(Root, dst); !d.Convert || d.Ticket[0] > 4 {
		t.Fatalf("root: %+v (want the older stock first)", d)
	}
}

// The users' lessons are bounded per user and in number of users.
func TestUserStateBounded(t *testing.T) {
	r := New(Config{MaxUserDestinations: 10, MaxUsers: 4}, nil)
	for uid := range uint32(20) {
		for i := range 50 {
			r.Learn(uid+1, netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 80), false)
		}
	}
	if n := r.Status().Destinations; n > 4*10 {
		t.Fatalf("%d destinations kept, bound 4 users x 10", n)
	}
	if len(r.users) > 4 || r.users[Root] == nil {
		t.Fatalf("%d users kept (bound 4), root's state kept: %v", len(r.users), r.users[Root] != nil)
	}
}

func TestConfigUsers(t *testing.T) {
	relays := []string{"r1"}
	s, err := (File{Enabled: true, Users: []string{"root", "1001"}}).Build(relays)
	if err != nil || s.Users.Any || len(s.Users.UIDs) != 2 || s.Users.UIDs[1] != 1001 {
		t.Fatalf("%+v %v", s.Users, err)
	}
	if !s.Users.Allows(1001) || !s.Users.Allows(Root) || s.Users.Allows(1002) {
		t.Fatalf("allows: %+v", s.Users)
	}
	if (Users{}).Allows(1000) {
		t.Fatal("the default allows another user than root")
	}
	if s, err := (File{Enabled: true, Users: []string{"*"}}).Build(relays); err != nil || !s.Users.Allows(4242) {
		t.Fatalf("*: %+v %v", s.Users, err)
	}
	for _, bad := range [][]string{{"no-such-user-xq"}, {"*", "root"}, {"1001", "1001"}} {
		if _, err := (File{Enabled: true, Users: bad}).Build(relays); err == nil || !strings.HasPrefix(err.Error(), "users[") {
			t.Errorf("users %q: %v", bad, err)
		}
	}
}

// One user cannot drain the member's stock that the others share: a user
// other than root converts at most UserRate per second (burst twice that).
func TestUserRateBounded(t *testing.T) {
	ck := &clock{t: time.Unix(1000, 0)}
	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{TTL: time.Hour, Tickets: 32, UserRate: 5, Now: ck.now}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	r.Learn(Root, dst, false)
	n := 0
	for range 30 {
		if d := r.Route(1000, dst); d.Convert {
			n++
		} else if d.Why != "user-rate" {
			t.Fatalf("refusal: %+v", d)
		}
	}
	if n != 10 {
		t.Fatalf("%d conversions in a burst, want 10 (2 x rate 5)", n)
	}
	if d := r.Route(Root, dst); !d.Convert {
		t.Fatalf("root after the user's burst: %+v", d)
	}
	if d := r.Route(1001, dst); !d.Convert {
		t.Fatalf("another user after the first one's burst: %+v", d)
	}
	ck.add(time.Second)
	if d := r.Route(1000, dst); !d.Convert {
		t.Fatalf("the user a second later: %+v", d)
	}
}
