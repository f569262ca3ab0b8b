// Package agent is the client-side MPTCP path manager behind "mpdetour
// agent": it turns the kernel's mptcp_pm events and subflow measurements
// into Policy calls and the Policy's intents into commands, adopts
// connections that already exist, and serves its state on a unix socket
// for "mpdetour status". It reaches the kernel only through the Kernel
// interface; one goroutine (Run's loop) owns all connection state and the
// policy, and status reads them through it.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

// Agent manages the MPTCP connections of one namespace.
type Agent struct {
	cfg     Options
	log     *slog.Logger
	k       Kernel
	pol     policy.Policy
	sources []detour.Source

	jobs    chan job
	results chan result
	// statusReq carries status requests to the loop, which owns the state.
	statusReq chan chan Status

	// Owned by Run's loop.
	conns    map[uint32]*connView
	detours  map[string]*detourView
	errnoCnt map[string]uint64 // command failures by errno name
	started  time.Time
	// stale: stale_loss_cnt's state, when configured (status).
	stale *StaleStatus
	// bufs: buffer sizing's state, when configured (status).
	bufs *BufferStatus

	stats struct {
		events, lost, resyncs, commands, cmdErrors, adopted atomic.Uint64
		// creates, createErrors: SUBFLOW_CREATE commands sent and refused
		// (a retry storm shows as creates far above connections x detours).
		creates, createErrors atomic.Uint64
	}
	// lat: ESTABLISHED event received -> SUBFLOW_CREATE sent; latAck: ->
	// the kernel's acknowledgement (it connects within the syscall).
	lat, latAck latency
}

type connView struct {
	c policy.Conn
	// selected: the connection's destination matches the selectors (it
	// may get detours, and its subflows are reported to OnSubflows).
	selected    bool
	established bool
	adopted     bool
	since       time.Time
	subs        map[subKey]*subView
}

type subKey struct {
	local  netip.Addr
	remote netip.AddrPort
}

func keyOf(local netip.Addr, remote netip.AddrPort) subKey {
	return subKey{local.Unmap(), netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())}
}

type subView struct {
	sf     policy.Subflow
	detour *detour.Detour // nil: initial subflow or toward an announced address
	path   string
	up     bool
	since  time.Time
}

type detourView struct {
	d                   detour.Detour
	up                  int
	established, failed uint64
	lastErr             string
	lastChange          time.Time
}

type job struct {
	in    policy.Intent
	since time.Time // when the event that caused it arrived (latency)
}

type result struct {
	in  policy.Intent
	err error
}

// New builds an agent on kernel k; sources supply detours (internal/agentd
// puts the config's static ones first). A nil pol means the policy cfg.Policy names,
// built by NewPolicy.
func New(cfg Options, log *slog.Logger, k Kernel, pol policy.Policy, sources ...detour.Source) *Agent {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srcs := sources
	if cfg.Policy == 0 {
		cfg.Policy = policy.Static
	}
	if pol == nil {
		pol = NewPolicy(cfg, log, srcs)
	}
	return &Agent{
		cfg: cfg, log: log, k: k, pol: pol, sources: srcs,
		statusReq: make(chan chan Status),
		conns:     map[uint32]*connView{},
		detours:   map[string]*detourView{},
		errnoCnt:  map[string]uint64{},
	}
}

// NewPolicy builds the policy cfg.Policy names (static unless adaptive)
// from the configuration's knobs.
func NewPolicy(cfg Options, log *slog.Logger, sources []detour.Source) *policy.Engine {
	return policy.New(policy.Config{
		Mode:     cfg.Policy,
		Subflows: noneIsNegative(cfg.Subflows), Announced: noneIsNegative(cfg.AnnouncedSubflows),
		Selectors: cfg.Selectors, MaxConns: cfg.MaxConnections,
		OtherFamily: cfg.OtherFamily, SourceFor: cfg.SourceFor,
		Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff, ConnectTimeout: cfg.ConnectTimeout,
		StallRetransmits: cfg.StallRetransmits, Watchdog: cfg.Watchdog, Window: cfg.Window, Hold: cfg.Hold,
		GuardShare: cfg.GuardShare, GuardWindow: cfg.GuardWindow, GuardStarve: cfg.GuardStarve, GuardRTT: cfg.GuardRTT, GuardOutage: cfg.GuardOutage,
		SharedBottleneck: cfg.SharedBottleneck, SharedWindow: cfg.SharedWindow,
		Log: log,
	}, sources)
}

