package policy

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sort"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// KeepNConfig configures the default policy.
type KeepNConfig struct {
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
	// doubling per consecutive failure up to MaxBackoff (1s, 60s).
	Backoff, MaxBackoff time.Duration
	// ConnectTimeout: a detour subflow still not established after this
	// (its SYN black-holed) stops counting and its detour is backed off, so
	// another detour is tried without waiting minutes for the kernel's SYN
	// retries to give up (default 3s).
	ConnectTimeout time.Duration
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
	Log *slog.Logger
}

// KeepN is the default policy: keep up to N detour subflows on every
// selected connection, replace failed ones through other detours with
// backoff, and follow the server's address announcements.
type KeepN struct {
	cfg     KeepNConfig
	sources []detour.Source
	conns   map[uint32]*kconn
	health  map[string]*health
	servers map[netip.AddrPort]int // connections per server, for Release
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
	notConn     int // SUBFLOW_CREATE refused with ENOTCONN so far
}

// subKey leaves the local port out: it is unknown until the SYN goes out.
type subKey struct {
	local  netip.Addr
	remote netip.AddrPort
}

type ksub struct {
	d       *detour.Detour
	up      bool
	upSince time.Time
	created time.Time
	stale   bool // connect timeout passed; no longer counted
	port    uint16
	backup  bool
}

type health struct {
	fails int
	until time.Time
	last  time.Time
}

