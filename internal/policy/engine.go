package policy

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Config configures an Engine and its strategy; zero fields take the defaults in brackets.
type Config struct {
	Mode Mode // [Static]
	// Subflows is how many detour subflows each selected connection keeps
	// besides its initial one (0 = default 2, negative = none).
	Subflows int
	// Announced caps subflows opened toward addresses the server announced,
	// per connection (default 2, like the in-kernel PM's add_addr_accepted
	// once raised). Negative disables them.
	Announced int
	Selectors []Selector
	// MaxConns bounds tracked connections (default 65536); beyond it new
	// connections are left alone so memory stays bounded.
	MaxConns int
	// Backoff is the first wait before a failed detour is tried again,
	// doubling per consecutive failure up to MaxBackoff (1s, 60s). The same
	// backoff, with jitter, holds a connection whose subflows keep being
	// refused (a server at its subflow limit).
	Backoff, MaxBackoff time.Duration
	// ConnectTimeout: a detour subflow still not established after this
	// (its SYN black-holed) stops counting and its detour is backed off, so
	// another detour is tried without waiting minutes for the kernel's SYN
	// retries to give up (default 3s).
	ConnectTimeout time.Duration
	// MinLifetime: a subflow closed sooner after it came up was refused
	// (e.g. the server's subflow limit), not closed cleanly [2s].
	MinLifetime time.Duration
	// StallRetransmits (static): consecutive retransmission timeouts that
	// mark a detour subflow stalled [3].
	StallRetransmits int
	// Watchdog (adaptive): the floor of the no-progress time that declares
	// a path dead; the limit is max(3 x RTT, Watchdog) [200ms].
	Watchdog time.Duration
	// Window (adaptive): how long the connection is measured with and
	// without a subflow before deciding [2s].
	Window time.Duration
	// Hold (adaptive): how long a decision stands before it is tested
	// again (a path set aside is given another chance) [30s].
	Hold time.Duration
	// HarmLoss and HarmRTT (adaptive): a subflow retransmitting more than
	// HarmLoss of its segments [2%], or whose RTT exceeds HarmRTT times
	// the best path's plus 20 ms [3], is tested first.
	HarmLoss float64
	HarmRTT  float64
	// RcvBuf (backup-first): the receive buffer, in bytes, that data
	// arriving out of order while a slower path's segment is in flight
	// must fit (BLEST's condition) [6 MiB, the kernel's tcp_rmem[2]].
	RcvBuf int64
	// GuardShare and GuardWindow (guard): a subflow slower than the
	// connection's main carrier that delivers below GuardShare of the
	// connection's bytes over GuardWindow (at most MaxGuardWindow) is
	// destroyed [0.25, 1s]; only while the subflow delivering the most
	// starves: its share of probes limited by its congestion window or
	// pacing is below GuardStarve [0.5; 1 or more: the condition is off,
	// the rule before it].
	GuardShare  float64
	GuardWindow time.Duration
	GuardStarve float64
	// GuardRTT (guard): the shed subflow's base RTT must exceed GuardRTT
	// x that of the subflow delivering the most [1.25; negative: no RTT
	// condition, so that a tiny path slow from loss, not from length, is
	// judged too (docs/results/design/tinypath-fresh)].
	GuardRTT float64
	// GuardOutage (guard): a subflow seen with GuardOutage consecutive
	// retransmission timeouts is in an outage, not slow: it is not judged
	// until two of its judging windows after (the kernel and the stall
	// check handle outages; a path back from one delivers again) [1;
	// negative: judged anyway, the rule before it].
	GuardOutage int
	// SharedBottleneck (static): two subflows whose queueing delays say
	// they share a bottleneck keep only the faster one carrying data for
	// Hold (shared_rule.go); SharedWindow is how long they are compared
	// [DefaultSharedWindow (3s), MinSharedWindow-MaxSharedWindow].
	SharedBottleneck bool
	SharedWindow     time.Duration
	// OtherFamily is the configured mapping from a server address to its
	// addresses of the other family (IPv4 -> IPv6 or back): cross-family
	// detour candidates for connections whose socket takes them
	// (crossfamily.go). The server's own ADD_ADDR of the other family is
	// used without it.
	OtherFamily map[netip.Addr][]netip.Addr
	// SourceFor returns the client's own address toward dst (a route
	// lookup): the source of a NAT detour subflow of the other family than
	// the connection's. nil: no cross-family NAT detours (tunnel detours
	// carry their own source).
	SourceFor func(dst netip.Addr) (netip.Addr, error)
	// Now is the clock and Rand the jitter source (tests).
	Now  func() time.Time
	Rand func() float64
	Log  *slog.Logger
}

// Engine is the path manager's policy: the state and mechanisms every
// strategy shares (strategy.go), driven by the strategy Config.Mode names.
// It implements Policy and is driven from one goroutine.
type Engine struct {
	cfg     Config
	strat   strategy
	sources []detour.Source
	conns   map[uint32]*kconn
	health  map[string]*health
	servers map[netip.AddrPort]int // connections per server, for Release
	// avoid remembers detours evicted for a server (they added nothing).
	avoid map[string]time.Time
	// caps: servers that reset joins beyond a number of extra subflows
	// (their `ip mptcp limits`), learned from the resets, until a time.
	caps map[netip.AddrPort]serverCap
	// localIDs gives each extra local address (tunnel detours) one MPTCP
	// address id for all connections: the kernel refuses an address
	// under two ids within a connection.
	localIDs map[netip.Addr]uint8
	nextID   int
	wake     wakeHeap
	// Untracked counts connections ignored because MaxConns was reached.
	Untracked uint64
}

