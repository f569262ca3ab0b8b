package serverrole

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"golang.org/x/sys/unix"
)

// Kernel is what the role needs of the kernel: events in, ANNOUNCE out,
// and the connection dump to catch up after lost events. LinuxKernel is the
// real one; tests use a fake.
type Kernel interface {
	// Events blocks for the next batch; an error wrapping
	// mptcppm.ErrEventsLost means some were dropped; net.ErrClosed ends.
	Events() ([]mptcppm.Event, error)
	Announce(token uint32, a mptcppm.Addr) error
	Connections() ([]mptcppm.Connection, error)
}

// Stats are the role's counters.
type Stats struct {
	Connections   uint64 // server-side connections announced to
	Announcements uint64 // ANNOUNCE commands the kernel accepted
	Errors        uint64 // ANNOUNCE commands refused
	Gone          uint64 // delayed announcements to connections closed meanwhile
	Resyncs       uint64 // catch-ups after lost events
	Repeats       uint64 // rounds of announcements repeated (fewer joins than addresses)
}

// conn is a connection announced to.
type conn struct {
	joins int // server-side subflows established after the first
}

// maxRepeats bounds the repeated rounds per connection (after Repeat,
// 2 x Repeat, 4 x Repeat).
const maxRepeats = 3

// Role announces cfg.Announce on every selected server-side connection.
type Role struct {
	cfg Config
	k   Kernel
	log *slog.Logger
	// mu guards done and errLogged: timers (spaced and repeated
	// announcements) use them too.
	mu sync.Mutex
	// done holds the connections announced to (forgotten on CLOSED), so a
	// resync does not announce twice; bounded by maxTracked.
	done  map[uint32]*conn
	stats struct{ conns, anns, errs, gone, resyncs, repeats atomic.Uint64 }
	// errLogged limits refusal logs to one per distinct message.
	errLogged map[string]bool
}

// maxTracked bounds the token set (a connection whose CLOSED event was lost
// stays until a resync); beyond it the set is rebuilt from the kernel.
const maxTracked = 1 << 20

// New returns a role; Run drives it.
func New(cfg Config, k Kernel, log *slog.Logger) *Role {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Role{cfg: cfg, k: k, log: log, done: map[uint32]*conn{}, errLogged: map[string]bool{}}
}

// Stats returns the counters (safe from any goroutine).
func (r *Role) Stats() Stats {
	return Stats{Connections: r.stats.conns.Load(), Announcements: r.stats.anns.Load(),
		Errors: r.stats.errs.Load(), Gone: r.stats.gone.Load(), Resyncs: r.stats.resyncs.Load(), Repeats: r.stats.repeats.Load()}
}

// Run handles events until the kernel's event source is closed (nil) or
// fails. ctx only ends it between batches; close the Kernel to unblock.
func (r *Role) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		evs, err := r.k.Events()
		if errors.Is(err, mptcppm.ErrEventsLost) {
			r.log.Warn("server role: kernel dropped MPTCP events; catching up from the connection table")
			r.resync()
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, ev := range evs {
			r.handle(ev)
		}
	}
	return nil
}

func serverSide(e mptcppm.Event) bool {
	// Newer kernels flag it in flags (MPTCP_PM_EV_FLAG_SERVER_SIDE), older
	// ones in the server_side attribute.
	return e.ServerSide != 0 || e.Flags&2 != 0
}

func (r *Role) handle(e mptcppm.Event) {
	switch e.Type {
	case mptcppm.EventEstablished:
		// ANNOUNCE needs a fully established connection: the ADD_ADDR
		// travels on an ACK with a DSS and is echoed by the client.
		if serverSide(e) && r.cfg.selects(e.Local.Port()) {
			r.announce(e.Token)
		}
	case mptcppm.EventSubEstablished:
		// Tokens are per namespace: a tracked token is our server side.
		r.mu.Lock()
		if c := r.done[e.Token]; c != nil {
			c.joins++
		}
		r.mu.Unlock()
	case mptcppm.EventClosed:
		r.mu.Lock()
		delete(r.done, e.Token)
		r.mu.Unlock()
	}
}

