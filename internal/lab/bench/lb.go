package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
)

// The loadbalancer scenario (after Duchene ch. 5): an L4 load
// balancer in front of two backends, in two instances lb1 and lb2 that r2
// reaches through the anycast prefix of the service address. Each instance
// DNATs the service to a backend chosen by a hash of the client's address
// and port (nftables jhash; IPVS is not in this kernel) and masquerades to
// itself, like a full-NAT balancer; the instances share no state and hash
// with different seeds. When the anycast route moves to the other
// instance, a connection's packets meet a balancer that does not know it:
// it picks a backend and a source address afresh, and the backend, which
// has no such connection, resets it. A connection survives only with a
// subflow that does not cross the balancer: to the backend's own (unique)
// address, which the server role announces with ADD_ADDR together with
// the C flag (clients must not join the service address, which would hash
// to any backend), or through a detour the server announces.

const (
	lbConnections  = 100
	lbRouteChanges = 16
	lbPrefix       = "10.0.100.0/24"
	// lbDetourPort is the detour node's waypoint port for backend i
	// (lbDetourPort+i -> backend i's receiver).
	lbDetourPort = 6001
)

// lbCounters are the kernel counters recorded per trial: announcements
// received and joins on the client, announcements sent and dropped, joins
// and resets on the backends.
var lbCounters = map[string][]string{
	"client": {"AddAddr", "AddAddrDrop", "EchoAddTx", "MPJoinSynTx", "MPJoinSynAckRx", "MPRstRx", "MPJoinSynTxConnectErr", "MPCapableSYNACKRX", "MPCapableFallbackSYNACK",
		"MPCapableDataFallback", "DssFallback", "DSSNotMatching", "MPFastcloseRx", "MPFastcloseTx", "MPFailRx", "RmAddr", "SubflowStale", "SubflowRecover"},
	"b1": {"AddAddrTx", "AddAddrTxDrop", "EchoAdd", "MPJoinSynRx", "MPJoinAckRx", "MPJoinNoTokenFound", "MPRstTx", "MPCapableSYNRX", "MPCapableACKRX", "MPCapableFallbackACK", "MPFallbackTokenInit",
		"MPCapableDataFallback", "DssFallback", "DSSNotMatching", "MPFastcloseRx", "MPFastcloseTx", "MPRstRx", "SubflowStale", "DuplicateData"},
	"b2": {"AddAddrTx", "AddAddrTxDrop", "EchoAdd", "MPJoinSynRx", "MPJoinAckRx", "MPJoinNoTokenFound", "MPRstTx", "MPCapableSYNRX", "MPCapableACKRX", "MPCapableFallbackACK", "MPFallbackTokenInit",
		"MPCapableDataFallback", "DssFallback", "DSSNotMatching", "MPFastcloseRx", "MPFastcloseTx", "MPRstRx", "SubflowStale", "DuplicateData"},
}

var (
	lbInstances = []string{"lb1", "lb2"}
	lbBackends  = []string{"b1", "b2"}
)

// lbSetup is the balancer and the backends of a cell.
type lbSetup struct {
	env     *Env
	undo    []func() error
	daemons []*daemon
	paths   map[netip.Addr]string
	vip     netip.AddrPort
	// subflows each connection should end with (announced: 3).
	subflows int
}

func (s *lbSetup) close() error {
	var errs []error
	for i := len(s.undo) - 1; i >= 0; i-- {
		errs = append(errs, s.undo[i]())
	}
	s.undo = nil
	return errors.Join(errs...)
}

// setupLB builds the balancer instances, a receiver on each backend the
// runner did not start one on, and, with announce, the server role on
// every backend (C flag, unique address, detour waypoint announced).
// lbMode is what the backends run.
type lbMode int

const (
	lbPlain   lbMode = iota // no server role: the kernel as it is
	lbRole                  // server role: C flag, unique address and waypoint announced
	lbNoCFlag               // server role announcing, C flag explicitly off
)