// NewKeepN returns the default policy drawing detours from sources.
func NewKeepN(cfg KeepNConfig, sources []detour.Source) *KeepN {
	if cfg.Subflows == 0 {
		cfg.Subflows = 2
	} else if cfg.Subflows < 0 {
		cfg.Subflows = 0
	}
	if cfg.Announced == 0 {
		cfg.Announced = 2
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 65536
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff < cfg.Backoff {
		cfg.MaxBackoff = 60 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 3 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &KeepN{cfg: cfg, sources: sources, conns: map[uint32]*kconn{},
		health: map[string]*health{}, servers: map[netip.AddrPort]int{}, localIDs: map[netip.Addr]uint8{}, nextID: 1}
}

func key(local netip.Addr, remote netip.AddrPort) subKey {
	return subKey{local.Unmap(), unmapAP(remote)}
}

func (p *KeepN) track(c Conn) *kconn {
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
	}
	return k
}

func (p *KeepN) Created(c Conn) []Intent {
	k := p.track(c)
	if k != nil && k.selected {
		for _, s := range p.sources {
			s.Prepare(k.c.Remote)
		}
	}
	return nil
}

func (p *KeepN) Established(c Conn) []Intent {
	k := p.track(c)
	if k == nil {
		return nil
	}
	k.established = true
	out := p.fill(k)
	for id, a := range k.announced {
		out = append(out, p.announcedSubflow(k, id, a)...)
	}
	return out
}

func (p *KeepN) Closed(token uint32) []Intent {
	k := p.conns[token]
	if k == nil {
		return nil
	}
	delete(p.conns, token)
	if k.selected {
		if p.servers[k.c.Remote]--; p.servers[k.c.Remote] <= 0 {
			delete(p.servers, k.c.Remote)
			p.release(k.c.Remote)
		}
	}
	return nil
}

// release lets grant-holding sources give up what no connection uses.
func (p *KeepN) release(server netip.AddrPort) {
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

func (p *KeepN) Announced(token uint32, id uint8, addr netip.AddrPort) []Intent {
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
	k.announced[id] = addr
	if !k.established {
		return nil
	}
	return p.announcedSubflow(k, id, addr)
}

func (p *KeepN) announcedSubflow(k *kconn, id uint8, addr netip.AddrPort) []Intent {
	a := addr.Addr()
	if a == k.c.Remote.Addr() && addr.Port() == k.c.Remote.Port() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
		return nil
	}
	n := 0
	for _, s := range k.subs {
		if s.d == nil {
			n++
		}
	}
	sk := key(k.c.Local.Addr(), addr)
	if n >= p.cfg.Announced || k.subs[sk] != nil {
		return nil
	}
	k.subs[sk] = &ksub{}
	return []Intent{{Action: CreateSubflow, Token: k.c.Token, Local: netip.AddrPortFrom(k.c.Local.Addr(), 0), Remote: addr, RemoteID: id}}
}

func (p *KeepN) Removed(token uint32, id uint8) []Intent {
	// The kernel closes the subflows to a removed address itself.
	if k := p.conns[token]; k != nil {
		delete(k.announced, id)
	}
	return nil
}

func (p *KeepN) SubflowEstablished(sf Subflow) []Intent {
	k := p.conns[sf.Token]
	if k == nil {
		return nil
	}
	s := k.subs[key(sf.Local.Addr(), sf.Remote)]
	if s == nil {
		// Not ours (opened before a restart, or by someone else): account
		// for it if it runs through a known detour.
		var ds []detour.Detour
		for _, src := range p.sources {
			ds = append(ds, src.Detours(k.c.Remote)...)
		}
		s = &ksub{}
		if d, ok := Match(ds, sf.Local.Addr(), sf.Remote); ok {
			s.d = &d
		}
		k.subs[key(sf.Local.Addr(), sf.Remote)] = s
	}
	s.up, s.stale, s.upSince, s.port, s.backup = true, false, p.cfg.Now(), sf.Local.Port(), sf.Backup
	// Learn ids the kernel already uses (subflows from before a restart).
	if a := sf.Local.Addr().Unmap(); sf.LocalID != 0 && a != k.c.Local.Addr() {
		if _, ok := p.localIDs[a]; !ok {
			p.localIDs[a] = sf.LocalID
		}
	}
	if s.d != nil {
		if h := p.health[Key(*s.d)]; h != nil {
			h.fails = 0
		}
	}
	return nil
}

func (p *KeepN) SubflowClosed(sf Subflow) []Intent {
	k := p.conns[sf.Token]
	if k == nil {
		return nil
	}
	sk := key(sf.Local.Addr(), sf.Remote)
	s := k.subs[sk]
	if s == nil {
		return nil
	}
	delete(k.subs, sk)
	if s.d == nil {
		return nil // announced addresses are not retried, as in the kernel PM
	}
	// A subflow that never came up, or died with an error, says the detour
	// is broken; a clean close (error 0) does not.
	if (!s.up || sf.Errno != 0) && !s.stale {
		p.penalise(*s.d, s.up)
	}
	return p.fill(k)
}

func (p *KeepN) penalise(d detour.Detour, wasUp bool) {
	now := p.cfg.Now()
	h := p.health[Key(d)]
	if h == nil {
		h = &health{}
		p.health[Key(d)] = h
	}
	h.fails++
	wait := p.cfg.Backoff << min(h.fails-1, 20)
	if wait > p.cfg.MaxBackoff || wait <= 0 {
		wait = p.cfg.MaxBackoff
	}
	h.until, h.last = now.Add(wait), now
	p.cfg.Log.Info("detour failed", "detour", d.String(), "fails", h.fails, "retry_after", wait)
}

func (p *KeepN) Stalled(sf Subflow) []Intent {
	k := p.conns[sf.Token]
	if k == nil {
		return nil
	}
	s := k.subs[key(sf.Local.Addr(), sf.Remote)]
	if s == nil || s.d == nil || s.stale {
		return nil
	}
	s.stale = true
	p.penalise(*s.d, s.up)
	// Close it (its SUB_CLOSED then only removes it) and replace it now.
	out := []Intent{{Action: DestroySubflow, Token: sf.Token, LocalID: sf.LocalID, Local: sf.Local, Remote: sf.Remote, Detour: s.d}}
	return append(out, p.fill(k)...)
}

func (p *KeepN) Priority(sf Subflow) []Intent {
	if k := p.conns[sf.Token]; k != nil {
		if s := k.subs[key(sf.Local.Addr(), sf.Remote)]; s != nil {
			s.backup = sf.Backup
		}
	}
	return nil
}

func (p *KeepN) Failed(in Intent, err error) []Intent {
	k := p.conns[in.Token]
	if k == nil || in.Action != CreateSubflow {
		return nil
	}
	delete(k.subs, key(in.Local.Addr(), in.Remote))
	// Not fully established yet (a connection adopted from inet_diag before
	// its first data ack): try again shortly, for a while.
	if errors.Is(err, syscall.ENOTCONN) {
		if k.notConn++; k.notConn <= 50 {
			at := p.cfg.Now().Add(200 * time.Millisecond)
			if k.retryAt.IsZero() || at.Before(k.retryAt) {
				k.retryAt = at
				heap.Push(&p.wake, wakeup{at: at, token: k.c.Token})
			}
		}
		return nil
	}
	// The connection is gone: nothing to retry, no one to blame.
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EBADF) {
		return nil
	}
	if in.Detour == nil {
		return nil
	}
	p.penalise(*in.Detour, false)
	return p.fill(k)
}

