package subflowcc

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// fakeTable answers RTM_GETROUTE from get (by destination) and keeps the
// routes added; exact host routes it holds answer lookups as the kernel's
// would (most specific first).
type fakeTable struct {
	get map[string]netlink.Route
	// table holds the tables' own (prefix) routes for listings; get
	// answers lookups.
	table   []netlink.Route
	routes  []netlink.Route
	deleted []netlink.Route
	addErr  error
	delErr  error
}

func (f *fakeTable) RouteGetWithOptions(dst net.IP, o *netlink.RouteGetOptions) ([]netlink.Route, error) {
	for _, r := range f.routes {
		if r.Dst.IP.Equal(dst) {
			return []netlink.Route{r}, nil
		}
	}
	key := dst.String()
	if o != nil && o.SrcAddr != nil {
		key = o.SrcAddr.String() + ">" + key
	}
	r, ok := f.get[key]
	if !ok {
		return nil, syscall.ENETUNREACH
	}
	return []netlink.Route{r}, nil
}

func (f *fakeTable) RouteAdd(r *netlink.Route) error {
	if f.addErr != nil {
		return f.addErr
	}
	for _, x := range f.routes {
		if x.Dst.String() == r.Dst.String() && x.Table == r.Table {
			return syscall.EEXIST
		}
	}
	f.routes = append(f.routes, *r)
	return nil
}

func (f *fakeTable) RouteDel(r *netlink.Route) error {
	if f.delErr != nil {
		return f.delErr
	}
	for i, x := range f.routes {
		if x.Dst.String() == r.Dst.String() && x.Table == r.Table {
			f.routes = append(f.routes[:i], f.routes[i+1:]...)
			f.deleted = append(f.deleted, *r)
			return nil
		}
	}
	return syscall.ESRCH
}