func (r *Role) announce(token uint32) {
	r.mu.Lock()
	if _, ok := r.done[token]; ok {
		r.mu.Unlock()
		return
	}
	if len(r.done) >= maxTracked {
		r.done = map[uint32]*conn{}
	}
	r.done[token] = &conn{}
	r.mu.Unlock()
	r.stats.conns.Add(1)
	r.round(token)
	if r.cfg.Repeat > 0 {
		time.AfterFunc(r.cfg.Repeat, func() { r.recheck(token, 1) })
	}
}

// round sends every announcement, spaced by Interval.
func (r *Role) round(token uint32) {
	for i, a := range r.cfg.Announce {
		if i == 0 || r.cfg.Interval <= 0 {
			r.send(token, a)
			continue
		}
		// The kernel keeps one pending ADD_ADDR per connection (Config.Interval).
		time.AfterFunc(time.Duration(i)*r.cfg.Interval, func() { r.send(token, a) })
	}
}

// recheck repeats the announcements while the connection has fewer joins
// than announced addresses: an ADD_ADDR the client dropped (its path
// manager busy with the previous one) or lost on the way is otherwise
// repeated by the kernel only after net.mptcp.add_addr_timeout (120 s).
// The client ignores an address it already has a subflow to.
func (r *Role) recheck(token uint32, n int) {
	r.mu.Lock()
	c := r.done[token]
	short := c != nil && c.joins < len(r.cfg.Announce)
	r.mu.Unlock()
	if !short {
		return
	}
	r.stats.repeats.Add(1)
	r.round(token)
	if n < maxRepeats {
		time.AfterFunc(r.cfg.Repeat<<n, func() { r.recheck(token, n+1) })
	}
}

// send issues one ANNOUNCE; called from the loop and from timers.
func (r *Role) send(token uint32, a Announcement) {
	err := r.k.Announce(token, mptcppm.Addr{ID: a.ID, IP: a.Addr, Port: a.Port})
	if err == nil {
		r.stats.anns.Add(1)
		r.log.Debug("server role: announced", "token", token, "address", a.String())
		return
	}
	var pe *mptcppm.Error
	if errors.As(err, &pe) && pe.Errno == unix.EINVAL && pe.Msg == "invalid token" {
		// Closed before a delayed announcement: nothing to announce to.
		r.stats.gone.Add(1)
		return
	}
	r.stats.errs.Add(1)
	// One line per distinct cause (tokens differ, the rest repeats).
	key := a.String() + " " + err.Error()
	if pe != nil {
		key = fmt.Sprintf("%s %d %s %v", a, pe.Errno, pe.Msg, pe.Err)
	}
	r.mu.Lock()
	first := !r.errLogged[key] && len(r.errLogged) < 64
	if first {
		r.errLogged[key] = true
	}
	r.mu.Unlock()
	if first {
		r.log.Warn("server role: ANNOUNCE refused (logged once per cause)", "address", a.String(), "err", err)
	}
}

// resync announces to established server-side connections not seen yet
// (their ESTABLISHED event was among those lost) and forgets closed ones.
func (r *Role) resync() {
	r.stats.resyncs.Add(1)
	cs, err := r.k.Connections()
	if err != nil {
		r.log.Warn("server role: connection dump failed", "err", err)
		return
	}
	live := make(map[uint32]struct{}, len(cs))
	for _, c := range cs {
		live[c.Token] = struct{}{}
	}
	r.mu.Lock()
	for t := range r.done {
		if _, ok := live[t]; !ok {
			delete(r.done, t)
		}
	}
	r.mu.Unlock()
	for _, c := range cs {
		if c.ServerSide && c.State == 1 && c.Token != 0 && c.Info.Flags&mptcppm.InfoFlagFallback == 0 && r.cfg.selects(c.Local.Port()) {
			r.announce(c.Token)
		}
	}
}
