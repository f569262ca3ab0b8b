// Package convclient is the client side of conversion (docs/convert.md):
// the Router, which lives in the agent, keeps a few converter tickets per
// converter in stock (fetched over the relays' control sessions in the
// background), measures each converter's round-trip time, and remembers which
// destinations do not speak MPTCP (learned from fallbacks, with a lifetime);
// it answers "mpdetour run" supervisors over a unix socket (Serve / Client):
// for each connect() of an application, convert through which converter with
// which ticket, or go direct.
package convclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// TicketSource hands out converter tickets: relayconn.Conn.Convert over
// the authenticated control session (tests use fakes).
type TicketSource interface {
	Convert(ctx context.Context, n int) (netip.AddrPort, [][proto.TicketLen]byte, time.Duration, error)
}

// Converter is one relay asked for tickets.
type Converter struct {
	Name   string
	Source TicketSource
}

// Config tunes the Router; zero values take the defaults.
type Config struct {
	// TTL is how long a destination's learned answer (speaks MPTCP or
	// not) is kept (default 1h).
	TTL time.Duration
	// Tickets is the stock kept per converter (default 4, at most
	// proto.MaxTickets) while conversions are rare; a converter whose
	// stock runs out doubles its stock, up to MaxStock, and halves it
	// back after 30 s without running out.
	Tickets int
	// Hold is how long a converter that failed is not used (default 30s):
	// the connections in between go direct.
	Hold time.Duration
	// MaxDestinations bounds the learned cache of root's lessons (default
	// 65536).
	MaxDestinations int
	// MaxUserDestinations bounds the lessons kept for each other user
	// (default 4096), MaxUsers the users with state (default 256; the
	// least recently seen other user's state is dropped beyond it).
	MaxUserDestinations, MaxUsers int
	// UserRate bounds the conversions of each user other than root
	// (tickets per second, default 50, burst twice that): one user's
	// programs cannot drain the member's stock that the others share.
	UserRate float64
	// Refill is how often stocks are checked (default 1s; a used ticket
	// also wakes the refiller).
	Refill time.Duration
	// RequestTimeout bounds one ticket request (default 5s).
	RequestTimeout time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.TTL <= 0 {
		c.TTL = time.Hour
	}
	if c.Tickets <= 0 {
		c.Tickets = 4
	}
	c.Tickets = min(c.Tickets, proto.MaxTickets)
	if c.Hold <= 0 {
		c.Hold = 30 * time.Second
	}
	if c.MaxDestinations <= 0 {
		c.MaxDestinations = 65536
	}
	if c.MaxUserDestinations <= 0 {
		c.MaxUserDestinations = 4096
	}
	if c.MaxUsers <= 0 {
		c.MaxUsers = 256
	}
	if c.UserRate <= 0 {
		c.UserRate = 50
	}
	if c.Refill <= 0 {
		c.Refill = time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Decision is the Router's answer for one connect().
type Decision struct {
	Convert   bool
	Converter netip.AddrPort // when Convert
	Name      string         // the converter's relay name
	Ticket    []byte
	// Learn: the destination is unknown; the caller goes direct and
	// reports with Learn whether it spoke MPTCP.
	Learn bool
	// Why the decision (for logs and counters): "unknown", "mptcp",
	// "no-mptcp", "no-converter", "not-convertible", "user-rate" (a user
	// other than root over Config.UserRate).
	Why string
}

// Outcome of a conversion the caller reports back.
type Outcome string

const (
	OutcomeOK Outcome = "ok"
	// OutcomeConverterFailed: the converter could not be reached or
	// refused for its own reasons (ticket, resources, protocol); it is
	// held for Config.Hold and the connection went direct.
	OutcomeConverterFailed Outcome = "converter-failed"
	// OutcomeTicketRefused: the converter refused the ticket (Not
	// Authorized, value 1): the stock is dropped and refetched; a second
	// refusal within Hold holds the converter.
	OutcomeTicketRefused Outcome = "ticket-refused"
	// OutcomePolicy: the converter refused the destination by policy:
	// it is not converted again for TTL.
	OutcomePolicy Outcome = "policy"
	// OutcomeDestination: the destination refused or was unreachable;
	// the application got that error, as directly.
	OutcomeDestination Outcome = "destination"
)

type destEntry struct {
	native      bool // speaks MPTCP
	noConvert   bool // the converters refuse it (policy)
	expires     time.Time
	learnedAt   time.Time
	conversions uint64
}

type ticket struct {
	b       [proto.TicketLen]byte
	expires time.Time
	fetched time.Time
}

// Root is the uid whose lessons and reports hold for every user.
const Root uint32 = 0

// user is what the Router learned from one local user's supervisors
// (the socket is open to the users the configuration allows, and nothing
// one of them says changes another's decisions). Root's
// user is the shared one: its lessons answer every user that has none of
// its own, its reports hold converters and drop stale stocks for everyone.
// Another user's lessons, holds and ticket refusals change only its own
// decisions.
type user struct {
	uid      uint32
	dest     map[netip.AddrPort]*destEntry
	lastSeen time.Time
	// per converter name (other users only; root's are on conv).
	held        map[string]time.Time // held for this user until
	refusedAt   map[string]time.Time // its last ticket refusal
	staleBefore map[string]time.Time // tickets fetched before are not its
	// tokens, filled: the conversion bucket (Config.UserRate).
	tokens float64
	filled time.Time
	// routed: conversions handed to this user whose outcome it has not
	// reported yet, by destination (other users only): a report must
	// answer one, so a user cannot enter conversions it never made into
	// the status others read.
	routed map[netip.AddrPort]int
}

// maxRouted bounds a user's conversions awaiting their report.
const maxRouted = 1024

// take spends one conversion of u's bucket (root's is unbounded).
func (u *user) take(rate float64, now time.Time) bool {
	if u.uid == Root {
		return true
	}
	burst := 2 * rate
	if u.filled.IsZero() {
		u.tokens = burst
	} else {
		u.tokens = min(burst, u.tokens+rate*now.Sub(u.filled).Seconds())
	}
	u.filled = now
	if u.tokens < 1 {
		return false
	}
	u.tokens--
	return true
}

// MaxStock bounds a converter's stock when it grows under load: 3/4 of the
// relay's 64 outstanding tickets per member, so that a refill (at most
// proto.MaxTickets, asked when half the stock is used) always fits beside
// the stock.
const MaxStock = 48

// shrinkAfter: a grown stock that has not run out for this long is halved.
const shrinkAfter = 30 * time.Second

type conv struct {
	Converter
	addr    netip.AddrPort
	tickets []ticket
	// want is the stock kept (Config.Tickets .. MaxStock); emptied says
	// a conversion found the stock empty since the last refill; grownAt
	// when want last changed. batch bounds one request (proto.MaxTickets,
	// proto.LegacyMaxTickets for a relay that refused more as malformed).
	want, batch int
	emptied     bool
	grownAt     time.Time
	rtt         time.Duration // minimum request round trip seen
	lastRTT     time.Duration
	fetching    bool
	failedUntil time.Time
	lastErr     string
	fetchErrAt  time.Time
	// ticketRefusedAt: the last refusal of a ticket (stale stock).
	ticketRefusedAt time.Time
	used, fails     uint64
}

// Conversion is a recent successful conversion (for status).
type Conversion struct {
	UID         uint32    `json:"uid"`
	Local       string    `json:"local"`
	Converter   string    `json:"converter"`
	Name        string    `json:"relay"`
	Destination string    `json:"destination"`
	Since       time.Time `json:"since"`
}

// Router decides per connect(); safe for concurrent use.
type Router struct {
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex
	conv []*conv
	// users by uid; users[Root] always exists.
	users map[uint32]*user
	// recent successful conversions, newest last, bounded.
	recent []Conversion
	ctr    Counters
	wake   chan struct{}
	// refusedUIDs: users refused on the socket, logged once each.
	refusedUIDs map[uint32]bool
}

// Counters are totals since start (status, JSON names stable).
type Counters struct {
	Routed           uint64            `json:"routed"`
	Converted        uint64            `json:"converted"`
	Direct           map[string]uint64 `json:"direct"` // by reason
	Learned          uint64            `json:"learned"`
	LearnedNoMPTCP   uint64            `json:"learned_no_mptcp"`
	ConverterFailed  uint64            `json:"converter_failed"`
	PolicyRefused    uint64            `json:"policy_refused"`
	DestinationError uint64            `json:"destination_error"`
	TicketsFetched   uint64            `json:"tickets_fetched"`
	TicketErrors     uint64            `json:"ticket_errors"`
	// Refused: socket connections of users not allowed (convert.users).
	Refused uint64 `json:"refused_users"`
	// Unsolicited: reports of a user other than root for a conversion it
	// was not handed (ignored).
	Unsolicited uint64 `json:"unsolicited_reports"`
}

// New builds a Router over the converters (one per relay that may run one).
func New(cfg Config, log *slog.Logger, convs ...Converter) *Router {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{cfg: cfg, log: log, users: map[uint32]*user{}, wake: make(chan struct{}, 1)}
	r.users[Root] = &user{uid: Root, dest: map[netip.AddrPort]*destEntry{}}
	r.ctr.Direct = map[string]uint64{}
	for _, c := range convs {
		r.conv = append(r.conv, &conv{Converter: c, want: cfg.Tickets, batch: proto.MaxTickets})
	}
	return r
}

// Run keeps the ticket stocks filled until ctx ends.
func (r *Router) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Refill)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		r.refill(ctx, &wg)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.wake:
		}
	}
}