func (f *fakeTable) RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	var out []netlink.Route
	for _, r := range append(slices.Clone(f.routes), f.table...) {
		v4 := r.Dst == nil && r.Family != netlink.FAMILY_V6 || r.Dst != nil && r.Dst.IP.To4() != nil
		if v4 != (family == netlink.FAMILY_V4) ||
			mask&netlink.RT_FILTER_PROTOCOL != 0 && r.Protocol != filter.Protocol ||
			mask&netlink.RT_FILTER_TABLE != 0 && filter.Table != syscall.RT_TABLE_UNSPEC && r.Table != filter.Table {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestCheckIn(t *testing.T) {
	if err := checkIn("bbr", "reno bbr cubic\n"); err != nil {
		t.Fatal(err)
	}
	err := checkIn("vegas", "reno bbr cubic\n")
	if err == nil || !strings.Contains(err.Error(), `"vegas" is not available`) || !strings.Contains(err.Error(), "reno, bbr, cubic") {
		t.Fatalf("vegas: %v", err)
	}
	if err := checkIn("", "reno cubic"); err == nil || !strings.Contains(err.Error(), "reno, cubic") {
		t.Fatalf("empty: %v", err)
	}
}

// The host route copies the lookup's table, device, gateway and source,
// for both families, with link scope when there is no gateway.
func TestHostRoute(t *testing.T) {
	via := netlink.Route{Table: 100, LinkIndex: 7, Src: net.ParseIP("10.0.0.1")}
	rt := HostRoute(via, netip.MustParseAddr("192.0.2.5"), "bbr")
	if rt.Dst.String() != "192.0.2.5/32" || rt.Table != 100 || rt.LinkIndex != 7 || rt.Scope != netlink.SCOPE_LINK ||
		rt.Congctl != "bbr" || rt.Protocol != Protocol || !rt.Src.Equal(via.Src) || rt.Gw != nil {
		t.Fatalf("on-link v4: %+v", rt)
	}
	via = netlink.Route{LinkIndex: 3, Gw: net.ParseIP("2001:db8::1")}
	rt = HostRoute(via, netip.MustParseAddr("2001:db8:1::9"), "reno")
	if rt.Dst.String() != "2001:db8:1::9/128" || rt.Table != syscall.RT_TABLE_MAIN || rt.Scope != netlink.SCOPE_UNIVERSE || !rt.Gw.Equal(via.Gw) {
		t.Fatalf("via gateway v6: %+v", rt)
	}
}

func TestPrepareAddsOnceAndCloseRemoves(t *testing.T) {
	left := netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("198.51.100.1").To4(), Mask: net.CIDRMask(32, 32)}, Protocol: Protocol, Table: 254}
	someone := netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("198.51.100.2").To4(), Mask: net.CIDRMask(32, 32)}, Table: 254}
	f := &fakeTable{
		routes: []netlink.Route{left, someone},
		table:  []netlink.Route{{Table: 254, LinkIndex: 2, Gw: net.ParseIP("10.0.0.254")}},
		get: map[string]netlink.Route{
			"203.0.113.7":          {Table: 254, LinkIndex: 2, Gw: net.ParseIP("10.0.0.254")},
			"10.9.0.2>192.0.2.1":   {Table: 51820, LinkIndex: 9, Src: net.ParseIP("10.9.0.2")},
			"203.0.113.8":          {Table: 254, LinkIndex: 2, Congctl: "reno"},
			"2001:db8::7":          {Table: 254, LinkIndex: 2, Gw: net.ParseIP("fe80::1")},
			"10.9.0.2>192.0.2.250": {Table: 51820, LinkIndex: 9},
		},
	}
	r, err := New(f, "bbr", quiet())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.deleted) != 1 || f.deleted[0].Dst.String() != "198.51.100.1/32" {
		t.Fatalf("leftovers removed: %+v", f.deleted)
	}
	nat, tun := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("192.0.2.1")
	r.Prepare(netip.Addr{}, nat)
	r.Prepare(netip.MustParseAddr("10.9.0.2"), tun) // a tunnel detour: its source picks the table
	r.Prepare(netip.Addr{}, nat)                    // the lookup now finds our route
	r.Prepare(netip.Addr{}, netip.MustParseAddr("2001:db8::7"))
	r.Prepare(netip.Addr{}, netip.MustParseAddr("203.0.113.8"))
	r.Prepare(netip.Addr{}, netip.MustParseAddr("198.51.100.2")) // someone's host route: answered by it, no congctl
	st := r.Status()
	if st.State != "active" || len(st.Routes) != 3 {
		t.Fatalf("routes: %+v", st)
	}
	if st.Routes[0].Dst != tun || st.Routes[0].Table != 51820 || st.Routes[1].Dst != nat || st.Routes[1].Table != 254 {
		t.Fatalf("routes: %+v", st.Routes)
	}
	if len(st.Failed) != 2 || !strings.Contains(st.Failed[0].Error, "exists") || !strings.Contains(st.Failed[1].Error, `"reno"`) {
		t.Fatalf("failed: %+v", st.Failed)
	}
	if len(f.routes) != 4 { // someone's + 3 ours
		t.Fatalf("table: %+v", f.routes)
	}
	f.deleted = nil
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if len(f.deleted) != 3 || len(f.routes) != 1 || f.routes[0].Dst.String() != "198.51.100.2/32" {
		t.Fatalf("after Close: deleted %+v, left %+v", f.deleted, f.routes)
	}
	r.Prepare(netip.Addr{}, nat) // after Close: nothing
	if len(f.routes) != 1 {
		t.Fatal("Prepare after Close added a route")
	}
}