type kconn struct {
	c           Conn
	selected    bool
	established bool
	subs        map[subKey]*ksub
	announced   map[uint8]netip.AddrPort
	pollWait    time.Duration // retry interval while no detour is available
	retryAt     time.Time
	pollUntil   time.Time
	notConn     int // rounds of SUBFLOW_CREATE retried after ENOTCONN
	// fullyAt: when the ESTABLISHED event (Conn.Fully) was handled. A
	// create issued before it may be refused with ENOTCONN although the
	// event was handled by the time the answer came.
	fullyAt time.Time
	// notFully: finished only because SUBFLOW_CREATE kept getting ENOTCONN
	// before the ESTABLISHED event: that event undoes the finish.
	notFully bool
	// finished says why no subflow is opened for the connection any more
	// (the kernel refused in a way that is final for it); "" while open.
	finished string
	// budget is how many more SUBFLOW_CREATE the connection may issue
	// before it is held (createBudget); set on its first fill.
	budget    float64
	budgetAt  time.Time
	budgetSet bool
	// lostAt: when one of its joined subflows last ended otherwise than
	// by a clean close (destroyed by us, reset, timed out). The server
	// may still hold such a subflow (a destroy over a black-holed path
	// never reaches it), so a join it resets afterwards says nothing
	// about its limit.
	lostAt time.Time

	// Refusals: consecutive ones hold the connection (no new subflow)
	// until holdUntil; each reason is logged once.
	fails     int
	holdUntil time.Time
	refusals  map[string]int
	decision  string

	// Measurements: delivered bytes (both directions, all subflows)
	// sampled over time, for rates with and without a subflow.
	delivered uint64
	hist      []sample
	lastRecv  time.Time       // when any subflow last received data
	tried     map[string]bool // detours used by this connection so far
	// alts: the server's addresses of the other family this connection's
	// detours may lead to; cross describes them (or why none) for status;
	// crossNoted: the reason for no cross-family detour was logged.
	alts       []altServer
	cross      string
	crossNoted bool
	// refusedAt: when a join of this connection through a detour (by
	// Key) was refused in its handshake (a reset answered the SYN:
	// ECONNREFUSED). Such a join is not tried again through that detour
	// for MaxBackoff: see joinRefusedFor.
	refusedAt map[string]time.Time
	// st is the strategy's own state for the connection (nil until it
	// keeps any; dropped with the connection).
	st any
	// sbd is the shared-bottleneck rule's state (shared_rule.go).
	sbd *sbdConn
}

type sample struct {
	at        time.Time
	delivered uint64
}

// subKey leaves the local port out: it is unknown until the SYN goes out.
// redial tells apart a second subflow on the default path (same
// addresses, another local port): see redial in measure.go.
type subKey struct {
	local  netip.Addr
	remote netip.AddrPort
	redial bool
}

type ksub struct {
	d       *detour.Detour
	initial bool // the connection's first subflow (default path)
	up      bool
	upSince time.Time
	created time.Time
	stale   bool // connect timeout passed or closed by us; no longer counted
	port    uint16
	localID uint8
	backup  bool

	role     Role
	decision string
	// Measurements (Measured).
	seen         bool
	probedAt     time.Time // the last probe that measured it
	sampledAt    time.Time
	m            Measurement
	lastProgress time.Time
	// lastAcked: when data it sent was last acked (the kernel updates a
	// subflow's smoothed RTT only then, not while it only receives).
	lastAcked  time.Time
	rtt        time.Duration
	minRTT     time.Duration // the kernel's minimum RTT: the path's base delay, without queueing
	rate, loss float64
	// sendLimited: the smoothed share of probes at which the subflow was
	// limited by its congestion window or pacing (not by the application:
	// its window full, or bytes waiting that it could not send yet);
	// recvBusy: the smoothed share of probe intervals in which it received
	// data. Backup-first reads both as "this path is full".
	sendLimited, recvBusy float64
	recvd                 bool // has ever received data
	dead                  bool // the watchdog declared it dead (initial/announced: set backup)
	// retryAt is when a dead default or announced path is given another
	// chance as active (a backup subflow carries nothing new, so it cannot
	// show by itself that its path came back); retryGap doubles per failed
	// retry, from 1 s up to Hold.
	retryAt   time.Time
	retryGap  time.Duration
	keepUntil time.Time // proven useful (or set aside): not tested again before
	setAside  bool      // we marked it backup (not the configuration)
	promoted  bool      // a backup made active because no active path worked
	retrying  bool      // a dead path made active again to see if it is back
	proven    bool      // delivered after MinLifetime: its detour is healthy
	redial    bool      // a fresh subflow on the default path replacing a dead one
	evicted   *eviction // a rule destroyed it (evict); nil once the destroy was refused
	attempts  int       // redial: SYNs outstanding (attempts not up, not closed)
}