// refill starts a ticket request for every converter below its stock.
func (r *Router) refill(ctx context.Context, wg *sync.WaitGroup) {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conv {
		c.dropExpired(now)
		// A failed request is retried after Hold (a relay without a
		// converter answers "unsupported": no need to ask every second).
		c.resize(now, r.cfg.Tickets)
		if c.fetching || len(c.tickets) > c.want/2 || now.Sub(c.fetchErrAt) < r.cfg.Hold {
			continue
		}
		n := min(c.want-len(c.tickets), c.batch)
		c.fetching = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.fetch(ctx, c, n)
		}()
	}
}

// resize grows the stock when it ran out (consumption faster than the
// refills) and shrinks a grown one after shrinkAfter without running out.
func (c *conv) resize(now time.Time, base int) {
	switch {
	case c.emptied:
		c.emptied = false
		if c.want < MaxStock {
			c.want = min(2*c.want, MaxStock)
			c.grownAt = now
		}
	case c.want > base && now.Sub(c.grownAt) >= shrinkAfter:
		c.want = max(c.want/2, base)
		c.grownAt = now
	}
}

func (r *Router) fetch(ctx context.Context, c *conv, n int) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	addr, ts, lease, err := c.Source.Convert(ctx, n)
	rtt := time.Since(start)
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	c.fetching = false
	if err != nil && n > proto.LegacyMaxTickets && c.batch > proto.LegacyMaxTickets && proto.ReasonOf(err) == proto.ReasonMalformed {
		// A relay from before proto.MaxTickets was raised: ask it for
		// at most its bound, at once.
		c.batch = proto.LegacyMaxTickets
		c.lastErr = err.Error()
		r.log.Info("converter relay takes at most 8 tickets per request", "relay", c.Name)
		return
	}
	if err != nil {
		c.fetchErrAt, c.lastErr = now, err.Error()
		r.ctr.TicketErrors++
		if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
			r.log.Debug("converter tickets", "relay", c.Name, "err", err)
		}
		return
	}
	if !addr.IsValid() || len(ts) == 0 {
		c.fetchErrAt, c.lastErr = now, "no converter address or tickets in the reply"
		r.ctr.TicketErrors++
		return
	}
	if c.addr != addr {
		// A new address makes the old tickets useless.
		c.tickets = nil
		c.addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	}
	// Keep a margin: a ticket must still be valid when the SYN arrives.
	exp := now.Add(lease - min(lease/10, 5*time.Second))
	for _, t := range ts {
		c.tickets = append(c.tickets, ticket{b: t, expires: exp, fetched: now})
	}
	r.ctr.TicketsFetched += uint64(len(ts))
	c.lastRTT = rtt
	if c.rtt == 0 || rtt < c.rtt {
		c.rtt = rtt
	}
	c.lastErr = ""
}

