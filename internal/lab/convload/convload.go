// Package convload is the converter's load generator (docs/convert.md,
// docs/results/converter-speed), run by "mpdetour-lab convert-load" as
// "mpdetour-lab convert-load-member" in a lab node: a member that asks a
// relay for converter tickets over its control protocol, exactly as the
// agent does, and opens conversions with convert.Dial to a destination that
// answers the first byte with one byte and closes (Responder). Two
// modes: Idle holds that many conversions open without traffic, then checks
// that each still answers; Rate opens new conversions at a fixed rate (open
// loop: a slow converter shows as latency and lateness, not as a lower
// offered rate), each a one-byte request/response.
package convload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/convert"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// Options configure Run.
type Options struct {
	Relay    netip.AddrPort // relay control address (UDP)
	RelayKey proto.Key      // relay public key
	Key      proto.Key      // member private key
	Dst      netip.AddrPort // destination (a Responder)

	// Idle > 0: open this many conversions (Concurrency at a time), call
	// Opened, hold them until Release is closed (or Hold elapses, if
	// set), then check each with a one-byte request/response.
	Idle        int
	Concurrency int
	Hold        time.Duration
	Release     <-chan struct{}
	Opened      func(Result)

	// Rate > 0: start Rate conversions per second for Duration.
	Rate     float64
	Duration time.Duration
	// MaxInFlight bounds the rate mode's conversions in progress; a
	// scheduled conversion beyond it is not started and counts as an
	// error "overload".
	MaxInFlight int
}

// Percentiles of a latency sample, in ms.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Result is what Run measured.
type Result struct {
	Mode      string         `json:"mode"` // idle or rate
	Attempted int            `json:"attempted"`
	Converted int            `json:"converted"` // Dial returned a connection
	Failed    int            `json:"failed"`
	Errors    map[string]int `json:"errors,omitempty"` // by kind, first words
	ElapsedS  float64        `json:"elapsed_s"`
	// Idle: conversions open when Opened ran, and those that still
	// answered after the hold.
	Open  int `json:"open,omitempty"`
	Alive int `json:"alive,omitempty"`
	// Rate: offered and achieved (request/response completed) per second,
	// conversions started more than 10 ms after their scheduled time.
	OfferedRate  float64 `json:"offered_rate,omitempty"`
	AchievedRate float64 `json:"achieved_rate,omitempty"`
	Late         int     `json:"late,omitempty"`
	// Latencies: TicketWait (a ticket from the stock), Convert (convert.Dial:
	// connection to the converter, Convert message, the converter's dial and
	// reply), FirstByte (from the start of the Dial to the destination's
	// one-byte answer).
	TicketWaitMs Percentiles `json:"ticket_wait_ms"`
	ConvertMs    Percentiles `json:"convert_ms"`
	FirstByteMs  Percentiles `json:"first_byte_ms"`
	// Ticket requests made over the control protocol, and failed ones.
	TicketRequests int `json:"ticket_requests"`
	TicketErrors   int `json:"ticket_errors"`
}

// Run runs the load described by o.
func Run(ctx context.Context, o Options) (*Result, error) {
	if (o.Idle > 0) == (o.Rate > 0) {
		return nil, errors.New("convert load: exactly one of idle and rate")
	}
	rc, err := relayconn.Dial(relayconn.Relay{Name: "relay", Addr: o.Relay, PublicKey: o.RelayKey}, o.Key, relayconn.Options{})
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool := newTicketPool(rc)
	go pool.run(ctx, 2)
	// The first ticket tells the converter's address.
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	t, err := pool.get(wctx)
	wcancel()
	if err != nil {
		return nil, fmt.Errorf("no converter ticket: %w (%d requests, last error: %v)", err, pool.requests.Load(), pool.lastErr())
	}
	pool.unget(t)
	st := &loadStats{errors: map[string]int{}}
	var res *Result
	if o.Idle > 0 {
		res, err = idleLoad(ctx, o, pool, st)
	} else {
		res, err = rateLoad(ctx, o, pool, st)
	}
	if res != nil {
		res.TicketRequests, res.TicketErrors = int(pool.requests.Load()), int(pool.failures.Load())
	}
	return res, err
}

// loadStats collects outcomes from many goroutines.
type loadStats struct {
	mu                         sync.Mutex
	attempted, converted, fail int
	errors                     map[string]int
	ticketWait, conv, first    []time.Duration
}