// positive sets *p to def unless it is positive already.
func positive[T int | int64 | float64 | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

// newEngine applies the defaults; New adds the strategy.
func newEngine(cfg Config, sources []detour.Source) *Engine {
	if cfg.Subflows == 0 {
		cfg.Subflows = 2
	} else if cfg.Subflows < 0 {
		cfg.Subflows = 0
	}
	if cfg.Announced == 0 {
		cfg.Announced = 2
	}
	positive(&cfg.MaxConns, 65536)
	positive(&cfg.Backoff, time.Second)
	if cfg.MaxBackoff < cfg.Backoff {
		cfg.MaxBackoff = 60 * time.Second
	}
	positive(&cfg.ConnectTimeout, 3*time.Second)
	positive(&cfg.MinLifetime, DefaultMinLifetime)
	positive(&cfg.StallRetransmits, 3)
	positive(&cfg.Watchdog, 200*time.Millisecond)
	positive(&cfg.Window, 2*time.Second)
	positive(&cfg.Hold, 30*time.Second)
	positive(&cfg.HarmLoss, 0.02)
	positive(&cfg.HarmRTT, 3)
	positive(&cfg.RcvBuf, 6<<20)
	positive(&cfg.GuardShare, defaultGuardShare)
	positive(&cfg.GuardWindow, defaultGuardWindow)
	positive(&cfg.GuardStarve, defaultGuardStarve)
	if cfg.GuardRTT == 0 {
		cfg.GuardRTT = defaultGuardRTT
	}
	if cfg.GuardOutage == 0 {
		cfg.GuardOutage = defaultGuardOutage
	}
	positive(&cfg.SharedWindow, DefaultSharedWindow)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Engine{cfg: cfg, sources: sources, conns: map[uint32]*kconn{},
		health: map[string]*health{}, servers: map[netip.AddrPort]int{}, avoid: map[string]time.Time{}, caps: map[netip.AddrPort]serverCap{},
		localIDs: map[netip.Addr]uint8{}, nextID: 1}
}

func key(local netip.Addr, remote netip.AddrPort) subKey {
	return subKey{local: local.Unmap(), remote: unmapAP(remote)}
}

func (p *Engine) track(c Conn) *kconn {
	if k := p.conns[c.Token]; k != nil {
		return k
	}
	if len(p.conns) >= p.cfg.MaxConns {
		p.Untracked++
		return nil
	}
	c.Local, c.Remote = unmapAP(c.Local), unmapAP(c.Remote)
	k := &kconn{c: c, selected: Selected(p.cfg.Selectors, c.Remote), subs: map[subKey]*ksub{}}
	p.conns[c.Token] = k
	if k.selected {
		p.servers[c.Remote]++
		for _, a := range p.mapped(c.Remote) {
			p.addAlt(k, a, "mapping", false)
		}
	}
	return k
}

func (p *Engine) Created(c Conn) []Intent {
	k := p.track(c)
	if k != nil && k.selected {
		p.prepare(k)
	}
	return nil
}

func (p *Engine) Established(c Conn) []Intent {
	k := p.track(c)
	if k == nil {
		return nil
	}
	k.established = true
	k.c.Fully = k.c.Fully || c.Fully
	if k.c.Fully && k.fullyAt.IsZero() {
		k.fullyAt = p.cfg.Now()
	}
	if k.c.Fully && k.notFully {
		// The connection took longer than the ENOTCONN retries to become
		// fully established (a loaded host, a slow first data ack): it is
		// now, so its detours are opened after all.
		k.finished, k.notFully, k.notConn, k.decision = "", false, 0, ""
	}
	k.c.DenyJoinInitial = k.c.DenyJoinInitial || c.DenyJoinInitial
	p.trackInitial(k)
	out := p.fill(k)
	for id, a := range k.announced {
		out = append(out, p.announcedSubflow(k, id, a)...)
	}
	return out
}

// prepare asks the sources for detours toward the server and its
// other-family addresses.
func (p *Engine) prepare(k *kconn) {
	for _, a := range append([]netip.AddrPort{k.c.Remote}, altAddrs(k)...) {
		for _, s := range p.sources {
			s.Prepare(a)
		}
	}
}

// trackInitial records the connection's first subflow (the default path),
// which the adaptive policy measures like any other.
func (p *Engine) trackInitial(k *kconn) {
	sk := key(k.c.Local.Addr(), k.c.Remote)
	if k.subs[sk] == nil {
		now := p.cfg.Now()
		k.subs[sk] = &ksub{initial: true, up: true, upSince: now, created: now, port: k.c.Local.Port(), role: RoleActive}
	}
}

func (p *Engine) Closed(token uint32) []Intent {
	k := p.conns[token]
	if k == nil {
		return nil
	}
	delete(p.conns, token)
	if k.selected {
		for _, s := range append([]netip.AddrPort{k.c.Remote}, altAddrs(k)...) {
			if p.servers[s]--; p.servers[s] <= 0 {
				delete(p.servers, s)
				p.release(s)
			}
		}
	}
	return nil
}

// release lets grant-holding sources give up what no connection uses.
func (p *Engine) release(server netip.AddrPort) {
	for _, s := range p.sources {
		if r, ok := s.(detour.Releaser); ok {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := r.Release(ctx, server); err != nil {
					p.cfg.Log.Debug("release detours", "server", server, "err", err)
				}
			}()
		}
	}
}

