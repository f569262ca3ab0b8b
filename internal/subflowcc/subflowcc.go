// Package subflowcc gives detour subflows their own TCP congestion control
// (the agent's subflow_congestion, docs/agent.md), while the subflow on the
// default path keeps the one the host or the application chose.
//
// TCP_CONGESTION on an MPTCP socket applies to every subflow. Per subflow,
// without kernel patches, the route metric RTAX_CC_ALGO (`congctl` in
// iproute2) does it: tcp_connect_init -> tcp_ca_dst_init gives a connecting
// socket the algorithm of its route, and an MPTCP subflow the path manager
// creates connects like any TCP socket, after mptcp_sockopt_sync_locked has
// copied the MPTCP socket's algorithm to it, so the route's wins. An
// application that sets TCP_CONGESTION on its MPTCP socket after the
// subflows exist overrides it again (the sync runs once more); the metric is
// not locked (`congctl lock`) because a locked route makes that setsockopt
// fail with EPERM (measured on 6.18).
//
// For each detour subflow, before it is created, Prepare looks up the route
// the subflow will take (RTM_GETROUTE from its source to its destination,
// in the table policy routing picks: the main table for NAT detours, the
// tunnel's table for tunnel detours) and, unless that route already carries
// the algorithm, adds a host route to the destination (/32 or /128) in the
// same table, with the same device, gateway and source, plus the metric.
// NAT detours' destinations are relays, never the server, so the default
// path's route is not touched. The routes carry Protocol, are removed by
// Close, and routes left by an agent that died are removed by Open.
//
// It acts on the host that opens the subflows (the agent's host, the
// sender in an upload). On the passive side, tcp_ca_openreq_child takes the
// route's algorithm too, but the server role does not install routes.
package subflowcc

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// Protocol marks the routes this package adds (rtm_protocol; `ip route`
// shows "proto 109"). Routes with it are this package's to remove.
const Protocol netlink.RouteProtocol = 109

// AvailableFile lists the congestion control algorithms the kernel has loaded.
const AvailableFile = "/proc/sys/net/ipv4/tcp_available_congestion_control"

// Check says whether the kernel offers algorithm name (AvailableFile), with
// an error that names what it offers.
func Check(name string) error {
	b, err := os.ReadFile(AvailableFile)
	if err != nil {
		return fmt.Errorf("congestion control %q: cannot read the kernel's list: %w", name, err)
	}
	return checkIn(name, string(b))
}

// checkIn is Check against the list avail (AvailableFile's content).
func checkIn(name, avail string) error {
	algos := strings.Fields(avail)
	if name == "" {
		return fmt.Errorf("no congestion control named (this kernel offers: %s)", strings.Join(algos, ", "))
	}
	if !slices.Contains(algos, name) {
		return fmt.Errorf("congestion control %q is not available in this kernel (it offers: %s; load its module, e.g. tcp_%s, to add it)",
			name, strings.Join(algos, ", "), name)
	}
	return nil
}

// RouteTable is what Routes needs of netlink (a *netlink.Handle in one
// namespace; a fake in tests).
type RouteTable interface {
	RouteGetWithOptions(dst net.IP, o *netlink.RouteGetOptions) ([]netlink.Route, error)
	RouteAdd(r *netlink.Route) error
	RouteDel(r *netlink.Route) error
	RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error)
}

// Status is the mechanism's state for `mpdetour status`.
type Status struct {
	// State: "active" (routes are added as detour subflows come) or
	// "failed" (Error says why; subflows run the host's algorithm).
	State     string `json:"state"`
	Algorithm string `json:"algorithm"`
	Error     string `json:"error,omitempty"`
	// Routes are the host routes added (destination, table, device).
	Routes []RouteStatus `json:"routes,omitempty"`
	// Failed are destinations whose subflows run the host's algorithm,
	// with the reason.
	Failed []RouteStatus `json:"failed,omitempty"`
}

// RouteStatus is one destination's route.
type RouteStatus struct {
	Dst   netip.Addr `json:"dst"`
	Table int        `json:"table"`
	Dev   int        `json:"ifindex,omitempty"`
	Error string     `json:"error,omitempty"`
}