func (p *KeepN) Adopt(c Conn, subflows []Subflow) []Intent {
	k := p.track(c)
	if k == nil {
		return nil
	}
	k.established = true
	for _, sf := range subflows {
		if key(sf.Local.Addr(), sf.Remote) == key(k.c.Local.Addr(), k.c.Remote) {
			continue // the initial subflow
		}
		p.SubflowEstablished(sf)
	}
	return p.fill(k)
}

// fill opens detour subflows until the connection has N of them.
func (p *KeepN) fill(k *kconn) []Intent {
	if !k.selected || !k.established {
		return nil
	}
	have := 0
	used := map[string]bool{}
	for _, s := range k.subs {
		if s.d != nil {
			if !s.stale {
				have++
			}
			used[Key(*s.d)] = true
		}
	}
	if have >= p.cfg.Subflows {
		return nil
	}
	now := p.cfg.Now()
	var cands []detour.Detour
	var soonest time.Time
	seen := map[string]bool{}
	for _, src := range p.sources {
		for _, d := range src.Detours(k.c.Remote) {
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
			cands = append(cands, d)
		}
	}
	// Prefer detours with fewer recent failures; keep the sources' order otherwise.
	sort.SliceStable(cands, func(i, j int) bool { return p.fails(cands[i]) < p.fails(cands[j]) })
	var out []Intent
	for _, d := range cands {
		if have >= p.cfg.Subflows {
			break
		}
		local := d.Local
		if !local.IsValid() {
			local = k.c.Local.Addr()
		}
		sk := key(local, d.Remote)
		if k.subs[sk] != nil {
			continue
		}
		dd := d
		k.subs[sk] = &ksub{d: &dd, created: now}
		have++
		out = append(out, Intent{Action: CreateSubflow, Token: k.c.Token, LocalID: p.localID(k, local),
			Local: netip.AddrPortFrom(local, 0), Remote: unmapAP(d.Remote), Detour: &dd})
	}
	if have < p.cfg.Subflows {
		p.scheduleRetry(k, now, soonest, len(seen) == 0)
	}
	if len(out) > 0 {
		heap.Push(&p.wake, wakeup{at: now.Add(p.cfg.ConnectTimeout), token: k.c.Token, check: true})
	}
	return out
}

// localID is 0 for the connection's own address (the kernel's "initial
// address"), else a stable id per address.
func (p *KeepN) localID(k *kconn, a netip.Addr) uint8 {
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

func (p *KeepN) fails(d detour.Detour) int {
	if h := p.health[Key(d)]; h != nil {
		return h.fails
	}
	return 0
}

// scheduleRetry wakes the connection when a backed-off detour is usable
// again, or polls the sources (a relay grant may still be in flight) with a
// growing interval, for at most a minute after the last attempt.
func (p *KeepN) scheduleRetry(k *kconn, now, soonest time.Time, none bool) {
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

func (p *KeepN) Tick(now time.Time) []Intent {
	var out []Intent
	for len(p.wake) > 0 && !p.wake[0].at.After(now) {
		w := heap.Pop(&p.wake).(wakeup)
		k := p.conns[w.token]
		if k != nil && w.check {
			out = append(out, p.expire(k, now)...)
			continue
		}
		if k == nil || !k.retryAt.Equal(w.at) {
			continue // closed, or rescheduled
		}
		k.retryAt = time.Time{}
		out = append(out, p.fill(k)...)
	}
	// Forget detours that have been fine for a long time (bounded map).
	if len(p.health) > 1024 {
		for dk, h := range p.health {
			if now.Sub(h.last) > 10*p.cfg.MaxBackoff {
				delete(p.health, dk)
			}
		}
	}
	return out
}

// expire gives up on detour subflows that did not connect in time.
func (p *KeepN) expire(k *kconn, now time.Time) []Intent {
	n := 0
	for _, s := range k.subs {
		if s.d != nil && !s.up && !s.stale && now.Sub(s.created) >= p.cfg.ConnectTimeout {
			s.stale = true
			p.penalise(*s.d, false)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return p.fill(k)
}

// Conns is the number of tracked connections.
func (p *KeepN) Conns() int { return len(p.conns) }

// Backoff reports until when a detour is being avoided (zero if usable).
func (p *KeepN) Backoff(d detour.Detour) time.Time {
	if h := p.health[Key(d)]; h != nil && h.until.After(p.cfg.Now()) {
		return h.until
	}
	return time.Time{}
}

type wakeup struct {
	at    time.Time
	token uint32
	check bool // connect-timeout check rather than a retry
}

type wakeHeap []wakeup

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h wakeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)        { *h = append(*h, x.(wakeup)) }
func (h *wakeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