func (c *conv) dropExpired(now time.Time) {
	c.tickets = slices.DeleteFunc(c.tickets, func(t ticket) bool { return !now.Before(t.expires) })
}

// user returns uid's state, creating it (and dropping the least recently
// seen other user's beyond Config.MaxUsers).
func (r *Router) user(uid uint32, now time.Time) *user {
	u := r.users[uid]
	if u == nil {
		if len(r.users) >= r.cfg.MaxUsers {
			var old *user
			for _, x := range r.users {
				if x.uid != Root && (old == nil || x.lastSeen.Before(old.lastSeen)) {
					old = x
				}
			}
			if old != nil {
				delete(r.users, old.uid)
			}
		}
		u = &user{uid: uid, dest: map[netip.AddrPort]*destEntry{}, held: map[string]time.Time{},
			refusedAt: map[string]time.Time{}, staleBefore: map[string]time.Time{}, routed: map[netip.AddrPort]int{}}
		r.users[uid] = u
	}
	u.lastSeen = now
	return u
}

// lookup returns what uid's decisions know of dst: its own lesson, else
// root's (expired entries are dropped).
func (r *Router) lookup(u *user, dst netip.AddrPort, now time.Time) *destEntry {
	for _, x := range []*user{u, r.users[Root]} {
		if e := x.dest[dst]; e != nil {
			if now.Before(e.expires) {
				return e
			}
			delete(x.dest, dst)
		}
	}
	return nil
}