func (p *Engine) Announced(token uint32, id uint8, addr netip.AddrPort) []Intent {
	// With announced subflows off (Announced < 0, the default) the server's
	// announcements are not acted on at all, the other family's included:
	// an on-path party that saw the handshake's keys can forge one
	// (docs/security.md), and a cross-family target would make the agent
	// ask relays for grants toward the address it names.
	k := p.conns[token]
	if k == nil || p.cfg.Announced < 0 {
		return nil
	}
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), k.c.Remote.Port())
	}
	addr = unmapAP(addr)
	if k.announced == nil {
		k.announced = map[uint8]netip.AddrPort{}
	}
	if len(k.announced) >= 8 { // bounded whatever the server sends
		return nil
	}
	old, had := k.announced[id]
	k.announced[id] = addr
	if had && old != addr {
		p.dropAlt(k, old) // the id now names another address
	}
	// An address of the other family: detours may lead there too (the
	// server says it reaches this connection's listener).
	added := !sameFamily(addr.Addr(), k.c.Remote.Addr()) && p.addAlt(k, addr, "ADD_ADDR", true)
	if !k.established {
		return nil
	}
	out := p.announcedSubflow(k, id, addr)
	if added {
		out = append(out, p.fill(k)...)
	}
	return out
}

func (p *Engine) announcedSubflow(k *kconn, id uint8, addr netip.AddrPort) []Intent {
	a := addr.Addr()
	if a == k.c.Remote.Addr() && addr.Port() == k.c.Remote.Port() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
		return nil
	}
	n := 0
	for _, s := range k.subs {
		if s.d == nil && !s.initial {
			n++
		}
	}
	local := k.c.Local.Addr()
	if !sameFamily(a, local) {
		// The kernel refuses a subflow whose ends differ in family: leave
		// from the client's own address of the announced one's family,
		// on a socket that takes it.
		if ok, why := crossOK(k); !ok {
			p.noteCross(k, why, "announced", addr)
			return nil
		}
		if p.cfg.SourceFor == nil {
			return nil
		}
		src, err := p.cfg.SourceFor(a)
		if err != nil {
			p.noteCross(k, fmt.Sprintf("no %s source address toward %s: %v", FamilyName(a), a, err))
			return nil
		}
		local = src.Unmap()
	}
	sk := key(local, addr)
	if n >= p.cfg.Announced || k.subs[sk] != nil {
		return nil
	}
	k.subs[sk] = &ksub{created: p.cfg.Now(), role: RoleConnecting}
	return []Intent{{Action: CreateSubflow, Token: k.c.Token, LocalID: p.localID(k, local), Local: netip.AddrPortFrom(local, 0), Remote: addr, RemoteID: id}}
}

func (p *Engine) Removed(token uint32, id uint8) []Intent {
	// The kernel closes the subflows to a removed address itself.
	k := p.conns[token]
	if k == nil {
		return nil
	}
	addr, ok := k.announced[id]
	delete(k.announced, id)
	if ok {
		p.dropAlt(k, addr)
	}
	return nil
}

func (p *Engine) SubflowEstablished(sf Subflow) []Intent {
	k, sk, s := p.lookup(sf)
	if k == nil {
		return nil
	}
	if s != nil && s.stale && !s.up && s.role == RoleEvicted {
		// Evicted while its SYN was in flight (e.g. its detour withdrawn by
		// Refresh): it must not come back as active and take the place of
		// a replacement.
		return []Intent{{Action: DestroySubflow, Token: sf.Token, LocalID: sf.LocalID, Local: sf.Local, Remote: sf.Remote, Detour: s.d}}
	}
	if s != nil && s.redial && s.up && !s.stale && s.port != sf.Local.Port() {
		// An older redial attempt whose SYN got through after all: one
		// fresh subflow on the default path is enough.
		return []Intent{{Action: DestroySubflow, Token: sf.Token, LocalID: sf.LocalID, Local: sf.Local, Remote: sf.Remote}}
	}
	if s == nil && sk.redial {
		// A second subflow on the default path with no record (an attempt
		// given up on, or opened before a restart): tracked as the
		// redial, which then replaces the old subflow or is closed.
		s = &ksub{redial: true, created: p.cfg.Now()}
		k.subs[sk] = s
	}
	if s == nil {
		// Not ours (opened before a restart, or by someone else): account
		// for it if it runs through a known detour.
		s = &ksub{created: p.cfg.Now()}
		if d, ok := Match(p.detours(k.c.Remote), sf.Local.Addr(), sf.Remote); ok {
			s.d = &d
		}
		k.subs[sk] = s
	}
	if s.redial && !s.up {
		s.attempts-- // this attempt is up; older ones may still come
	}
	// A join the policy opened with the B flag is a backup whatever the
	// event says: the 6.18 kernel reports backup=0 in SUB_ESTABLISHED for
	// a subflow created with the backup address flag, and does not send
	// on it (lab, brennan2017 core-limited: 0 bytes on it over 10 s).
	requested := !s.up && s.backup && s.d != nil
	s.up, s.stale, s.upSince, s.port, s.backup, s.localID = true, false, p.cfg.Now(), sf.Local.Port(), sf.Backup || requested, sf.LocalID
	s.role = RoleActive
	if s.backup {
		s.role = RoleBackup
	}
	s.seen = false
	// Learn ids the kernel already uses (subflows from before a restart).
	if a := sf.Local.Addr().Unmap(); sf.LocalID != 0 && a != k.c.Local.Addr() {
		if _, ok := p.localIDs[a]; !ok {
			p.localIDs[a] = sf.LocalID
		}
	}
	return nil
}