// A route that cannot be added leaves the subflow on the host's
// algorithm; a later success clears the failure.
func TestPrepareFailureThenRecovery(t *testing.T) {
	f := &fakeTable{get: map[string]netlink.Route{"203.0.113.7": {Table: 254, LinkIndex: 2}}, addErr: syscall.EPERM}
	var logged strings.Builder
	r, err := New(f, "bbr", slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddr("203.0.113.7")
	r.Prepare(netip.Addr{}, dst)
	r.Prepare(netip.Addr{}, dst)
	if st := r.Status(); len(st.Failed) != 1 || len(st.Routes) != 0 {
		t.Fatalf("%+v", st)
	}
	if n := strings.Count(logged.String(), "not applied"); n != 1 {
		t.Fatalf("%d warnings, want 1: %s", n, logged.String())
	}
	r.Prepare(netip.Addr{}, netip.MustParseAddr("203.0.113.9")) // no route at all
	f.addErr = nil
	r.Prepare(netip.Addr{}, dst)
	if st := r.Status(); len(st.Failed) != 1 || st.Failed[0].Dst.String() != "203.0.113.9" || len(st.Routes) != 1 {
		t.Fatalf("after recovery: %+v", st)
	}
}

// A destination whose lookup failed (no table known yet) and whose route
// is added later is no longer listed as failed.
func TestPrepareRecoveryAfterLookupFailure(t *testing.T) {
	f := &fakeTable{get: map[string]netlink.Route{}}
	r, err := New(f, "bbr", quiet())
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddr("203.0.113.7")
	r.Prepare(netip.Addr{}, dst) // no route yet
	if st := r.Status(); len(st.Failed) != 1 {
		t.Fatalf("before: %+v", st)
	}
	f.get["203.0.113.7"] = netlink.Route{Table: 254, LinkIndex: 2}
	r.Prepare(netip.Addr{}, dst)
	if st := r.Status(); len(st.Failed) != 0 || len(st.Routes) != 1 {
		t.Fatalf("after the route appeared: %+v, want one route and no failure", st)
	}
}

// A start that fails after netlink was opened (a route an earlier agent
// left cannot be removed) leaves a Routes that adds nothing: its status
// says failed, and a route it added would be one status does not show.
func TestOpenStartFailureAddsNothing(t *testing.T) {
	left := netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("198.51.100.1").To4(), Mask: net.CIDRMask(32, 32)}, Protocol: Protocol, Table: 254}
	f := &fakeTable{routes: []netlink.Route{left}, delErr: syscall.EPERM,
		get: map[string]netlink.Route{"203.0.113.7": {Table: 254, LinkIndex: 2}}}
	closed := false
	r := open("bbr", quiet(), func(string) error { return nil }, func() (RouteTable, func(), error) {
		return f, func() { closed = true }, nil
	})
	if st := r.Status(); st.State != "failed" || !strings.Contains(st.Error, "earlier agent") {
		t.Fatalf("status %+v", st)
	}
	if !closed {
		t.Error("netlink not released after the failed start")
	}
	r.Prepare(netip.Addr{}, netip.MustParseAddr("203.0.113.7"))
	if len(f.routes) != 1 {
		t.Fatalf("a failed mechanism added a route: %+v", f.routes)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// Prepare may race with Close (a worker still preparing while the agent
// stops): it then does nothing, never touching the released handle.
func TestPrepareConcurrentWithClose(t *testing.T) {
	f := &lockedTable{fakeTable: fakeTable{get: map[string]netlink.Route{"203.0.113.7": {Table: 254, LinkIndex: 2}}}}
	r, err := New(f, "bbr", quiet())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				r.Prepare(netip.Addr{}, netip.MustParseAddr("203.0.113.7"))
			}
		})
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
}

// lockedTable is fakeTable safe for concurrent use.
type lockedTable struct {
	mu sync.Mutex
	fakeTable
}

func (f *lockedTable) RouteGetWithOptions(dst net.IP, o *netlink.RouteGetOptions) ([]netlink.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fakeTable.RouteGetWithOptions(dst, o)
}

func (f *lockedTable) RouteAdd(r *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fakeTable.RouteAdd(r)
}

func (f *lockedTable) RouteDel(r *netlink.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fakeTable.RouteDel(r)
}

// A gateway change under our host route: the next Prepare (at most every
// followEvery) moves ours onto the table's new route; a destination whose
// only route left loses ours (the failure is shown).
func TestPrepareFollowsGatewayChange(t *testing.T) {
	f, r, nat, now := followed(t)
	if len(f.routes) != 1 || !f.routes[0].Gw.Equal(net.ParseIP("10.0.0.254")) {
		t.Fatalf("first route: %+v", f.routes)
	}
	// The host moves to another gateway (a more specific route wins over
	// the old default, as a new DHCP lease's would replace it).
	f.table = append(f.table, netlink.Route{Table: 254, LinkIndex: 3, Gw: net.ParseIP("10.1.0.1"),
		Dst: &net.IPNet{IP: net.ParseIP("203.0.113.0").To4(), Mask: net.CIDRMask(24, 32)}})
	r.Prepare(netip.Addr{}, nat) // within followEvery: not compared yet
	if !f.routes[0].Gw.Equal(net.ParseIP("10.0.0.254")) {
		t.Fatalf("compared within followEvery: %+v", f.routes)
	}
	*now = now.Add(followEvery)
	r.Prepare(netip.Addr{}, nat)
	if len(f.routes) != 1 || !f.routes[0].Gw.Equal(net.ParseIP("10.1.0.1")) || f.routes[0].LinkIndex != 3 || f.routes[0].Src != nil || f.routes[0].Congctl != "bbr" || f.routes[0].Protocol != Protocol {
		t.Fatalf("after the gateway change: %+v, want ours via 10.1.0.1 dev 3", f.routes)
	}
	if st := r.Status(); len(st.Routes) != 1 || st.Routes[0].Dev != 3 || len(st.Failed) != 0 {
		t.Fatalf("status %+v", st)
	}
	// Every route beneath goes: ours goes too, and status says why.
	f.table = nil
	*now = now.Add(followEvery)
	r.Prepare(netip.Addr{}, nat)
	if st := r.Status(); len(f.routes) != 0 || len(st.Routes) != 0 || len(st.Failed) != 1 || !strings.Contains(st.Failed[0].Error, "none in table 254") {
		t.Fatalf("without a route beneath: table %+v, status %+v", f.routes, st)
	}
}