// Routes gives detour subflows an algorithm through host routes.
type Routes struct {
	algo  string
	log   *slog.Logger
	mu    sync.Mutex
	h     RouteTable
	close func()
	err   string // start failed: Prepare does nothing
	added map[key]netlink.Route
	// failed holds destinations whose route could not be added (said
	// once in the log; retried on the next subflow).
	failed map[key]string
	// checked: when each added route was last compared with the route
	// beneath it (follow).
	checked map[key]time.Time
	now     func() time.Time
}

// followEvery bounds how often Prepare compares an added route with the
// table's own route to the destination (a table dump per comparison).
const followEvery = time.Second

type key struct {
	dst   netip.Addr
	table int
}

// Open starts the mechanism in the namespace netns ("" = the caller's):
// the algorithm must be available, the namespace's routes reachable. It
// removes routes an earlier agent left. On failure it returns a Routes
// whose Prepare does nothing and whose Status says why, and logs once.
func Open(netns, algo string, log *slog.Logger) *Routes {
	return open(algo, log, Check, func() (RouteTable, func(), error) { return handleIn(netns) })
}

// open is Open with the algorithm check and the netlink handle from
// check and handle (fakes in tests).
func open(algo string, log *slog.Logger, check func(string) error, handle func() (RouteTable, func(), error)) *Routes {
	r := newRoutes(algo, log)
	err := check(algo)
	if err == nil {
		r.h, r.close, err = handle()
	}
	if err == nil {
		err = r.start()
	}
	if err != nil {
		r.err = err.Error()
		// Nothing more from a failed start: Prepare adds no route that
		// status (which says failed) would not show.
		if r.close != nil {
			r.close()
		}
		r.h, r.close = nil, nil
		log.Warn("subflow congestion control off: detour subflows run the host's algorithm", "want", algo, "err", err)
		return r
	}
	log.Info("subflow congestion control on: detour subflows run "+algo+" (a host route with congctl per detour destination; the default path keeps the host's)",
		"algorithm", algo)
	return r
}

func newRoutes(algo string, log *slog.Logger) *Routes {
	return &Routes{algo: algo, log: log, added: map[key]netlink.Route{}, failed: map[key]string{},
		checked: map[key]time.Time{}, now: time.Now}
}

// handleIn opens netlink in the namespace spec names.
func handleIn(spec string) (RouteTable, func(), error) {
	h, err := netnsx.NetlinkHandle(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink in namespace %q: %w", spec, err)
	}
	return h, h.Close, nil
}

// New is Open on h (a fake in tests), without the algorithm check.
func New(h RouteTable, algo string, log *slog.Logger) (*Routes, error) {
	r := newRoutes(algo, log)
	r.h = h
	if err := r.start(); err != nil {
		return nil, err
	}
	return r, nil
}

// start removes the routes a previous agent left (both families).
func (r *Routes) start() error {
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		left, err := r.h.RouteListFiltered(fam, &netlink.Route{Protocol: Protocol, Table: syscall.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		for _, rt := range left {
			if err := r.remove(&rt); err != nil {
				errs = append(errs, fmt.Errorf("remove route to %s left by an earlier agent: %w", rt.Dst, err))
				continue
			}
			r.log.Info("removed a route left by an earlier agent", "dst", rt.Dst, "table", rt.Table)
		}
	}
	return errors.Join(errs...)
}

// Prepare makes the subflow from local (invalid: the namespace's own
// choice) to remote run the algorithm: it must be called before the
// subflow is created. Failures are logged once per destination and shown
// in Status; the subflow then runs the host's algorithm.
func (r *Routes) Prepare(local, remote netip.Addr) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return // failed at start, or closed (checked under the lock: Close may run meanwhile)
	}
	k, err := r.prepare(local.Unmap(), remote.Unmap())
	if err != nil {
		if _, said := r.failed[k]; !said {
			r.log.Warn("subflow congestion control not applied: subflows to this destination run the host's algorithm",
				"dst", remote, "want", r.algo, "err", err)
		}
		r.failed[k] = err.Error()
		return
	}
	delete(r.failed, k)
	// A failure before the lookup answered has no table (0).
	delete(r.failed, key{dst: k.dst})
}