func (s *loadStats) failure(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail++
	s.errors[errKind(err)]++
}

func (s *loadStats) fill(r *Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.Attempted, r.Converted, r.Failed = s.attempted, s.converted, s.fail
	if len(s.errors) > 0 {
		r.Errors = map[string]int{}
		for k, v := range s.errors {
			r.Errors[k] = v
		}
	}
	r.TicketWaitMs, r.ConvertMs, r.FirstByteMs = percentiles(s.ticketWait), percentiles(s.conv), percentiles(s.first)
}

// errKind names an error by its errno or remote error code, for counting.
func errKind(err error) string {
	var re *convert.RemoteError
	var errno syscall.Errno
	switch {
	case errors.As(err, &re):
		return "converter: " + re.Code.String()
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT):
		return "timeout"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.As(err, &errno):
		return errno.Error()
	}
	s := err.Error()
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) float64 {
		i := int(q*float64(len(s)-1) + 0.5)
		return float64(s[i].Microseconds()) / 1000
	}
	return Percentiles{N: len(s), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: at(1)}
}

// convertOne takes a ticket and converts; on success the connection is
// open to the destination.
func convertOne(ctx context.Context, pool *ticketPool, dst netip.AddrPort, st *loadStats) (*net.TCPConn, time.Time, error) {
	t0 := time.Now()
	t, err := pool.get(ctx)
	if err != nil {
		return nil, t0, fmt.Errorf("ticket: %w", err)
	}
	t1 := time.Now()
	c, err := convert.Dial(ctx, pool.converter(), dst, t[:], convert.DialOptions{Timeout: 10 * time.Second})
	pool.used()
	t2 := time.Now()
	st.mu.Lock()
	st.attempted++
	st.ticketWait = append(st.ticketWait, t1.Sub(t0))
	if err == nil {
		st.converted++
		st.conv = append(st.conv, t2.Sub(t1))
	}
	st.mu.Unlock()
	if err != nil {
		return nil, t1, err
	}
	return c.(*net.TCPConn), t1, nil
}

// ask writes one byte and waits for the destination's one-byte answer.
func ask(c *net.TCPConn, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{'?'}); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if b[0] != '!' {
		return fmt.Errorf("answer %q, want %q", b[0], '!')
	}
	return nil
}

func idleLoad(ctx context.Context, o Options, pool *ticketPool, st *loadStats) (*Result, error) {
	res := &Result{Mode: "idle"}
	conc := o.Concurrency
	if conc <= 0 {
		conc = 64
	}
	conns := make([]*net.TCPConn, o.Idle)
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= o.Idle || ctx.Err() != nil {
					return
				}
				c, _, err := convertOne(ctx, pool, o.Dst, st)
				if err != nil {
					st.failure(err)
					continue
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	for _, c := range conns {
		if c != nil {
			res.Open++
		}
	}
	res.ElapsedS = time.Since(start).Seconds()
	st.fill(res)
	if o.Opened != nil {
		o.Opened(*res)
	}
	var hold <-chan time.Time
	if o.Hold > 0 {
		hold = time.After(o.Hold)
	}
	select {
	case <-o.Release:
	case <-hold:
	case <-ctx.Done():
		return res, ctx.Err()
	}
	// Every held connection must still reach the destination.
	var alive atomic.Int64
	next.Store(0)
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(conns) {
					return
				}
				if conns[i] == nil {
					continue
				}
				if err := ask(conns[i], 10*time.Second); err != nil {
					st.failure(fmt.Errorf("after the hold: %w", err))
					continue
				}
				alive.Add(1)
			}
		})
	}
	wg.Wait()
	res.Alive = int(alive.Load())
	st.fill(res)
	return res, nil
}