// lookup finds a subflow's connection and its record (nil when unknown).
func (p *Engine) lookup(sf Subflow) (*kconn, subKey, *ksub) {
	k := p.conns[sf.Token]
	if k == nil {
		return nil, key(sf.Local.Addr(), sf.Remote), nil
	}
	sk, s := k.find(sf.Local, sf.Remote)
	return k, sk, s
}

// find is the record of the subflow local -> remote. Subflows are keyed by
// addresses; the one exception is a second subflow on the default path
// (same addresses as the initial subflow, another local port): the redial.
func (k *kconn) find(local, remote netip.AddrPort) (subKey, *ksub) {
	sk := key(local.Addr(), remote)
	s := k.subs[sk]
	rk := sk
	rk.redial = true
	switch {
	case s != nil && s.initial && s.port != 0 && local.Port() != 0 && local.Port() != s.port:
		return rk, k.subs[rk]
	case s == nil && k.subs[rk] != nil:
		return rk, k.subs[rk] // the old default subflow is gone, its redial not yet promoted
	}
	return sk, s
}

func (p *Engine) detours(server netip.AddrPort) []detour.Detour {
	var ds []detour.Detour
	for _, src := range p.sources {
		ds = append(ds, src.Detours(server)...)
	}
	return ds
}

func (p *Engine) SubflowClosed(sf Subflow) []Intent {
	k, sk, s := p.lookup(sf)
	if s == nil {
		return nil
	}
	now := p.cfg.Now()
	if s.initial {
		if s.port != 0 && sf.Local.Port() != 0 && sf.Local.Port() != s.port {
			return nil // another subflow on the default path's addresses
		}
		// The default path's subflow is gone; the connection lives on
		// through the others. Nothing to reopen on a path we do not choose.
		delete(k.subs, sk)
		return nil
	}
	if s.redial {
		switch {
		case s.up && sf.Local.Port() != s.port:
			return nil // an older attempt, not the tracked redial
		case !s.up:
			// One of the attempts in SYN_SENT ended; the record stays
			// while others are outstanding.
			if s.attempts--; s.attempts > 0 {
				return nil
			}
		}
		delete(k.subs, sk)
		if !s.stale && s.up && sf.Errno != 0 {
			p.refused(k, closeReason(sf.Errno, true, false, p.cfg.MinLifetime), true)
		}
		return nil
	}
	delete(k.subs, sk)
	p.strat.gone(k, sk)
	// A subflow that never came up, died with an error or was closed soon
	// after it came up (the server refusing more subflows resets the join)
	// was refused; a clean close of a subflow that lived is not a failure.
	short := s.up && now.Sub(s.upSince) < p.cfg.MinLifetime
	if short && !s.stale && s.d != nil {
		// A join reset right after it came up while others of this
		// connection live: the server's limit of extra subflows (`ip mptcp
		// limits`, 2 by default), not the detour. Learn it, ask no more;
		// unless this connection lost a joined subflow before, which the
		// server may still count (after a 4 s detour black-hole
		// or a relay restart the agent learned "extra_subflows=1 for 5m"
		// and the next connection got no NAT detour). Then the reset is
		// held against this connection only, and no detour is blamed.
		// Nor when the connection was closing (not ESTABLISHED at the
		// MPTCP level): the server resets joins to a connection it is
		// closing with the same reason as joins beyond its limit; under
		// churn the agent learned 1-5 wrong limits per run (12,000
		// connections in 80 s) toward a server that closed first.
		// A closing connection takes no join at all (the server refuses
		// every join while its socket is not ESTABLISHED, the client's
		// kernel answers SUBFLOW_CREATE with ENOTCONN): no retry, its
		// joins end here as after ENOTCONN.
		if n := k.joined(); n > 0 {
			if sf.ConnClosing {
				p.finish(k, "join reset right after it came up (the connection is closing)")
				return nil
			}
			if !k.lostAt.IsZero() {
				p.refused(k, "join reset right after it came up (the server may still hold a subflow this connection lost)", true)
				p.scheduleRetry(k, now, now.Add(p.cfg.Backoff), false)
				return nil
			}
			p.learnCap(k, n, now)
			return nil
		}
	}
	if s.up && (s.stale || sf.Errno != 0 || short) {
		k.lostAt = now
	}
	if !s.up && !s.stale && s.d != nil && sf.Errno == uint8(syscall.ECONNREFUSED) {
		if k.refusedAt == nil {
			k.refusedAt = map[string]time.Time{}
		}
		k.refusedAt[Key(*s.d)] = now
	}
	if !s.stale && (!s.up || sf.Errno != 0 || short) {
		reason := closeReason(sf.Errno, s.up, short, p.cfg.MinLifetime)
		if s.d != nil {
			p.penalise(*s.d, reason)
		}
		p.refused(k, reason, true)
	} else if s.up && !short {
		p.healthy(k, s)
	}
	if s.d == nil {
		return nil // announced addresses are not retried, as in the kernel PM
	}
	return p.fill(k)
}