func (r *Routes) prepare(local, remote netip.Addr) (key, error) {
	k := key{dst: remote}
	var o netlink.RouteGetOptions
	if local.IsValid() {
		o.SrcAddr = local.AsSlice()
	}
	got, err := r.h.RouteGetWithOptions(remote.AsSlice(), &o)
	if err != nil {
		return k, fmt.Errorf("route to %s: %w", remote, err)
	}
	if len(got) == 0 {
		return k, fmt.Errorf("route to %s: none", remote)
	}
	via := got[0]
	k.table = via.Table
	// Our host route answers (the kernel's answer carries no protocol).
	if ours, ok := r.added[k]; ok && via.Congctl == r.algo {
		return k, r.follow(k, ours)
	}
	if via.Congctl == r.algo {
		return k, nil // the host's own route says so already
	}
	if via.Congctl != "" {
		return k, fmt.Errorf("the route to %s already names congestion control %q (left as it is)", remote, via.Congctl)
	}
	rt := HostRoute(via, remote, r.algo)
	if err := r.h.RouteAdd(&rt); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return k, fmt.Errorf("a host route to %s exists in table %d (left as it is)", remote, via.Table)
		}
		return k, fmt.Errorf("add route to %s: %w", remote, err)
	}
	r.added[k], r.checked[k] = rt, r.now()
	r.log.Info("subflow congestion control route", "dst", remote, "table", via.Table, "ifindex", via.LinkIndex, "algorithm", r.algo)
	return k, nil
}