func rateLoad(ctx context.Context, o Options, pool *ticketPool, st *loadStats) (*Result, error) {
	res := &Result{Mode: "rate", OfferedRate: o.Rate}
	maxIn := o.MaxInFlight
	if maxIn <= 0 {
		maxIn = 4096
	}
	n := int(o.Rate * o.Duration.Seconds())
	interval := time.Duration(float64(time.Second) / o.Rate)
	var inflight atomic.Int64
	var ok, late atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				wg.Wait()
				return res, ctx.Err()
			}
		}
		if time.Since(at) > 10*time.Millisecond {
			late.Add(1)
		}
		if inflight.Load() >= int64(maxIn) {
			st.mu.Lock()
			st.attempted++
			st.mu.Unlock()
			st.failure(errors.New("overload: too many conversions in progress"))
			continue
		}
		inflight.Add(1)
		wg.Go(func() {
			defer inflight.Add(-1)
			c, t1, err := convertOne(ctx, pool, o.Dst, st)
			if err != nil {
				st.failure(err)
				return
			}
			defer c.Close()
			if err := ask(c, 10*time.Second); err != nil {
				st.failure(fmt.Errorf("request: %w", err))
				return
			}
			d := time.Since(t1)
			st.mu.Lock()
			st.first = append(st.first, d)
			st.mu.Unlock()
			ok.Add(1)
		})
	}
	sent := time.Since(start)
	wg.Wait()
	res.ElapsedS = time.Since(start).Seconds()
	res.Late = int(late.Load())
	// Completed request/responses over the offered period (the tail after
	// the last start is not counted as extra time: it only adds latency).
	res.AchievedRate = float64(ok.Load()) / max(sent.Seconds(), o.Duration.Seconds())
	st.fill(res)
	return res, nil
}

// ticketPool keeps converter tickets in stock: at most
// maxOutstanding held or requested at once (the relay's per-member bound),
// requested 8 at a time by a few goroutines.
type ticketPool struct {
	c     *relayconn.Conn
	stock chan [proto.TicketLen]byte
	conv  atomic.Value // netip.AddrPort

	mu    sync.Mutex
	cond  *sync.Cond
	avail int // tickets that may still be requested
	err   error

	requests, failures atomic.Int64
}

const maxOutstanding = 64

func newTicketPool(c *relayconn.Conn) *ticketPool {
	p := &ticketPool{c: c, stock: make(chan [proto.TicketLen]byte, maxOutstanding), avail: maxOutstanding}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *ticketPool) run(ctx context.Context, workers int) {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				p.mu.Lock()
				for p.avail < proto.MaxTickets && ctx.Err() == nil {
					p.cond.Wait()
				}
				if ctx.Err() != nil {
					p.mu.Unlock()
					return
				}
				p.avail -= proto.MaxTickets
				p.mu.Unlock()
				p.requests.Add(1)
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				conv, ts, _, err := p.c.Convert(rctx, proto.MaxTickets)
				cancel()
				if err != nil {
					p.failures.Add(1)
					p.mu.Lock()
					p.avail += proto.MaxTickets
					p.err = err
					p.mu.Unlock()
					select {
					case <-time.After(10 * time.Millisecond):
					case <-ctx.Done():
						return
					}
					continue
				}
				p.conv.Store(conv)
				if short := proto.MaxTickets - len(ts); short > 0 {
					p.release(short)
				}
				for _, t := range ts {
					p.stock <- t
				}
			}
		})
	}
	wg.Wait()
}

func (p *ticketPool) release(n int) {
	p.mu.Lock()
	p.avail += n
	p.cond.Signal()
	p.mu.Unlock()
}

func (p *ticketPool) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *ticketPool) get(ctx context.Context) ([proto.TicketLen]byte, error) {
	select {
	case t := <-p.stock:
		return t, nil
	case <-ctx.Done():
		return [proto.TicketLen]byte{}, ctx.Err()
	}
}

// unget puts back a ticket that was not used.
func (p *ticketPool) unget(t [proto.TicketLen]byte) { p.stock <- t }

// used returns a ticket's place once the converter has had it (used or
// not, it is no longer ours to present).
func (p *ticketPool) used() { p.release(1) }

func (p *ticketPool) converter() netip.AddrPort {
	a, _ := p.conv.Load().(netip.AddrPort)
	return a
}

// Responder answers each connection's first byte with '!' and
// closes (so the responder side, not the client, keeps TIME_WAIT). Unlike
// benchtool.LatencyServer it has no deadline: an idle connection is held until its
// byte comes.
type Responder struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// NewResponder serves ln until Close.
func NewResponder(ln net.Listener) *Responder {
	s := &Responder{ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Go(func() {
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					c.Close()
				}()
				var b [1]byte
				if _, err := io.ReadFull(c, b[:]); err == nil {
					_, _ = c.Write([]byte{'!'})
				}
			})
		}
	})
	return s
}

// Open is the number of connections held now.
func (s *Responder) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting, closes every held connection and waits.
func (s *Responder) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}