func setupLB(ctx context.Context, env *Env, mode lbMode) (_ *lbSetup, err error) {
	s := &lbSetup{env: env, paths: map[netip.Addr]string{}, subflows: 1,
		vip: netip.AddrPortFrom(topology.LoadBalancerVIP, uint16(env.Port))}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	for _, n := range append(append([]string{"r2"}, lbInstances...), lbBackends...) {
		if env.Lab.NetnsName(n) == "" {
			return nil, fmt.Errorf("procedure %s needs the loadbalancer topology (no node %q)", env.Cell.Procedure, n)
		}
	}
	var backends []string
	for _, b := range lbBackends {
		backends = append(backends, env.Lab.Addr(b).String())
		s.paths[env.Lab.Addr(b)] = "unique"
	}
	for i, lb := range lbInstances {
		var m []string
		for j, b := range backends {
			m = append(m, fmt.Sprintf("%d : %s", j, b))
		}
		// Independent instances: each its own hash seed.
		rm, err := nftScript(ctx, env, lb, "mpdetour_lb", fmt.Sprintf(`table ip mpdetour_lb {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %s tcp dport %d dnat to jhash ip saddr . tcp sport mod %d seed 0x%x map { %s }
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ct status dnat masquerade
	}
}
`, s.vip.Addr(), s.vip.Port(), len(backends), 0x5eed0+i, strings.Join(m, ", ")))
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, rm)
	}
	if err := s.route(0); err != nil {
		return nil, err
	}
	for _, b := range lbBackends {
		if b == env.Roles.Server {
			continue // the runner's receiver
		}
		e := *env
		e.Roles.Server = b
		stop, err := startReceiver(ctx, &e)
		if err != nil {
			return nil, fmt.Errorf("receiver in %s: %w", b, err)
		}
		s.undo = append(s.undo, func() error { stop(); return nil })
	}
	if mode == lbPlain {
		return s, nil
	}
	if len(env.Cell.Detours) != 1 {
		return nil, fmt.Errorf("procedure %s uses exactly one detour node, not %v", env.Cell.Procedure, env.Cell.Detours)
	}
	det := env.Cell.Detours[0]
	if err := enableForwarding(env, det); err != nil {
		return nil, err
	}
	deny := mode == lbRole
	for i, b := range lbBackends {
		port := uint16(lbDetourPort + i)
		rm, err := waypoint(ctx, env, det, port, netip.AddrPortFrom(env.Lab.Addr(b), uint16(env.Port)))
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, rm)
		ann := []announce{
			{name: "unique", addr: env.Lab.Addr(b).String()},
			{name: det, addr: netip.AddrPortFrom(env.Lab.Addr(det), port).String()},
		}
		ag, err := startServerAgent(ctx, env, b, "server-agent-"+b, ann, &deny)
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, ag.stop)
		s.daemons = append(s.daemons, ag)
	}
	s.paths[env.Lab.Addr(det)] = "announced:" + det
	restore, err := acceptAnnouncements(env, env.Roles.Client, 3)
	if err != nil {
		return nil, err
	}
	s.undo = append(s.undo, restore)
	s.subflows = 3
	// The C flag only changes what a client with another local address
	// does: its in-kernel PM joins the service address from it unless
	// the flag forbids. Give the client one (a `subflow` endpoint) so
	// the difference shows.
	rm, err := secondClientAddress(ctx, env)
	if err != nil {
		return nil, err
	}
	s.undo = append(s.undo, rm)
	return s, nil
}

// lbSecondAddr is the client's second address in the -announced cells.
const lbSecondAddr = "10.0.1.3"

// secondClientAddress adds lbSecondAddr on the client's link and an
// in-kernel PM `subflow` endpoint for it; it returns the removal. (Lab
// code: the ip CLI is fine here.)
func secondClientAddress(ctx context.Context, env *Env) (func() error, error) {
	ifs := env.Lab.Ifaces(env.Roles.Client)
	if len(ifs) == 0 {
		return nil, fmt.Errorf("client has no interface")
	}
	dev := ifs[0].Name
	run := func(args ...string) error {
		out, err := env.Lab.Command(context.Background(), env.Roles.Client, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s in client: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := run("ip", "addr", "add", lbSecondAddr+"/24", "dev", dev); err != nil {
		return nil, err
	}
	if err := run("ip", "mptcp", "endpoint", "add", lbSecondAddr, "dev", dev, "id", "5", "subflow"); err != nil {
		run("ip", "addr", "del", lbSecondAddr+"/24", "dev", dev)
		return nil, err
	}
	return func() error {
		return errors.Join(run("ip", "mptcp", "endpoint", "delete", "id", "5"), run("ip", "addr", "del", lbSecondAddr+"/24", "dev", dev))
	}, nil
}

// route points r2's anycast route for the service at balancer instance i.
func (s *lbSetup) route(i int) error {
	dst := netip.MustParsePrefix(lbPrefix)
	gw := s.env.Lab.Addr(lbInstances[i])
	return s.env.Lab.Do("r2", func() error {
		err := netlink.RouteReplace(&netlink.Route{
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)},
			Gw:  gw.AsSlice(),
		})
		if err != nil {
			return fmt.Errorf("anycast route %s via %s (%s) in r2: %w", dst, gw, lbInstances[i], err)
		}
		return nil
	})
}