// The table's route becomes multipath (say, a second uplink in ECMP): ours
// stays while its next hop is one of the new route's, and moves onto one
// of them when it is not (it kept the old gateway, gone from the table).
func TestPrepareFollowsIntoMultipath(t *testing.T) {
	f, r, nat, now := followed(t)
	multipath := func(hops ...*netlink.NexthopInfo) []netlink.Route {
		return []netlink.Route{{Table: 254, MultiPath: hops}}
	}
	// Ours' next hop is one of the new route's: left as it is.
	f.table = multipath(&netlink.NexthopInfo{LinkIndex: 3, Gw: net.ParseIP("10.1.0.1")}, &netlink.NexthopInfo{LinkIndex: 2, Gw: net.ParseIP("10.0.0.254")})
	*now = now.Add(followEvery)
	r.Prepare(netip.Addr{}, nat)
	if len(f.routes) != 1 || f.routes[0].LinkIndex != 2 || !f.routes[0].Gw.Equal(net.ParseIP("10.0.0.254")) || len(f.deleted) != 0 {
		t.Fatalf("ours' hop among the multipath route's: %+v (deleted %+v), want it left", f.routes, f.deleted)
	}
	// The old gateway is gone: ours moves onto a hop of the route.
	f.table = multipath(&netlink.NexthopInfo{LinkIndex: 3, Gw: net.ParseIP("10.1.0.1")}, &netlink.NexthopInfo{LinkIndex: 4, Gw: net.ParseIP("10.2.0.1")})
	*now = now.Add(followEvery)
	r.Prepare(netip.Addr{}, nat)
	if len(f.routes) != 1 || f.routes[0].LinkIndex != 3 || !f.routes[0].Gw.Equal(net.ParseIP("10.1.0.1")) || f.routes[0].Congctl != "bbr" || len(f.routes[0].MultiPath) != 0 {
		t.Fatalf("ours after its gateway left the multipath route: %+v, want via 10.1.0.1 dev 3", f.routes)
	}
	if st := r.Status(); len(st.Routes) != 1 || st.Routes[0].Dev != 3 || len(st.Failed) != 0 {
		t.Fatalf("status %+v", st)
	}
}

// followed is Routes on a fake whose table routes 203.0.113.7 via
// 10.0.0.254 on device 2, with our host route to it added, and its clock
// (moved by the caller).
func followed(t *testing.T) (*fakeTable, *Routes, netip.Addr, *time.Time) {
	t.Helper()
	f := &fakeTable{
		get:   map[string]netlink.Route{"203.0.113.7": {Table: 254, LinkIndex: 2, Gw: net.ParseIP("10.0.0.254"), Src: net.ParseIP("10.0.0.2")}},
		table: []netlink.Route{{Table: 254, LinkIndex: 2, Gw: net.ParseIP("10.0.0.254")}},
	}
	r, err := New(f, "bbr", quiet())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	nat := netip.MustParseAddr("203.0.113.7")
	r.Prepare(netip.Addr{}, nat)
	return f, r, nat, &now
}

// A new gateway on the same device whose route names its source (a new
// lease's address): ours takes that source, not the one it had.
func TestPrepareFollowsRouteSource(t *testing.T) {
	f, r, nat, now := followed(t)
	f.table = []netlink.Route{{Table: 254, LinkIndex: 2, Gw: net.ParseIP("10.0.5.1"), Src: net.ParseIP("10.0.5.7")}}
	*now = now.Add(followEvery)
	r.Prepare(netip.Addr{}, nat)
	if len(f.routes) != 1 || !f.routes[0].Gw.Equal(net.ParseIP("10.0.5.1")) || !f.routes[0].Src.Equal(net.ParseIP("10.0.5.7")) {
		t.Fatalf("after a new gateway with its own source on the same device: %+v, want via 10.0.5.1 src 10.0.5.7", f.routes)
	}
	// Without a source named, the one ours had stays.
	f.table = []netlink.Route{{Table: 254, LinkIndex: 2, Gw: net.ParseIP("10.0.5.2")}}
	*now = now.Add(followEvery)
	r.Prepare(netip.Addr{}, nat)
	if len(f.routes) != 1 || !f.routes[0].Gw.Equal(net.ParseIP("10.0.5.2")) || !f.routes[0].Src.Equal(net.ParseIP("10.0.5.7")) {
		t.Fatalf("after a new gateway without a source: %+v, want via 10.0.5.2 src 10.0.5.7", f.routes)
	}
}