// follow keeps our host route k on the path the table's own route takes:
// ours copies the device and gateway of the moment it was added, so
// after a gateway change (DHCP, another uplink) it would keep sending the
// detour's subflows to the old one. At most every followEvery per route
// it finds the table's longest-prefix route beneath ours and, when its
// device or gateway differ, replaces ours. Under a multipath route ours
// stays while its next hop is one of the route's (it took one of them),
// else it moves onto the route's first.
func (r *Routes) follow(k key, ours netlink.Route) error {
	now := r.now()
	if now.Sub(r.checked[k]) < followEvery {
		return nil
	}
	r.checked[k] = now
	fam := netlink.FAMILY_V4
	if k.dst.Is6() {
		fam = netlink.FAMILY_V6
	}
	table, err := r.h.RouteListFiltered(fam, &netlink.Route{Table: ours.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("routes of table %d: %w", ours.Table, err)
	}
	under, ok := beneath(table, k.dst)
	if !ok {
		if err := r.remove(&ours); err != nil {
			return fmt.Errorf("remove route to %s (no route beneath it any more): %w", k.dst, err)
		}
		delete(r.added, k)
		delete(r.checked, k)
		return fmt.Errorf("route to %s: none in table %d besides ours (removed)", k.dst, ours.Table)
	}
	if len(under.MultiPath) > 0 {
		// Ours took one of its next hops: left as it is while that hop
		// is still one of them, else moved onto the first.
		for _, nh := range under.MultiPath {
			if nh != nil && nh.LinkIndex == ours.LinkIndex && nh.Gw.Equal(ours.Gw) {
				return nil
			}
		}
		if nh := under.MultiPath[0]; nh != nil {
			under.LinkIndex, under.Gw = nh.LinkIndex, nh.Gw
		}
		under.MultiPath = nil
	}
	if under.LinkIndex == ours.LinkIndex && under.Gw.Equal(ours.Gw) {
		return nil
	}
	via := under
	if via.LinkIndex == ours.LinkIndex && via.Src == nil {
		// Same device, and the table's route names no source: the one
		// the kernel chose still holds. A source it names (a new lease's
		// address) is the one the kernel now takes.
		via.Src = ours.Src
	}
	rt := HostRoute(via, k.dst, r.algo)
	if err := r.remove(&ours); err != nil {
		return fmt.Errorf("replace route to %s: %w", k.dst, err)
	}
	delete(r.added, k)
	if err := r.h.RouteAdd(&rt); err != nil {
		return fmt.Errorf("replace route to %s: %w", k.dst, err)
	}
	r.added[k] = rt
	r.log.Info("subflow congestion control route follows the table's route", "dst", k.dst, "table", k.table,
		"ifindex", rt.LinkIndex, "gateway", rt.Gw, "was_ifindex", ours.LinkIndex, "was_gateway", ours.Gw)
	return nil
}

// remove deletes rt; one already gone (ESRCH: a tunnel's route goes with
// its device) is no error.
func (r *Routes) remove(rt *netlink.Route) error {
	if err := r.h.RouteDel(rt); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// beneath is the route of table (one family's, one table's) that the
// kernel would pick for dst without ours: the longest prefix containing
// dst among unicast routes of other protocols, the lowest metric among
// equals.
func beneath(table []netlink.Route, dst netip.Addr) (netlink.Route, bool) {
	var best netlink.Route
	bits, found := -1, false
	for _, rt := range table {
		if rt.Protocol == Protocol || rt.Type != 0 && rt.Type != syscall.RTN_UNICAST {
			continue
		}
		n := 0
		if rt.Dst != nil {
			p, ok := netip.AddrFromSlice(rt.Dst.IP)
			ones, _ := rt.Dst.Mask.Size()
			if !ok || !netip.PrefixFrom(p.Unmap(), ones).Contains(dst) {
				continue
			}
			n = ones
		}
		if n > bits || n == bits && rt.Priority < best.Priority {
			best, bits, found = rt, n, true
		}
	}
	return best, found
}

// HostRoute is the route Prepare adds: a host route to dst in the table,
// through the device and gateway of via (what RTM_GETROUTE answered), with
// its preferred source, carrying the algorithm and Protocol.
func HostRoute(via netlink.Route, dst netip.Addr, algo string) netlink.Route {
	bits := 32
	if dst.Is6() {
		bits = 128
	}
	rt := netlink.Route{
		Dst:       &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(bits, bits)},
		LinkIndex: via.LinkIndex,
		Gw:        via.Gw,
		Src:       via.Src,
		Table:     via.Table,
		Protocol:  Protocol,
		Congctl:   algo,
		Scope:     netlink.SCOPE_UNIVERSE,
	}
	if via.Gw == nil {
		rt.Scope = netlink.SCOPE_LINK
	}
	if rt.Table == 0 {
		rt.Table = syscall.RT_TABLE_MAIN
	}
	return rt
}

// Status is the mechanism's state.
func (r *Routes) Status() Status {
	if r == nil {
		return Status{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{State: "active", Algorithm: r.algo}
	if r.err != "" {
		st.State, st.Error = "failed", r.err
		return st
	}
	for k, rt := range r.added {
		st.Routes = append(st.Routes, RouteStatus{Dst: k.dst, Table: k.table, Dev: rt.LinkIndex})
	}
	for k, e := range r.failed {
		st.Failed = append(st.Failed, RouteStatus{Dst: k.dst, Table: k.table, Error: e})
	}
	cmp := func(a, b RouteStatus) int {
		if c := a.Dst.Compare(b.Dst); c != 0 {
			return c
		}
		return a.Table - b.Table
	}
	slices.SortFunc(st.Routes, cmp)
	slices.SortFunc(st.Failed, cmp)
	return st
}

// Close removes the routes added (a route whose device went away, a
// tunnel's, is gone already) and releases netlink.
func (r *Routes) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return nil
	}
	var errs []error
	for k, rt := range r.added {
		if err := r.remove(&rt); err != nil {
			errs = append(errs, fmt.Errorf("remove route to %s (table %d): %w", k.dst, k.table, err))
		}
		delete(r.added, k)
		delete(r.checked, k)
	}
	if r.close != nil {
		r.close()
	}
	r.h = nil
	return errors.Join(errs...)
}