func setupLBConnections(ctx context.Context, env *Env) (Session, error) {
	s, err := setupLB(ctx, env, lbPlain)
	if err != nil {
		return nil, err
	}
	return &lbChurn{s: s}, nil
}

func setupLBConnectionsNoCFlag(ctx context.Context, env *Env) (Session, error) {
	s, err := setupLB(ctx, env, lbNoCFlag)
	if err != nil {
		return nil, err
	}
	return &lbChurn{s: s}, nil
}

func setupLBConnectionsAnnounced(ctx context.Context, env *Env) (Session, error) {
	s, err := setupLB(ctx, env, lbRole)
	if err != nil {
		return nil, err
	}
	return &lbChurn{s: s}, nil
}

// setupLBBulkAnnounced is one bulk transfer to the service address with the
// server role on the backends (no route change): the aggregation through
// the balancer, to compare with `announced` straight to a backend.
func setupLBBulkAnnounced(ctx context.Context, env *Env) (Session, error) {
	s, err := setupLB(ctx, env, lbRole)
	if err != nil {
		return nil, err
	}
	return &transfer{env: env, dst: s.vip, mptcp: true, wantSubflows: s.subflows, paths: s.paths,
		close: s.close, daemons: s.daemons}, nil
}

// lbChurn runs lbConnections transfers to the service at once for the
// cell's duration while the anycast route moves lbRouteChanges times
// (evenly spaced, alternating between the instances).
type lbChurn struct{ s *lbSetup }

func (c *lbChurn) Close() error { return c.s.close() }