func (p *Engine) Priority(sf Subflow) []Intent {
	if _, _, s := p.lookup(sf); s != nil {
		s.backup = sf.Backup
	}
	return nil
}

func (p *Engine) Failed(in Intent, err error) []Intent {
	k := p.conns[in.Token]
	if k == nil {
		return nil
	}
	if in.Action == DestroySubflow && (errors.Is(err, ErrConnectionGone) || errors.Is(err, syscall.ESRCH)) {
		// Gone already: the kernel found no such subflow (it closed before
		// the command; its SUB_CLOSED follows) or no such connection (its
		// CLOSED follows). The destroy stands: nothing was refused.
		return nil
	}
	if in.Action == DestroySubflow {
		return p.evictRefused(k, in, err)
	}
	if in.Action == SetBackup {
		sk, s := k.find(in.Local, in.Remote)
		if s == nil || s.stale || in.Local.Port() != 0 && s.port != 0 && in.Local.Port() != s.port {
			// The subflow closed meanwhile (e.g. a redialled default path
			// replaced it): nothing refused anything.
			return nil
		}
		// A kernel without set_flags for this subflow: the policy keeps
		// working without backup marks; say so once.
		s.decision = "could not change the backup flag: " + err.Error()
		s.setAside = false
		// The kernel kept the flag it had: status says so.
		s.backup = !in.Backup
		switch {
		case s.dead:
		case s.backup:
			s.role = RoleBackup
		default:
			s.role = RoleActive
		}
		p.sharedFlagsRefused(k, sk, in)
		p.refused(k, "set_flags: "+errnoName(err), true)
		return nil
	}
	if in.Action != CreateSubflow {
		return nil
	}
	sk := key(in.Local.Addr(), in.Remote)
	if s := k.subs[sk]; s != nil && s.initial {
		sk.redial = true // the create was a redial of the default path
		if r := k.subs[sk]; r != nil && !r.up {
			if r.attempts--; r.attempts > 0 {
				return nil
			}
		} else {
			return nil
		}
	}
	var issued time.Time // when the refused create was issued
	if s := k.subs[sk]; s != nil {
		issued = s.created
	}
	delete(k.subs, sk)
	if k.finished != "" {
		return nil
	}
	// The connection is gone (the kernel knows no such token): nothing to
	// retry, no one to blame. Its CLOSED event (or the agent's sweep)
	// forgets it; until then nothing is opened for it.
	if errors.Is(err, ErrConnectionGone) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EBADF) {
		p.finish(k, "the kernel no longer knows the connection ("+errnoName(err)+")")
		return nil
	}
	if errors.Is(err, syscall.ENOTCONN) {
		// A connection whose ESTABLISHED event came was fully established:
		// ENOTCONN now means it is closing (or fell back to TCP), which
		// is final. Measured under churn: 200 connections/s
		// made 19,074 creates, 8,001 refused with ENOTCONN or "invalid
		// token", one token retried 160 times.
		// Judged by the state when the create was issued, not now: an
		// adopted connection's ESTABLISHED event can be handled between
		// the create and the kernel's answer to it.
		if k.c.Fully && (issued.IsZero() || !issued.Before(k.fullyAt)) {
			p.finish(k, "subflow_create: ENOTCONN after the connection was established (closing, or fell back to TCP)")
			return nil
		}
		// Not fully established yet when the create was issued (adopted
		// from inet_diag before its first data ack): try again after 0.2,
		// 0.4, 0.8, 1.6 s, then give up.
		now := p.cfg.Now()
		if at := now.Add(200 * time.Millisecond << min(k.notConn, 4)); k.retryAt.IsZero() || !k.retryAt.After(now) {
			if k.notConn++; k.notConn > maxNotConnRounds {
				p.finish(k, fmt.Sprintf("subflow_create: ENOTCONN %d times (never fully established)", maxNotConnRounds))
				k.notFully = true
				return nil
			}
			k.retryAt = at
			heap.Push(&p.wake, wakeup{at: at, token: k.c.Token})
		}
		return nil
	}
	p.refused(k, "subflow_create: "+errnoName(err), true)
	if in.Detour == nil {
		return nil
	}
	if localShortage(err) {
		// This host ran short (ephemeral ports, memory): no detour's
		// fault. Backing the detour off would deny it to every other
		// connection; the refusal holds this one.
		return p.fill(k)
	}
	p.penalise(*in.Detour, "subflow_create: "+err.Error())
	return p.fill(k)
}