// noneIsNegative maps the config's explicit 0 to KeepN's "none" (its 0
// means "default").
func noneIsNegative(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

type batch struct {
	evs  []mptcppm.Event
	lost bool
	at   time.Time
}

// Run manages connections until ctx ends. The caller owns the kernel
// (closing a LinuxKernel restores the path manager); subflows already
// open stay open.
func (a *Agent) Run(ctx context.Context) error {
	a.started = time.Now()
	workers := max(a.cfg.CommandWorkers, 1)
	a.jobs = make(chan job, 1024)
	a.results = make(chan result, 4096)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(a.worker)
	}
	defer func() { close(a.jobs); wg.Wait() }()

	var queue []job
	queue = append(queue, a.resync("start")...)

	if a.cfg.Socket != "" {
		srv, err := a.serveStatus(a.cfg.Socket)
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	evc := make(chan batch, 256)
	go a.readEvents(ctx, evc)
	srcc := a.watchSources(ctx)

	// Each detour subflow reserves an ephemeral port exclusively and keeps
	// it 60 s in TIME_WAIT after closing (docs/agent.md, benchmark).
	if v, err := readSysctl(a.cfg.NetNS, "net.ipv4.ip_local_port_range"); err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(v, &lo, &hi); err == nil && hi >= lo {
			a.log.Info("ephemeral ports", "range", fmt.Sprintf("%d-%d", lo, hi),
				"sustained_subflows_per_second", (hi-lo+1)/60)
		}
	}
	a.log.Info("agent running", "netns", a.cfg.NetNS, "policy", a.cfg.Policy.String(), "subflows", a.cfg.Subflows,
		"sources", len(a.sources), "workers", workers, "status", a.cfg.Socket)
	var sizer *bufferSizer
	if a.cfg.BufferSizing {
		var err error
		if sizer, err = newBufferSizer(a.cfg, a.log); err != nil {
			a.log.Warn("socket buffer sizing off", "err", err)
			a.bufs = &BufferStatus{State: "failed", Error: err.Error()}
		} else {
			a.bufs = sizer.status()
			defer func() {
				if sizer == nil {
					return // turned off after an error, restored then
				}
				if err := sizer.restore(); err != nil {
					a.log.Warn("socket buffer sizes not restored", "err", err)
				}
			}()
		}
	}
	if n := a.cfg.StaleLossCnt; n > 0 {
		if st, err := setStaleLossCnt(a.cfg, n, a.log); err != nil {
			a.log.Warn("stale_loss_cnt not set; the namespace keeps its own", "err", err)
			a.stale = &StaleStatus{State: "failed", Want: n, Error: err.Error()}
		} else {
			a.stale = &StaleStatus{State: "set", Want: n, Was: st.orig}
			defer func() {
				if err := st.restore(); err != nil {
					a.log.Warn("stale_loss_cnt not restored", "err", err)
				}
			}()
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	// After a loss, one more resync once things settle catches events
	// dropped after the first one.
	var settle <-chan time.Time
	// Measurements: an inet_diag dump off the loop, results back into it.
	var probeTick <-chan time.Time
	if a.cfg.ProbeInterval > 0 {
		pt := time.NewTicker(a.cfg.ProbeInterval)
		defer pt.Stop()
		probeTick = pt.C
	}
	probec := make(chan probe, 1)
	probing := false
	// The sweep forgets connections the kernel no longer has although no
	// CLOSED event said so (seen with connections closed while joins were
	// pending): their grants would be renewed forever.
	every := a.cfg.SweepEvery
	if every <= 0 {
		every = defaultSweepEvery
	}
	sweepTick := time.NewTicker(every)
	defer sweepTick.Stop()
	sweepc := make(chan sweep, 1)
	sweeping := false
	var swept uint64
	lastSweepLog := time.Time{}
	for {
		var out chan job
		var head job
		if len(queue) > 0 {
			out, head = a.jobs, queue[0]
		}
		select {
		case <-ctx.Done():
			a.log.Info("agent stopping", "connections", len(a.conns))
			return nil
		case out <- head:
			queue = queue[1:]
			if len(queue) == 0 {
				queue = nil // let the backing array go after bursts
			}
		case b, ok := <-evc:
			if !ok {
				if ctx.Err() != nil {
					a.log.Info("agent stopping", "connections", len(a.conns))
					return nil
				}
				return fmt.Errorf("event socket closed")
			}
			if b.lost {
				a.stats.lost.Add(1)
				a.log.Warn("events lost; resynchronising from inet_diag")
				queue = append(queue, a.resync("events lost")...)
				settle = time.After(time.Second)
				continue
			}
			for _, e := range b.evs {
				queue = append(queue, a.handle(e, b.at)...)
			}
		case r := <-a.results:
			queue = append(queue, a.failed(r)...)
		case reply := <-a.statusReq:
			reply <- a.snapshot()
		case <-probeTick:
			if !probing && len(a.conns) > 0 {
				probing = true
				go func() {
					sfs, err := a.k.Subflows()
					if err != nil {
						a.log.Warn("subflow measurement", "err", err)
					}
					probec <- probe{sfs: sfs, at: time.Now()}
				}()
			}
		case pr := <-probec:
			probing = false
			queue = append(queue, a.measured(pr)...)
			if adv, ok := a.pol.(interface{ BufferWanted() int64 }); ok && sizer != nil {
				if err := sizer.apply(adv.BufferWanted()); err != nil {
					a.log.Warn("socket buffer sizing off", "err", err)
					a.bufs = &BufferStatus{State: "failed", Error: err.Error()}
					if err := sizer.restore(); err != nil {
						a.log.Warn("socket buffer sizes not restored", "err", err)
						a.bufs.Error += "; not restored: " + err.Error()
					}
					sizer = nil
				} else if sizer.changes != a.bufs.Changes {
					a.bufs = sizer.status()
				}
			}
		case <-sweepTick.C:
			if !sweeping && len(a.conns) > 0 {
				sweeping = true
				at := time.Now()
				go func() {
					conns, err := a.k.Connections()
					sweepc <- sweep{conns: conns, at: at, err: err}
				}()
			}
		case sw := <-sweepc:
			sweeping = false
			jobs, n := a.swept(sw, every/2)
			queue = append(queue, jobs...)
			if swept += uint64(n); swept > 0 && time.Since(lastSweepLog) >= time.Minute {
				a.log.Info("forgot connections the kernel no longer has (no CLOSED event came)", "connections", swept)
				swept, lastSweepLog = 0, time.Now()
			}
		case <-settle:
			settle = nil
			queue = append(queue, a.resync("settle after loss")...)
		case now := <-tick.C:
			queue = append(queue, a.jobsFor(a.pol.Tick(now), time.Time{})...)
		case <-srcc:
			queue = append(queue, a.jobsFor(a.pol.Refresh(time.Now()), time.Time{})...)
		}
	}
}

// watchSources merges the change notifications of the sources that give
// them (detour.Notifier) into one channel (nil if none does).
func (a *Agent) watchSources(ctx context.Context) <-chan struct{} {
	var out chan struct{}
	for _, s := range a.sources {
		n, ok := s.(detour.Notifier)
		if !ok {
			continue
		}
		if out == nil {
			out = make(chan struct{}, 1)
		}
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-n.Changed():
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return out
}

// defaultSweepEvery is how often tracked connections are checked against
// the kernel's table (Config.SweepEvery).
const defaultSweepEvery = 10 * time.Second

type sweep struct {
	conns []mptcppm.Connection
	at    time.Time
	err   error
}

// swept forgets the tracked connections absent from a dump, as if their
// CLOSED event had come; it returns the jobs and how many it forgot. Only
// connections tracked for longer than grace count: a dump started just
// before a connection's first event cannot list it.
func (a *Agent) swept(sw sweep, grace time.Duration) ([]job, int) {
	if sw.err != nil {
		a.log.Debug("sweep: inet_diag dump failed", "err", sw.err)
		return nil, 0
	}
	present := make(map[uint32]bool, len(sw.conns))
	for _, mc := range sw.conns {
		present[mc.Token] = true
	}
	var gone []uint32
	for tok, cv := range a.conns {
		if !present[tok] && sw.at.Sub(cv.since) > grace {
			gone = append(gone, tok)
		}
	}
	var jobs []job
	for _, tok := range gone {
		jobs = append(jobs, a.handle(mptcppm.Event{Type: mptcppm.EventClosed, Token: tok}, time.Now())...)
	}
	return jobs, len(gone)
}

type probe struct {
	sfs []mptcppm.Subflow
	at  time.Time
}

// readEvents forwards the kernel's events to the loop until the kernel is
// closed or ctx ends.
func (a *Agent) readEvents(ctx context.Context, evc chan<- batch) {
	defer close(evc)
	errs := 0
	for {
		evs, err := a.k.Events()
		now := time.Now()
		switch {
		case errors.Is(err, mptcppm.ErrEventsLost):
			select {
			case evc <- batch{lost: true, at: now}:
			case <-ctx.Done():
				return
			}
		case err != nil:
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				return
			}
			// An undecodable message is skipped; a socket that keeps
			// failing ends the agent rather than spinning.
			a.log.Warn("event socket", "err", err)
			if errs++; errs > 100 {
				return
			}
			time.Sleep(10 * time.Millisecond)
		default:
			errs = 0
			select {
			case evc <- batch{evs: evs, at: now}:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (a *Agent) worker() {
	for j := range a.jobs {
		in := j.in
		if in.Action == policy.CreateSubflow && !j.since.IsZero() {
			a.lat.add(time.Since(j.since))
		}
		if in.Action == policy.CreateSubflow && in.Detour != nil && a.cfg.SubflowCC != nil {
			a.cfg.SubflowCC.Prepare(in.Local.Addr(), in.Remote.Addr())
		}
		err := a.k.Command(in)
		if err == nil && in.Action == policy.CreateSubflow && !j.since.IsZero() {
			a.latAck.add(time.Since(j.since))
		}
		a.stats.commands.Add(1)
		if in.Action == policy.CreateSubflow {
			a.stats.creates.Add(1)
			if err != nil {
				a.stats.createErrors.Add(1)
			}
		}
		if err != nil {
			a.stats.cmdErrors.Add(1)
			a.results <- result{in: in, err: err}
		}
	}
}

// measured hands the subflows of tracked connections to the policy.
func (a *Agent) measured(pr probe) []job {
	ms := make([]policy.Measurement, 0, len(pr.sfs))
	for _, s := range pr.sfs {
		if a.conns[s.Token] == nil {
			continue
		}
		ms = append(ms, policy.Measurement{Token: s.Token, Local: unmap(s.Local), Remote: unmap(s.Remote),
			Backup: s.Backup(), RTT: s.RTT, RTTVar: s.RTTVar, MinRTT: s.MinRTT, Retransmits: s.Retransmits,
			TotalRetrans: s.TotalRetrans, SegsOut: s.SegsOut, Unacked: s.Unacked,
			BytesAcked: s.BytesAcked, BytesReceived: s.BytesReceived, BytesSent: s.BytesSent, BytesRetrans: s.BytesRetrans,
			DeliveryRate: s.DeliveryRate, SinceDataSent: s.SinceDataSent, SinceDataRecv: s.SinceDataRecv, SinceAckRecv: s.SinceAckRecv,
			SndCwnd: s.SndCwnd, SndMSS: s.SndMSS, PacingRate: s.PacingRate, NotsentBytes: s.NotsentBytes, AppLimited: s.AppLimited,
			BusyTime: s.BusyTime, RwndLimited: s.RwndLimited, SndbufLimited: s.SndbufLimited})
	}
	if len(ms) == 0 {
		return nil
	}
	jobs := a.jobsFor(a.pol.Measured(pr.at, ms), time.Time{})
	if a.cfg.OnMeasured != nil {
		a.cfg.OnMeasured(ms)
	}
	return jobs
}

func (a *Agent) jobsFor(ins []policy.Intent, since time.Time) []job {
	if len(ins) == 0 {
		return nil
	}
	out := make([]job, 0, len(ins))
	for _, in := range ins {
		a.log.Debug("intent", "intent", in.String())
		if in.Action == policy.CreateSubflow {
			if cv := a.conns[in.Token]; cv != nil {
				k := keyOf(in.Local.Addr(), in.Remote)
				// A redial of the default path (same addresses as the
				// initial subflow) is the policy's to report, like the
				// initial subflow.
				if cv.subs[k] == nil && k != keyOf(cv.c.Local.Addr(), cv.c.Remote) {
					cv.subs[k] = &subView{sf: policy.Subflow{Token: in.Token, Local: in.Local, Remote: in.Remote, Backup: in.Backup},
						detour: in.Detour, path: pathName(in.Detour, "announced"), since: time.Now()}
				}
			}
		}
		out = append(out, job{in: in, since: since})
	}
	return out
}

func pathName(d *detour.Detour, otherwise string) string {
	if d == nil {
		return otherwise
	}
	return d.Kind.String() + ":" + d.Relay
}

func (a *Agent) failed(r result) []job {
	a.log.Info("command failed", "intent", r.in.String(), "err", r.err)
	name := "other"
	var pe *mptcppm.Error
	if errors.As(r.err, &pe) && pe.Errno != 0 {
		name = pe.Errno.Error()
	}
	if len(a.errnoCnt) < 64 || a.errnoCnt[name] > 0 {
		a.errnoCnt[name]++
	}
	cv := a.conns[r.in.Token]
	if cv != nil && r.in.Action == policy.CreateSubflow {
		delete(cv.subs, keyOf(r.in.Local.Addr(), r.in.Remote))
	}
	if cv == nil {
		return nil // closed meanwhile: the policy forgot it
	}
	if connectionGone(r.err) {
		// The connection closed while the command was queued (a short
		// connection, or one the peer reset): nothing to blame on the
		// detour. The policy is told, so that it stops retrying: its
		// CLOSED event may never come (retry storm).
		a.log.Debug("command for a closed connection", "intent", r.in.String(), "err", r.err)
		return a.jobsFor(a.pol.Failed(r.in, fmt.Errorf("%w: %w", policy.ErrConnectionGone, r.err)), time.Time{})
	}
	if r.in.Detour != nil && r.in.Action == policy.CreateSubflow {
		if pe != nil && pe.Errno == unix.ECONNREFUSED {
			a.refused(cv.c.Remote, *r.in.Detour)
		}
		dv := a.detourView(*r.in.Detour)
		dv.failed++
		dv.lastErr, dv.lastChange = r.err.Error(), time.Now()
	}
	return a.jobsFor(a.pol.Failed(r.in, r.err), time.Time{})
}

// connectionGone says whether a command failed because its connection no
// longer exists: the kernel finds no MPTCP socket for the token.
func connectionGone(err error) bool {
	var pe *mptcppm.Error
	return errors.As(err, &pe) && pe.Errno == unix.EINVAL && strings.Contains(pe.Msg, "invalid token")
}

func (a *Agent) detourView(d detour.Detour) *detourView {
	k := policy.Key(d)
	dv := a.detours[k]
	if dv == nil {
		// Bounded: detours come from configuration and relay grants; forget
		// idle ones when too many accumulate.
		if len(a.detours) >= 4096 {
			for k2, v := range a.detours {
				if v.up == 0 {
					delete(a.detours, k2)
				}
			}
		}
		dv = &detourView{d: d}
		a.detours[k] = dv
	}
	return dv
}

func isServerSide(e mptcppm.Event) bool {
	// Newer kernels flag it in flags (MPTCP_PM_EV_FLAG_SERVER_SIDE), older
	// ones in the server_side attribute.
	return e.ServerSide != 0 || e.Flags&2 != 0
}

func conn(e mptcppm.Event) policy.Conn {
	// An AF_INET6 socket's events carry IPv6 or IPv4-mapped addresses
	// (family 10); only such a socket takes subflows of the other family.
	return policy.Conn{Token: e.Token, Local: unmap(e.Local), Remote: unmap(e.Remote), Inet6: e.Family == afInet6 || e.Local.Addr().Is6()}
}

const afInet6 = 10 // AF_INET6

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func subflow(e mptcppm.Event) policy.Subflow {
	return policy.Subflow{Token: e.Token, LocalID: e.LocalID, RemoteID: e.RemoteID,
		Local: unmap(e.Local), Remote: unmap(e.Remote), Backup: e.Backup != 0, Errno: e.Error}
}

// handle applies one event to the view and asks the policy what to do.
func (a *Agent) handle(e mptcppm.Event, at time.Time) []job {
	a.stats.events.Add(1)
	a.log.Debug("event", "event", e.String())
	var ins []policy.Intent
	var since time.Time
	switch e.Type {
	case mptcppm.EventCreated, mptcppm.EventEstablished:
		if isServerSide(e) {
			return nil
		}
		cv := a.conns[e.Token]
		if cv == nil {
			if len(a.conns) >= a.cfg.MaxConnections || IsProbe(a.cfg.Probes, e.Local) {
				return nil
			}
			c := conn(e)
			cv = &connView{c: c, selected: policy.Selected(a.cfg.Selectors, c.Remote), since: at, subs: map[subKey]*subView{}}
			a.conns[e.Token] = cv
		}
		est := e.Type == mptcppm.EventEstablished
		cv.established = cv.established || est
		if est {
			c := conn(e)
			// The event comes once the connection is fully established;
			// flags bit 0 is the server's C flag.
			c.Fully, c.DenyJoinInitial = true, e.Flags&mptcppm.EventFlagDenyJoinID0 != 0
			ins, since = a.pol.Established(c), at
		} else {
			ins = a.pol.Created(conn(e))
		}
	case mptcppm.EventClosed:
		cv := a.conns[e.Token]
		if cv != nil {
			for _, sv := range cv.subs {
				if sv.detour != nil && sv.up {
					a.detourView(*sv.detour).up--
				}
			}
			delete(a.conns, e.Token)
		}
		if cv != nil {
			ins = a.pol.Closed(e.Token)
		}
	case mptcppm.EventAnnounced:
		if a.tracked(e.Token) {
			ins = a.pol.Announced(e.Token, e.RemoteID, unmap(e.Remote))
		}
	case mptcppm.EventRemoved:
		if a.tracked(e.Token) {
			ins = a.pol.Removed(e.Token, e.RemoteID)
		}
	case mptcppm.EventSubEstablished:
		sf := subflow(e)
		if !a.subUp(sf) {
			return nil
		}
		ins = a.pol.SubflowEstablished(sf)
	case mptcppm.EventSubClosed:
		sf := subflow(e)
		ask := a.shortJoinAmid(sf)
		if !a.subDown(sf) {
			return nil
		}
		if ask {
			sf.ConnClosing = a.connClosing(sf.Token)
		}
		ins = a.pol.SubflowClosed(sf)
	case mptcppm.EventSubPriority:
		sf := subflow(e)
		if cv := a.conns[e.Token]; cv != nil {
			if sv := cv.subs[keyOf(sf.Local.Addr(), sf.Remote)]; sv != nil {
				sv.sf.Backup = sf.Backup
			}
		}
		ins = a.pol.Priority(sf)
	}
	switch e.Type {
	case mptcppm.EventCreated, mptcppm.EventEstablished, mptcppm.EventSubEstablished, mptcppm.EventSubClosed, mptcppm.EventClosed:
		a.reportPairs(e.Token)
	}
	return a.jobsFor(ins, since)
}

// reportPairs tells OnSubflows the address pairs of the connection's
// established subflows: the initial subflow's while the connection is
// tracked (it goes with the connection: a SUB_CLOSED on that pair may be
// a failed redial of the default path), then each established join's;
// nil when the connection is not tracked. A connection outside the
// selectors is never reported: it is not managed.
func (a *Agent) reportPairs(token uint32) {
	if a.cfg.OnSubflows == nil {
		return
	}
	cv := a.conns[token]
	if cv == nil {
		a.cfg.OnSubflows(token, nil)
		return
	}
	if !cv.selected {
		return
	}
	pairs := []SubflowPair{{Local: cv.c.Local, Remote: cv.c.Remote}}
	for _, sv := range cv.subs {
		if sv.up {
			pairs = append(pairs, SubflowPair{Local: sv.sf.Local, Remote: sv.sf.Remote})
		}
	}
	a.cfg.OnSubflows(token, pairs)
}

func (a *Agent) tracked(token uint32) bool {
	return a.conns[token] != nil
}

// subUp records an established subflow; false if its connection is not ours.
func (a *Agent) subUp(sf policy.Subflow) bool {
	cv := a.conns[sf.Token]
	if cv == nil {
		return false
	}
	k := keyOf(sf.Local.Addr(), sf.Remote)
	if k == keyOf(cv.c.Local.Addr(), cv.c.Remote) {
		return true // a redial of the default path: the policy reports it
	}
	sv := cv.subs[k]
	if sv == nil {
		sv = &subView{path: "other"}
		if d, ok := a.match(cv.c.Remote, sf); ok {
			sv.detour, sv.path = &d, pathName(&d, "")
		}
		cv.subs[k] = sv
	}
	if !sv.up && sv.detour != nil {
		dv := a.detourView(*sv.detour)
		dv.up++
		dv.established++
		dv.lastChange = time.Now()
	}
	// A join asked for with the B flag is a backup although the kernel's
	// SUB_ESTABLISHED says backup=0 (6.18; mptcppm's backup join test).
	sf.Backup = sf.Backup || !sv.up && sv.sf.Backup
	sv.sf, sv.up, sv.since = sf, true, time.Now()
	return true
}

func (a *Agent) subDown(sf policy.Subflow) bool {
	cv := a.conns[sf.Token]
	if cv == nil {
		return false
	}
	k := keyOf(sf.Local.Addr(), sf.Remote)
	if k == keyOf(cv.c.Local.Addr(), cv.c.Remote) {
		return true // the default path's subflow or a redial of it
	}
	if sv := cv.subs[k]; sv != nil {
		if sv.detour != nil {
			dv := a.detourView(*sv.detour)
			if sv.up {
				dv.up--
			}
			if !sv.up || sf.Errno != 0 {
				dv.failed++
				dv.lastErr = fmt.Sprintf("subflow closed: errno %d", sf.Errno)
			}
			if sf.Errno == uint8(unix.ECONNREFUSED) {
				a.refused(cv.c.Remote, *sv.detour)
			}
			dv.lastChange = time.Now()
		}
		delete(cv.subs, k)
	}
	return true
}

// shortJoinAmid says whether sf is a join closing within
// policy.DefaultMinLifetime of coming up while another extra subflow of
// its connection lives: a reset the policy would take for the server's
// join limit. Only for such a close the agent asks the kernel whether
// the connection is closing (one inet_diag lookup, not one per close).
func (a *Agent) shortJoinAmid(sf policy.Subflow) bool {
	cv := a.conns[sf.Token]
	if cv == nil {
		return false
	}
	k := keyOf(sf.Local.Addr(), sf.Remote)
	sv := cv.subs[k]
	if sv == nil || !sv.up || time.Since(sv.since) >= policy.DefaultMinLifetime {
		return false
	}
	for ok, o := range cv.subs {
		if ok != k && o.up {
			return true
		}
	}
	return false
}

// connClosing says whether the connection's MPTCP socket is no longer
// ESTABLISHED (or gone). A server resets a join to a connection it is
// closing with the same reason as a join beyond its limit; the client's
// own socket state tells them apart: after the server's DATA_FIN it is
// CLOSE_WAIT or later. An inet_diag failure answers false (the policy
// then judges as before) and is logged.
func (a *Agent) connClosing(token uint32) bool {
	st, found, err := a.k.ConnState(token)
	if err != nil {
		a.log.Warn("connection state unknown", "token", fmt.Sprintf("%08x", token), "err", err)
		return false
	}
	return !found || st != 1 /* ESTABLISHED */
}

// refused tells the sources that a subflow through d toward server was
// refused (detour.Refuser): a relay restarted without its state has closed
// the granted port, and its source asks for a new grant at once instead of
// at the next renewal.
func (a *Agent) refused(server netip.AddrPort, d detour.Detour) {
	for _, s := range a.sources {
		if r, ok := s.(detour.Refuser); ok {
			r.Refused(server, d)
		}
	}
}

func (a *Agent) match(server netip.AddrPort, sf policy.Subflow) (detour.Detour, bool) {
	var ds []detour.Detour
	for _, s := range a.sources {
		ds = append(ds, s.Detours(server)...)
	}
	return policy.Match(ds, sf.Local.Addr(), sf.Remote)
}

// resync rebuilds the view from inet_diag: adopts connections we do not
// know, forgets those gone, and reconciles subflows (at start and after the
// kernel dropped events).
func (a *Agent) resync(reason string) []job {
	a.stats.resyncs.Add(1)
	conns, err := a.k.Connections()
	if err != nil {
		a.log.Error("resync: inet_diag dump failed", "reason", reason, "err", err)
		return nil
	}
	now := time.Now()
	var ins []policy.Intent
	seen := map[uint32]bool{}
	adopted := 0
	for _, mc := range conns {
		if mc.ServerSide || mc.State != 1 /* ESTABLISHED */ || mc.Token == 0 || mc.Info.Flags&mptcppm.InfoFlagFallback != 0 {
			continue
		}
		seen[mc.Token] = true
		c := policy.Conn{Token: mc.Token, Local: unmap(mc.Local), Remote: unmap(mc.Remote), Inet6: mc.Inet6 || mc.Local.Addr().Is6()}
		var live []policy.Subflow
		for _, s := range mc.Subflows {
			live = append(live, policy.Subflow{Token: mc.Token, LocalID: s.LocalID, RemoteID: s.RemoteID,
				Local: unmap(s.Local), Remote: unmap(s.Remote), Backup: s.Backup()})
		}
		if !a.tracked(mc.Token) {
			if len(a.conns) >= a.cfg.MaxConnections || IsProbe(a.cfg.Probes, mc.Local) {
				continue
			}
			a.conns[mc.Token] = &connView{c: c, selected: policy.Selected(a.cfg.Selectors, c.Remote), established: true, adopted: true, since: now, subs: map[subKey]*subView{}}
			for _, sf := range live {
				if keyOf(sf.Local.Addr(), sf.Remote) != keyOf(c.Local.Addr(), c.Remote) {
					a.subUp(sf)
				}
			}
			adopted++
			a.stats.adopted.Add(1)
			ins = append(ins, a.pol.Adopt(c, live)...)
			continue
		}
		// Known connection: replay what the lost events would have said.
		liveKeys := map[subKey]policy.Subflow{}
		for _, sf := range live {
			liveKeys[keyOf(sf.Local.Addr(), sf.Remote)] = sf
		}
		cv := a.conns[mc.Token]
		wasEst := cv.established
		cv.established = true
		var gone []policy.Subflow
		for k, sv := range cv.subs {
			// A subflow asked for more than a second ago that the kernel no
			// longer lists (not even in SYN_SENT) failed; its event was lost.
			if _, ok := liveKeys[k]; !ok && (sv.up || now.Sub(sv.since) > time.Second) {
				gone = append(gone, sv.sf)
			}
		}
		var fresh []policy.Subflow
		for k, sf := range liveKeys {
			if sv := cv.subs[k]; (sv == nil || !sv.up) && k != keyOf(c.Local.Addr(), c.Remote) {
				fresh = append(fresh, sf)
			}
		}
		if !wasEst {
			ins = append(ins, a.pol.Established(c)...)
		}
		for _, sf := range gone {
			a.subDown(sf)
			ins = append(ins, a.pol.SubflowClosed(sf)...)
		}
		for _, sf := range fresh {
			a.subUp(sf)
			ins = append(ins, a.pol.SubflowEstablished(sf)...)
		}
	}
	for tok := range seen {
		if a.tracked(tok) {
			a.reportPairs(tok) // adopted or reconciled
		}
	}
	var closed []uint32
	for tok, cv := range a.conns {
		// Connections still in the handshake are not in ESTABLISHED yet.
		if !seen[tok] && cv.established {
			closed = append(closed, tok)
		}
	}
	var extra []job
	for _, tok := range closed {
		extra = append(extra, a.handle(mptcppm.Event{Type: mptcppm.EventClosed, Token: tok}, now)...)
	}
	if adopted > 0 || len(closed) > 0 || reason != "start" {
		a.log.Info("resynchronised", "reason", reason, "adopted", adopted, "forgotten", len(closed), "connections", len(seen))
	}
	return append(a.jobsFor(ins, time.Time{}), extra...)
}