func (c *lbChurn) Trial(ctx context.Context, n int) (Measurement, error) {
	e := c.s.env
	if n > 1 {
		select {
		case <-time.After(2 * pauseBetweenTrials):
		case <-ctx.Done():
			return Measurement{}, ctx.Err()
		}
	}
	if err := c.s.route(0); err != nil {
		return Measurement{}, err
	}
	for _, d := range c.s.daemons {
		if ok, _ := d.exited(); ok {
			return Measurement{}, d.failure()
		}
	}
	mib := func() map[string]uint64 {
		m := map[string]uint64{}
		for node, names := range lbCounters {
			c, err := mptcppm.MIB(e.Lab.NetnsPath(node))
			if err != nil {
				continue
			}
			for _, n := range names {
				m[node+"."+n] = c[n]
			}
		}
		return m
	}
	before := mib()
	// The receivers' logs grow over the trials: read this trial's part.
	recvFrom := map[string]int64{}
	for _, b := range lbBackends {
		if fi, err := os.Stat(receiverLog(e, b)); err == nil {
			recvFrom[b] = fi.Size()
		}
	}
	// Connections start over the first 10% of the duration; the route
	// changes run from 25% to 95% of it, evenly spaced: every connection
	// has had at least 15% of the duration (2.5 s at 17 s) to complete its
	// handshake and, with the server role, receive the announcements and
	// join. No MPTCP mechanism protects a connection that still has only
	// its first subflow (see docs/results/loadbalancer).
	spread := e.Duration / 10
	first, last := e.Duration/4, e.Duration*95/100
	at := func(k int) time.Duration { return first + (last-first)*time.Duration(k-1)/(lbRouteChanges-1) }
	var wg sync.WaitGroup
	type outcome struct {
		res *benchtool.Result
		err error
	}
	outs := make([]outcome, lbConnections)
	start := time.Now()
	trace, err := startLBTrace(e.Lab.NetnsPath(e.Roles.Client), start)
	if err != nil {
		return Measurement{}, fmt.Errorf("client MPTCP events: %w", err)
	}
	defer trace.stop()
	var backendTraces []*lbTrace
	for _, b := range lbBackends {
		t, err := startLBTrace(e.Lab.NetnsPath(b), start)
		if err != nil {
			return Measurement{}, fmt.Errorf("%s MPTCP events: %w", b, err)
		}
		defer t.stop()
		backendTraces = append(backendTraces, t)
	}
	for i := range lbConnections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(spread * time.Duration(i) / lbConnections):
			case <-ctx.Done():
				outs[i].err = ctx.Err()
				return
			}
			// Each connection runs until the common end.
			d := e.Duration - time.Since(start)
			res, err := benchtool.Send(ctx, benchtool.SendOptions{
				Addr: c.s.vip.String(), Duration: d, Warmup: min(e.Warmup, d/2), MPTCP: true, CC: e.CC,
				Netns: e.Lab.NetnsPath(e.Roles.Client), ConnectTimeout: 5 * time.Second,
			})
			outs[i] = outcome{res, err}
		}()
	}
	// Sockets of the connections still waiting for their summary, 2 s
	// after the writes ended, and of all connections at 60% of the
	// duration (after most route changes, while they still write): with
	// MPDETOUR_BENCH_KEEP set the cell's directory keeps them
	// (ss-trialN-NODE.txt, ss-trialN-NODE-mid.txt). -m shows each
	// socket's memory and receive buffer (docs/results/loadbalancer:
	// class B's out-of-order queue over the receive buffer).
	snap := func(at time.Duration, suffix string) func() {
		done := make(chan struct{})
		t := time.AfterFunc(at, func() {
			defer close(done)
			for _, node := range append([]string{e.Roles.Client}, lbBackends...) {
				out, _ := e.Lab.Command(ctx, node, "ss", "-tnmiM").CombinedOutput()
				_ = os.WriteFile(filepath.Join(e.Dir, fmt.Sprintf("ss-trial%d-%s%s.txt", n, node, suffix)), out, 0o644)
			}
		})
		return func() {
			if t.Stop() {
				close(done)
			}
			<-done
		}
	}
	defer snap(e.Duration*6/10, "-mid")()
	defer snap(e.Duration+2*time.Second, "")()
	changes := 0
	var routeErr error
	for k := 1; k <= lbRouteChanges; k++ {
		select {
		case <-time.After(time.Until(start.Add(at(k)))):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		if err := c.s.route(k % 2); err != nil {
			routeErr = err
			break
		}
		changes++
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Measurement{}, err
	}
	if routeErr != nil {
		return Measurement{}, routeErr
	}
	ch := &results.Churn{Connections: lbConnections, RouteChanges: changes, Counters: map[string]uint64{}}
	for k, v := range mib() {
		ch.Counters[k] = v - before[k]
	}
	reasons := map[string]int{}
	var goodput float64
	var bytes uint64
	for _, o := range outs {
		if o.err != nil {
			ch.Broken++
			reasons[shortReason(o.err)]++
			continue
		}
		goodput += o.res.Goodput
		bytes += o.res.WindowBytes
	}
	for r, k := range reasons {
		ch.Reasons = append(ch.Reasons, fmt.Sprintf("%d x %s", k, r))
	}
	sort.Strings(ch.Reasons)
	trace.stop()
	for _, t := range backendTraces {
		t.stop()
	}
	errs := make([]error, len(outs))
	for i, o := range outs {
		errs[i] = o.err
	}
	var recv []string
	for _, b := range lbBackends {
		if data, err := os.ReadFile(receiverLog(e, b)); err == nil && int64(len(data)) >= recvFrom[b] {
			recv = append(recv, strings.Split(string(data[recvFrom[b]:]), "\n")...)
		}
	}
	ch.Detail, ch.ShortOfJoins = lbDiagnose(trace, backendTraces, errs, at(1), c.s.subflows-1, recv)
	if len(ch.Reasons) > 5 {
		ch.Reasons = ch.Reasons[:5]
	}
	return Measurement{GoodputMbps: goodput, WindowBytes: bytes, Churn: ch}, nil
}

// shortReason drops the addresses and ports from a transfer error, so
// that the same cause counts once.
func shortReason(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[:strings.Index(s, ":")] + ": " + s[i+2:]
	}
	return s
}