func (p *Engine) Adopt(c Conn, subflows []Subflow) []Intent {
	k := p.track(c)
	if k == nil {
		return nil
	}
	// Managed like a new connection: relays are asked for grants (after an
	// agent restart the old ones may be gone), fill polls until they come.
	if k.selected && !k.established {
		p.prepare(k)
	}
	k.established = true
	p.trackInitial(k)
	var onDefault []uint16
	for _, sf := range subflows {
		if key(sf.Local.Addr(), sf.Remote) == key(k.c.Local.Addr(), k.c.Remote) {
			onDefault = append(onDefault, sf.Local.Port())
		}
	}
	if b := k.subs[key(k.c.Local.Addr(), k.c.Remote)]; b != nil && len(onDefault) > 0 && !slices.Contains(onDefault, b.port) {
		// The initial subflow is gone: a redial (before a restart)
		// carries the default path now.
		b.port = onDefault[0]
	}
	for _, sf := range subflows {
		if key(sf.Local.Addr(), sf.Remote) == key(k.c.Local.Addr(), k.c.Remote) {
			continue // the initial subflow (or what replaced it)
		}
		p.SubflowEstablished(sf)
	}
	return p.fill(k)
}

// fill opens detour subflows until the connection has N of them.
func (p *Engine) fill(k *kconn) []Intent {
	if !k.selected || !k.established || k.finished != "" {
		return nil
	}
	if k.c.DenyJoinInitial {
		// Every detour leads to the server's initial address (NAT: the
		// relay DNATs to it; tunnel: straight to it), which the server
		// said it will not accept joins to (the C flag).
		if k.decision == "" {
			k.decision = "no detour: the server set the C flag (no joins to its initial address, where detours lead)"
		}
		return nil
	}
	now := p.cfg.Now()
	if now.Before(k.holdUntil) {
		return nil // a wakeup at holdUntil calls fill again
	}
	have := 0
	used := map[string]bool{}
	for _, s := range k.subs {
		if s.d != nil {
			if !s.stale && !s.d.Backup {
				have++
			}
			used[Key(*s.d)] = true
		}
	}
	var cands []detour.Detour
	var out []Intent
	var soonest time.Time
	seen := map[string]bool{}
	for _, d := range append(p.usable(k, k.c.Remote, p.detours(k.c.Remote)), p.crossCandidates(k)...) {
		dk := Key(d)
		if seen[dk] || used[dk] || !d.Expires.IsZero() && !d.Expires.After(now) {
			continue
		}
		seen[dk] = true
		if h := p.health[dk]; h != nil && h.until.After(now) {
			if soonest.IsZero() || h.until.Before(soonest) {
				soonest = h.until
			}
			continue
		}
		if until, ok := p.avoid[avoidKey(k.c.Remote, dk)]; ok {
			if until.After(now) {
				// Evicted for a while (by this connection or another to
				// the server): wake then, or a rejoin waits for nothing.
				if soonest.IsZero() || until.Before(soonest) {
					soonest = until
				}
				continue
			}
			delete(p.avoid, avoidKey(k.c.Remote, dk))
		}
		if at, ok := k.refusedAt[dk]; ok {
			if until := at.Add(joinRefusedFor(p.cfg)); until.After(now) {
				if soonest.IsZero() || until.Before(soonest) {
					soonest = until
				}
				continue
			}
			delete(k.refusedAt, dk)
		}
		if d.Backup {
			// Configured backups are opened besides the N (as backup).
			if !p.spend(k, now) {
				return out
			}
			out = append(out, p.open(k, d, now))
			continue
		}
		cands = append(cands, d)
	}
	limit := p.capFor(k.c.Remote, now)
	if have >= limit && len(out) == 0 {
		return nil
	}
	// Prefer detours with fewer recent failures, then (adaptive) ones this
	// connection has not tried; keep the sources' order otherwise.
	sort.SliceStable(cands, func(i, j int) bool {
		if fi, fj := p.fails(cands[i]), p.fails(cands[j]); fi != fj {
			return fi < fj
		}
		return p.strat.prefer(k, cands[i], cands[j])
	})
	for _, d := range cands {
		if have >= limit {
			break
		}
		if !p.spend(k, now) {
			return out // held: a wakeup at holdUntil fills it
		}
		local := d.Local
		if !local.IsValid() {
			local = k.c.Local.Addr()
		}
		if k.subs[key(local, d.Remote)] != nil {
			continue
		}
		have++
		out = append(out, p.open(k, d, now))
	}
	if have < limit {
		p.scheduleRetry(k, now, soonest, len(seen) == 0)
	}
	if len(out) > 0 {
		heap.Push(&p.wake, wakeup{at: now.Add(p.cfg.ConnectTimeout), token: k.c.Token, check: true})
	}
	return out
}

// joinRefusedFor is how long a connection whose join through a detour was
// refused in its handshake does not try that detour again (other
// connections follow the detour's own backoff). Each refused join costs a
// running connection more than the detour it could add: when the refused
// subflow closes, the kernel (net/mptcp, __mptcp_close_ssk ->
// __mptcp_retransmit_pending_data) re-sends the connection's whole
// unacknowledged data on its other subflows, a window's worth of duplicates
// (measured: a 0.46-0.58 s receive stall per retry on a 10 Mbit/s path,
// docs/results/join-redirect). A join refused once is likely refused again
// (a middlebox redirecting joins, a port closed); retrying it at the
// detour's 1, 2, 4 s backoff repeated the stall. MaxBackoff (60 s) bounds
// the cost to one stall a minute per detour and connection, and still
// lets a long connection get a detour back that recovered.
func joinRefusedFor(cfg Config) time.Duration { return cfg.MaxBackoff }