// Route decides for a connect() to dst by a program of user uid.
func (r *Router) Route(uid uint32, dst netip.AddrPort) Decision {
	dst = unmap(dst)
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctr.Routed++
	u := r.user(uid, now)
	e := r.lookup(u, dst, now)
	var d Decision
	switch {
	case e == nil:
		d = Decision{Learn: true, Why: "unknown"}
	case e.native:
		d = Decision{Why: "mptcp"}
	case e.noConvert:
		d = Decision{Why: "not-convertible"}
	default:
		c, i := r.pick(u, now)
		if c == nil {
			d = Decision{Why: "no-converter"}
			break
		}
		if !u.take(r.cfg.UserRate, now) {
			d = Decision{Why: "user-rate"}
			break
		}
		t := c.tickets[i]
		c.tickets = slices.Delete(c.tickets, i, i+1)
		c.used++
		e.conversions++
		d = Decision{Convert: true, Converter: c.addr, Name: c.Name, Ticket: append([]byte{}, t.b[:]...), Why: "no-mptcp"}
		if uid != Root && (u.routed[dst] > 0 || len(u.routed) < maxRouted) {
			u.routed[dst]++
		}
		if len(c.tickets) == 0 {
			c.emptied = true
		}
		if len(c.tickets) <= c.want/2 {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
	}
	if !d.Convert {
		r.ctr.Direct[d.Why]++
	}
	return d
}

// pick returns the usable converter with the lowest measured round trip
// for user u and the index of the ticket u may take from its stock.
func (r *Router) pick(u *user, now time.Time) (*conv, int) {
	var best *conv
	bestI := 0
	for _, c := range r.conv {
		c.dropExpired(now)
		if len(c.tickets) == 0 && c.addr.IsValid() && !now.Before(c.failedUntil) {
			c.emptied = true // a conversion wanted a ticket: stock too small
		}
		if len(c.tickets) == 0 || now.Before(c.failedUntil) || !c.addr.IsValid() || now.Before(u.held[c.Name]) {
			continue
		}
		// A user that had a ticket refused takes only tickets fetched
		// after the refusal (the others' stock is not dropped for it).
		i := slices.IndexFunc(c.tickets, func(t ticket) bool { return t.fetched.After(u.staleBefore[c.Name]) })
		if i < 0 {
			continue
		}
		if best == nil || c.rtt < best.rtt {
			best, bestI = c, i
		}
	}
	return best, bestI
}

// Learn records whether dst spoke MPTCP (a direct connection's fallback)
// for the decisions of user uid (root's lessons: for every user without
// one of its own).
func (r *Router) Learn(uid uint32, dst netip.AddrPort, native bool) {
	dst = unmap(dst)
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.user(uid, now)
	if e := u.dest[dst]; e != nil && now.Before(e.expires) && e.native == native && !e.noConvert {
		return // already known: the lifetime runs from the first lesson
	}
	bound := r.cfg.MaxDestinations
	if uid != Root {
		bound = r.cfg.MaxUserDestinations
	}
	if len(u.dest) >= bound {
		evict(u.dest, bound, now)
	}
	u.dest[dst] = &destEntry{native: native, expires: now.Add(r.cfg.TTL), learnedAt: now}
	r.ctr.Learned++
	if !native {
		r.ctr.LearnedNoMPTCP++
		if uid == Root {
			r.log.Info("destination does not speak MPTCP: later connections go through a converter", "dst", dst, "for", r.cfg.TTL)
		} else {
			r.log.Debug("destination does not speak MPTCP for this user's connections", "uid", uid, "dst", dst, "for", r.cfg.TTL)
		}
	}
}

// evict drops expired entries of m, or the oldest quarter when none expired.
func evict(m map[netip.AddrPort]*destEntry, bound int, now time.Time) {
	for k, e := range m {
		if !now.Before(e.expires) {
			delete(m, k)
		}
	}
	if len(m) < bound {
		return
	}
	type ke struct {
		k netip.AddrPort
		t time.Time
	}
	all := make([]ke, 0, len(m))
	for k, e := range m {
		all = append(all, ke{k, e.learnedAt})
	}
	slices.SortFunc(all, func(a, b ke) int { return a.t.Compare(b.t) })
	for _, x := range all[:len(all)/4+1] {
		delete(m, x.k)
	}
}

// maxRecent bounds the recent conversions kept for status.
const maxRecent = 256

// Report records the outcome of a conversion by a program of user uid.
// Root's failure reports hold the converter (and drop a refused stock) for
// everyone; another user's hold it, and keep the refused stock away, for
// that user only: a user cannot put the converter on hold for the others.
func (r *Router) Report(uid uint32, dst netip.AddrPort, name string, out Outcome, local netip.AddrPort, detail string) {
	dst = unmap(dst)
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.user(uid, now)
	if uid != Root {
		// Only the outcome of a conversion this user was handed counts.
		if u.routed[dst] == 0 {
			r.ctr.Unsolicited++
			return
		}
		if u.routed[dst]--; u.routed[dst] == 0 {
			delete(u.routed, dst)
		}
	}
	var c *conv
	for _, x := range r.conv {
		if x.Name == name {
			c = x
		}
	}
	switch out {
	case OutcomeOK:
		r.ctr.Converted++
		cv := Conversion{UID: uid, Local: local.String(), Name: name, Destination: dst.String(), Since: now}
		if c != nil {
			cv.Converter = c.addr.String()
		}
		if len(r.recent) >= maxRecent {
			r.recent = slices.Delete(r.recent, 0, len(r.recent)-maxRecent+1)
		}
		r.recent = append(r.recent, cv)
	case OutcomeConverterFailed, OutcomeTicketRefused:
		r.ctr.ConverterFailed++
		if c == nil {
			break
		}
		if uid != Root {
			r.userFailure(u, c, out, now, detail)
			break
		}
		c.lastErr = detail
		c.fails++
		if out == OutcomeTicketRefused {
			// Most likely the relay restarted and forgot the tickets it
			// issued: the rest of the stock is stale too. Refetch at
			// once; hold the converter only when fresh tickets are
			// refused as well.
			c.tickets = nil
			select {
			case r.wake <- struct{}{}:
			default:
			}
			if now.Sub(c.ticketRefusedAt) > r.cfg.Hold {
				c.ticketRefusedAt = now
				r.log.Info("converter refused a ticket; fetching fresh ones", "relay", name, "err", detail)
				break
			}
		}
		c.failedUntil = now.Add(r.cfg.Hold)
		r.log.Warn("converter failed; connections go direct meanwhile", "relay", name, "for", r.cfg.Hold, "err", detail)
	case OutcomePolicy:
		r.ctr.PolicyRefused++
		if e := u.dest[dst]; e != nil {
			e.noConvert = true
		} else if e := r.lookup(u, dst, now); e != nil {
			// Root's lesson: this user's own copy says "not convertible".
			u.dest[dst] = &destEntry{noConvert: true, expires: e.expires, learnedAt: now}
		}
		r.log.Info("converter refuses destination by policy; it goes direct", "relay", name, "dst", dst, "uid", uid, "for", r.cfg.TTL)
	case OutcomeDestination:
		r.ctr.DestinationError++
	}
}

// userFailure is a failure reported by a user other than root: it changes
// that user's decisions only. A refused ticket keeps the stock fetched
// before it away from this user (tickets fetched later are its again); a
// second refusal within Hold, or a converter failure, holds the converter
// for this user. Logged once per hold.
func (r *Router) userFailure(u *user, c *conv, out Outcome, now time.Time, detail string) {
	c.fails++
	if out == OutcomeTicketRefused {
		u.staleBefore[c.Name] = now
		select {
		case r.wake <- struct{}{}:
		default:
		}
		if now.Sub(u.refusedAt[c.Name]) > r.cfg.Hold {
			u.refusedAt[c.Name] = now
			return
		}
	}
	if now.Before(u.held[c.Name]) {
		return
	}
	u.held[c.Name] = now.Add(r.cfg.Hold)
	r.log.Info("converter failed for one user's connections; they go direct meanwhile", "relay", c.Name, "uid", u.uid, "for", r.cfg.Hold, "err", detail)
}

// Status is the Router's view for "mpdetour status" (JSON names stable).
type Status struct {
	Counters     Counters          `json:"counters"`
	Converters   []ConverterStatus `json:"converters"`
	Destinations int               `json:"destinations_known"`
	NoMPTCP      []DestStatus      `json:"no_mptcp"`
	Recent       []Conversion      `json:"recent"`
}

// ConverterStatus is one converter's state.
type ConverterStatus struct {
	Relay       string    `json:"relay"`
	Address     string    `json:"address,omitempty"`
	Tickets     int       `json:"tickets"`
	RTTms       float64   `json:"rtt_ms"`
	Used        uint64    `json:"used"`
	Failures    uint64    `json:"failures"`
	FailedUntil time.Time `json:"failed_until,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
}

// DestStatus is a destination learned not to speak MPTCP.
type DestStatus struct {
	// UID: whose lesson (0: root's, for every user).
	UID         uint32    `json:"uid"`
	Destination string    `json:"destination"`
	Expires     time.Time `json:"expires"`
	Convertible bool      `json:"convertible"`
	Conversions uint64    `json:"conversions"`
}

// maxStatusDests bounds the destinations listed in a status.
const maxStatusDests = 100

// Status returns a snapshot.
func (r *Router) Status() Status {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{Counters: r.ctr, Recent: slices.Clone(r.recent)}
	for _, u := range r.users {
		st.Destinations += len(u.dest)
	}
	st.Counters.Direct = map[string]uint64{}
	for k, v := range r.ctr.Direct {
		st.Counters.Direct[k] = v
	}
	for _, c := range r.conv {
		c.dropExpired(now)
		cs := ConverterStatus{Relay: c.Name, Tickets: len(c.tickets), RTTms: float64(c.rtt.Microseconds()) / 1000,
			Used: c.used, Failures: c.fails, LastError: c.lastErr}
		if c.addr.IsValid() {
			cs.Address = c.addr.String()
		}
		if now.Before(c.failedUntil) {
			cs.FailedUntil = c.failedUntil
		}
		st.Converters = append(st.Converters, cs)
	}
	for _, u := range r.users {
		for k, e := range u.dest {
			if e.native || !now.Before(e.expires) {
				continue
			}
			st.NoMPTCP = append(st.NoMPTCP, DestStatus{UID: u.uid, Destination: k.String(), Expires: e.expires, Convertible: !e.noConvert, Conversions: e.conversions})
		}
	}
	slices.SortFunc(st.NoMPTCP, func(a, b DestStatus) int { return b.Expires.Compare(a.Expires) })
	if len(st.NoMPTCP) > maxStatusDests {
		st.NoMPTCP = st.NoMPTCP[:maxStatusDests]
	}
	return st
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// String names a decision for logs.
func (d Decision) String() string {
	if d.Convert {
		return fmt.Sprintf("convert via %s (%v)", d.Name, d.Converter)
	}
	return "direct (" + d.Why + ")"
}
