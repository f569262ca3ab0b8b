package bench

import (
	"fmt"

	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
)

// lbTrace records the client's MPTCP events during a churn trial, so that
// each broken connection can be told apart: which announcements it
// received, which subflows it had when the route first moved, and how they
// ended. The in-kernel PM sends these events too.
type lbTrace struct {
	ev    *mptcppm.Events
	start time.Time
	mu    sync.Mutex
	recs  []lbEvent
	done  chan struct{}
	once  sync.Once
}

type lbEvent struct {
	at time.Duration
	e  mptcppm.Event
}

func startLBTrace(netns string, start time.Time) (*lbTrace, error) {
	ev, err := mptcppm.ListenEvents(mptcppm.Options{NetNS: netns, ReadBuffer: 32 << 20})
	if err != nil {
		return nil, err
	}
	t := &lbTrace{ev: ev, start: start, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		for {
			evs, err := ev.Receive()
			if err != nil {
				return
			}
			at := time.Since(t.start)
			t.mu.Lock()
			for _, e := range evs {
				t.recs = append(t.recs, lbEvent{at, e})
			}
			t.mu.Unlock()
		}
	}()
	return t, nil
}

func (t *lbTrace) stop() {
	t.once.Do(func() { t.ev.Close() })
	<-t.done
}

var lbPortRE = regexp.MustCompile(`:(\d+)->`)

// lbConnSummary is what the trace says about one connection.
type lbConnSummary struct {
	token     uint32
	port      uint16
	announced []string // remote addresses announced (rem_id), with times
	subflows  []string // joins established / closed, with times
	joinedAt  []time.Duration
	closedAt  time.Duration
	closed    bool
	estAt     time.Duration // ESTABLISHED (fully established), -1: none
}

// summarize groups the events by connection (token). firstChange is when
// the route first moved.
func (t *lbTrace) summarize() map[uint16]*lbConnSummary {
	t.mu.Lock()
	defer t.mu.Unlock()
	byToken := map[uint32]*lbConnSummary{}
	get := func(tok uint32) *lbConnSummary {
		c := byToken[tok]
		if c == nil {
			c = &lbConnSummary{token: tok, estAt: -1}
			byToken[tok] = c
		}
		return c
	}
	sec := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) }
	for _, r := range t.recs {
		e := r.e
		c := get(e.Token)
		switch e.Type {
		case mptcppm.EventCreated, mptcppm.EventEstablished:
			if e.Type == mptcppm.EventEstablished {
				c.estAt = r.at
			}
			if e.ServerSide != 0 || e.Flags&mptcppm.EventFlagServerSide != 0 {
				c.port = e.Remote.Port() // the client's port (the balancer masquerades, keeping it)
			} else {
				c.port = e.Local.Port()
			}
		case mptcppm.EventAnnounced:
			c.announced = append(c.announced, fmt.Sprintf("%s id %d at %s", e.Remote, e.RemoteID, sec(r.at)))
		case mptcppm.EventSubEstablished:
			c.joinedAt = append(c.joinedAt, r.at)
			c.subflows = append(c.subflows, fmt.Sprintf("+%s>%s at %s", e.Local.Addr(), e.Remote, sec(r.at)))
		case mptcppm.EventSubClosed:
			c.subflows = append(c.subflows, fmt.Sprintf("-%s>%s err %d at %s", e.Local.Addr(), e.Remote, e.Error, sec(r.at)))
		case mptcppm.EventClosed:
			c.closed, c.closedAt = true, r.at
		}
	}
	out := map[uint16]*lbConnSummary{}
	for _, c := range byToken {
		if c.port != 0 {
			out[c.port] = c
		}
	}
	return out
}

// lbDiagnose describes each broken connection (its error names its local
// port) and counts, over all connections, those that had fewer than want
// joins when the route first moved.
//
// recv are the receivers' log lines of the trial (clients they dropped,
// with the client's address and port): those of a broken connection's
// port are added to its detail.
func lbDiagnose(t *lbTrace, backends []*lbTrace, errs []error, firstChange time.Duration, want int, recv []string) (detail []string, short int) {
	conns := t.summarize()
	// Server side, by the client's port (the balancer's masquerade keeps
	// ports unless two clients collide).
	server := map[uint16][]*lbConnSummary{}
	for _, b := range backends {
		for p, c := range b.summarize() {
			server[p] = append(server[p], c)
		}
	}
	sideOf := func(p uint16) string {
		var parts []string
		for _, c := range server[p] {
			est := "no ESTABLISHED"
			if c.estAt >= 0 {
				est = "ESTABLISHED at " + strconv.FormatFloat(c.estAt.Seconds(), 'f', 2, 64)
			}
			closed := "open"
			if c.closed {
				closed = "closed at " + strconv.FormatFloat(c.closedAt.Seconds(), 'f', 2, 64)
			}
			parts = append(parts, fmt.Sprintf("token %08x %s, %d joins, subflows [%s], %s", c.token, est, len(c.joinedAt), strings.Join(c.subflows, ", "), closed))
		}
		if len(parts) == 0 {
			return "server: no events for this port"
		}
		return "server: " + strings.Join(parts, "; ")
	}
	receiverSaid := func(p uint16) string {
		var said []string
		for _, l := range recv {
			if strings.Contains(l, fmt.Sprintf(":%d ", p)) {
				said = append(said, strings.TrimSpace(l))
			}
		}
		if len(said) == 0 {
			return "receiver: nothing logged"
		}
		return "receiver: " + strings.Join(said, " | ")
	}
	for _, c := range conns {
		n := 0
		for _, at := range c.joinedAt {
			if at < firstChange {
				n++
			}
		}
		if n < want {
			short++
		}
	}
	for _, err := range errs {
		if err == nil {
			continue
		}
		m := lbPortRE.FindStringSubmatch(err.Error())
		if m == nil {
			detail = append(detail, fmt.Sprintf("? (no port in error): %v", err))
			continue
		}
		p, _ := strconv.ParseUint(m[1], 10, 16)
		c := conns[uint16(p)]
		if c == nil {
			detail = append(detail, fmt.Sprintf("port %d: no MPTCP events: %v", p, err))
			continue
		}
		n := 0
		for _, at := range c.joinedAt {
			if at < firstChange {
				n++
			}
		}
		closed := "open"
		if c.closed {
			closed = "closed at " + strconv.FormatFloat(c.closedAt.Seconds(), 'f', 2, 64)
		}
		est := "client: no ESTABLISHED"
		if c.estAt >= 0 {
			est = "client: ESTABLISHED at " + strconv.FormatFloat(c.estAt.Seconds(), 'f', 2, 64)
		}
		detail = append(detail, fmt.Sprintf("port %d token %08x: %d joins before the first route change; %s; %s; announced [%s]; subflows [%s]; %s; %v; %s",
			p, c.token, n, est, sideOf(uint16(p)), strings.Join(c.announced, ", "), strings.Join(c.subflows, ", "), closed, shortReason(err), receiverSaid(uint16(p))))
	}
	sort.Strings(detail)
	return detail, short
}