// open records a new subflow through d and returns the intent creating it.
func (p *Engine) open(k *kconn, d detour.Detour, now time.Time) Intent {
	local := d.Local
	if !local.IsValid() {
		local = k.c.Local.Addr()
	}
	backup := d.Backup || p.strat.joinAsBackup(k, d)
	k.subs[key(local, d.Remote)] = &ksub{d: &d, created: now, role: RoleConnecting, backup: backup}
	if k.tried == nil {
		k.tried = map[string]bool{}
	}
	k.tried[Key(d)] = true
	return Intent{Action: CreateSubflow, Token: k.c.Token, LocalID: p.localID(k, local),
		Local: netip.AddrPortFrom(local, 0), Remote: unmapAP(d.Remote), Backup: backup, Detour: &d}
}

// localID is 0 for the connection's own address (the kernel's "initial
// address"), else a stable id per address.
func (p *Engine) localID(k *kconn, a netip.Addr) uint8 {
	a = a.Unmap()
	if a == k.c.Local.Addr() {
		return 0
	}
	if id, ok := p.localIDs[a]; ok {
		return id
	}
	used := map[uint8]bool{}
	for _, id := range p.localIDs {
		used[id] = true
	}
	for range 255 {
		id := uint8(p.nextID)
		p.nextID = p.nextID%255 + 1
		if !used[id] {
			p.localIDs[a] = id
			return id
		}
	}
	return 0 // 255 extra addresses: let the kernel decide
}

// scheduleRetry wakes the connection when a backed-off detour is usable
// again, or polls the sources (a relay grant may still be in flight) with a
// growing interval, for at most a minute after the last attempt.
func (p *Engine) scheduleRetry(k *kconn, now, soonest time.Time, none bool) {
	at := soonest
	if none || at.IsZero() {
		if k.pollWait == 0 {
			k.pollWait = 250 * time.Millisecond
			k.pollUntil = now.Add(time.Minute)
		} else {
			k.pollWait = min(2*k.pollWait, 30*time.Second)
		}
		if now.After(k.pollUntil) && soonest.IsZero() {
			return
		}
		if at.IsZero() || now.Add(k.pollWait).Before(at) {
			at = now.Add(k.pollWait)
		}
	}
	if k.retryAt.IsZero() || !k.retryAt.After(now) || at.Before(k.retryAt) {
		k.retryAt = at
		heap.Push(&p.wake, wakeup{at: at, token: k.c.Token})
	}
}

func (p *Engine) Tick(now time.Time) []Intent {
	var out []Intent
	for len(p.wake) > 0 && !p.wake[0].at.After(now) {
		w := heap.Pop(&p.wake).(wakeup)
		k := p.conns[w.token]
		if k != nil && w.check {
			out = append(out, p.expire(k, now)...)
			continue
		}
		if k == nil {
			continue
		}
		if w.at.Equal(k.holdUntil) {
			k.holdUntil = time.Time{}
			out = append(out, p.fill(k)...)
			continue
		}
		if !k.retryAt.Equal(w.at) {
			continue // rescheduled
		}
		k.retryAt = time.Time{}
		out = append(out, p.fill(k)...)
	}
	if t, ok := p.strat.(ticker); ok {
		out = append(out, t.tick(now)...)
	}
	// Forget detours that have been fine for a long time (bounded maps).
	if len(p.health) > 1024 {
		for dk, h := range p.health {
			if now.Sub(h.last) > 10*p.cfg.MaxBackoff {
				delete(p.health, dk)
			}
		}
	}
	if len(p.avoid) > 4096 {
		for ak, until := range p.avoid {
			if until.Before(now) {
				delete(p.avoid, ak)
			}
		}
	}
	return out
}

// expire gives up on detour subflows that did not connect in time.
func (p *Engine) expire(k *kconn, now time.Time) []Intent {
	n := 0
	for _, s := range k.subs {
		if s.redial && !s.up && !s.stale && now.Sub(s.created) >= p.cfg.ConnectTimeout {
			// The default path is still dead; the next retry redials.
			s.stale, s.role = true, RoleFailed
			s.decision = fmt.Sprintf("redial not established within %s", p.cfg.ConnectTimeout)
			continue
		}
		if s.d != nil && !s.up && !s.stale && now.Sub(s.created) >= p.cfg.ConnectTimeout {
			s.stale, s.role = true, RoleFailed
			s.decision = fmt.Sprintf("not established within %s", p.cfg.ConnectTimeout)
			if p.detourUpElsewhere(*s.d, k) {
				// The path works: the join failed for reasons of this
				// connection (typically it was closing: a short transfer
				// ends before its joins complete, and the server refuses
				// them). Blaming the detour would put it in backoff for
				// every connection.
				s.decision += " (the detour carries other connections: not held against it)"
			} else {
				p.penalise(*s.d, s.decision)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return p.fill(k)
}

// Conns is the number of tracked connections.
func (p *Engine) Conns() int { return len(p.conns) }
