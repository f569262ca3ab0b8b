package relay

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/convert"
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// The converter role (config `convert:`, docs/convert.md): an RFC 8803
// Transport Converter on the relay, so members reach servers that do not
// speak MPTCP. Members get single-use tickets over the control protocol
// (OpConvert), each bound to the member and to the address the session's
// requests come from, valid for the lease; the converter (internal/convert)
// asks ticketStore before it reads or forwards anything else. Single use is
// the answer to TCP Fast Open replays: a captured SYN carrying a ticket
// cannot be replayed, even from the member's own (spoofed) address.

// maxTicketsPerMember bounds the outstanding tickets of one member (a
// member asks for a few at a time and refills). The new conversions of a
// member are bounded by its request rate (rate.per_member) times the batch
// (proto.MaxTickets): 1,600/s with the defaults 50/s x 32 (docs/convert.md).
const maxTicketsPerMember = 64

// DefaultConvertPort is the converter's TCP port when `convert.listen`
// gives none.
const DefaultConvertPort = 45674

type ticketInfo struct {
	member  string
	key     proto.Key
	client  netip.Addr
	expires time.Time
}

// ticketStore is shared by the event loop (issue) and the converter's
// goroutines (take).
type ticketStore struct {
	mu      sync.Mutex
	tickets map[[proto.TicketLen]byte]ticketInfo
	// perMember counts outstanding tickets by member name: a member's
	// keys (a rotation, a second key) share its quota.
	perMember map[string]int
}

func newTicketStore() *ticketStore {
	return &ticketStore{tickets: map[[proto.TicketLen]byte]ticketInfo{}, perMember: map[string]int{}}
}

// issue makes up to n tickets for the member (name) at client, valid
// until expires: fewer when the member's outstanding tickets, under any of
// its keys, would exceed maxTicketsPerMember, a quota refusal when it
// holds that many already.
func (t *ticketStore) issue(key proto.Key, member string, client netip.Addr, n int, expires time.Time, now time.Time) ([][proto.TicketLen]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	n = min(n, maxTicketsPerMember-t.perMember[member])
	if n <= 0 {
		return nil, &proto.Error{Op: proto.OpConvert, Reason: proto.ReasonQuota}
	}
	out := make([][proto.TicketLen]byte, n)
	for i := range out {
		if _, err := rand.Read(out[i][:]); err != nil {
			return nil, err
		}
		t.tickets[out[i]] = ticketInfo{member: member, key: key, client: client, expires: expires}
	}
	t.perMember[member] += n
	return out, nil
}

// take consumes a ticket presented from from: it must exist, be unexpired
// and come from the address it was issued to. It returns the ticket's
// member name and key (the key a rotation moved it to, ticketStore.rekey).
func (t *ticketStore) take(ticket []byte, from netip.AddrPort, now time.Time) (string, proto.Key, error) {
	if len(ticket) != proto.TicketLen {
		return "", proto.Key{}, fmt.Errorf("ticket of %d bytes, want %d", len(ticket), proto.TicketLen)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := [proto.TicketLen]byte(ticket)
	ti, ok := t.tickets[k]
	if !ok {
		return "", proto.Key{}, errors.New("unknown or already used ticket")
	}
	if ti.client != from.Addr().Unmap() {
		// Not consumed: the genuine member may still use it.
		return "", proto.Key{}, fmt.Errorf("ticket of %s presented from %v", ti.client, from.Addr())
	}
	delete(t.tickets, k)
	t.perMember[ti.member]--
	if now.After(ti.expires) {
		return "", proto.Key{}, errors.New("expired ticket")
	}
	return ti.member, ti.key, nil
}

// revoke drops every ticket of keys keep refuses (members removed).
func (t *ticketStore) revoke(keep func(proto.Key) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, ti := range t.tickets {
		if !keep(ti.key) {
			delete(t.tickets, k)
			t.perMember[ti.member]--
		}
	}
}

func (t *ticketStore) expireLocked(now time.Time) {
	for k, ti := range t.tickets {
		if now.After(ti.expires) {
			delete(t.tickets, k)
			t.perMember[ti.member]--
		}
	}
	for k, n := range t.perMember {
		if n <= 0 {
			delete(t.perMember, k)
		}
	}
}

// converter is the running converter of a relay.
type converter struct {
	srv     *convert.Server
	ln      net.Listener
	tickets *ticketStore
	pol     atomic.Pointer[destination.Policy]
	port    uint16
	port6   uint16 // 0: no IPv6 listener
}

// convertDone is a finished conversion, handed to the event loop for the
// attribution log.
type convertDone struct {
	member   string
	key      proto.Key // the ticket's member key (charged in the ledger)
	dst      netip.AddrPort
	up, down int64
	err      error
	at       time.Time
}

// startConverter opens the converter's listener (MPTCP, TCP Fast Open).
func (s *Server) startConverter(ctx context.Context) error {
	set := s.static.Convert
	ln, tfoErr, err := convert.Listen(ctx, "tcp4", set.Listen.String(), 0)
	if err != nil {
		return fmt.Errorf("convert.listen %v: %w", set.Listen, err)
	}
	if tfoErr != nil {
		s.log.Warn("converter without TCP Fast Open (one round trip more per connection)", "err", tfoErr)
	} else if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_fastopen"); err == nil {
		var v int
		if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &v); err == nil && v&2 == 0 {
			s.log.Warn("net.ipv4.tcp_fastopen lacks bit 2 (server) in this namespace: the converter costs one round trip more per connection (set it to 3)", "value", v)
		}
	}
	c := &converter{ln: ln, tickets: newTicketStore(), port: set.Listen.Port()}
	if set.Listen6.IsValid() {
		ln6, _, err := convert.Listen(ctx, "tcp6", set.Listen6.String(), 0)
		if err != nil {
			ln.Close()
			return fmt.Errorf("convert.listen6 %v: %w", set.Listen6, err)
		}
		c.ln, c.port6 = newBothListener(ln, ln6), set.Listen6.Port()
	}
	c.srv = &convert.Server{
		Authorize: func(ticket []byte, from netip.AddrPort) (string, any, error) {
			member, key, err := c.tickets.take(ticket, from, time.Now())
			return member, key, err
		},
		Allowed: func(dst netip.AddrPort) error {
			p := c.pol.Load()
			if p == nil {
				return errors.New("no policy")
			}
			return p.Check(dst)
		},
		Done: func(member string, tag any, dst netip.AddrPort, up, down int64, err error) {
			key, _ := tag.(proto.Key)
			select {
			case s.ev.convDone <- convertDone{member: member, key: key, dst: dst, up: up, down: down, err: err, at: time.Now()}:
			default: // the loop is far behind: metrics still count it
			}
			s.met.conversions.WithLabelValues(conversionResult(err)).Inc()
			s.met.convertBytes.Add(float64(up + down))
		},
		Log:          s.log.With("component", "converter"),
		MaxConns:     set.MaxConns,
		StallTimeout: set.StallTimeout,
	}
	s.conv = c
	s.syncConverterPolicy()
	s.log.Info("converter listening", "listen", ln.Addr().String(), "tfo", tfoErr == nil)
	return nil
}

// syncConverterPolicy gives the converter's goroutines a copy of the
// destination policy (the loop replaces and refreshes s.pol).
func (s *Server) syncConverterPolicy() {
	if s.conv == nil || s.pol == nil {
		return
	}
	p := &destination.Policy{Allow: s.pol.Allow, Deny: s.pol.Deny, DenyPorts: s.pol.DenyPorts}
	p.SetOwn(s.pol.Own())
	s.conv.pol.Store(p)
}

// conversionResult bounds the metric label: ok or the RFC 8803 error name.
func conversionResult(err error) string {
	if err == nil {
		return "ok"
	}
	var r *convert.Refusal
	if errors.As(err, &r) {
		switch r.Code {
		case convert.CodeNotAuthorized:
			return "not-authorized"
		case convert.CodeConnectionReset:
			return "refused"
		case convert.CodeDestinationUnreachable:
			return "unreachable"
		case convert.CodeResourceExceeded:
			return "resource-exceeded"
		case convert.CodeMalformedMessage, convert.CodeUnsupportedVersion, convert.CodeUnsupportedMessage:
			return "malformed"
		}
		return "refused-other"
	}
	return "error"
}

// serveConvert handles OpConvert in the event loop.
func (s *Server) serveConvert(ses *session, req *proto.ConvertRequest) answer {
	if s.conv == nil {
		return refused(proto.ReasonUnsupported)
	}
	// A ticket is valid from the session's address only, so the member
	// reaches the converter over the session's family.
	port := s.conv.port
	if ses.addr.Addr().Is6() {
		if port = s.conv.port6; port == 0 {
			s.log.Info("converter tickets refused: the session is over IPv6 and convert.listen6 is not set", "member", ses.name)
			return refused(proto.ReasonUnsupported)
		}
	}
	now := s.now()
	lease := s.set.Lease
	tickets, err := s.conv.tickets.issue(ses.peer, ses.name, ses.addr.Addr(), int(req.Count), now.Add(lease), now)
	if err != nil {
		return failed(err, proto.ReasonInternal)
	}
	return success(&proto.ConvertReply{Converter: netip.AddrPortFrom(s.detourAddr(ses), port), Tickets: tickets, Lease: lease})
}

// logConversion writes a finished conversion to the attribution log.
func (s *Server) logConversion(d convertDone) {
	s.ledgerConversion(d)
	ev := attrEvent{Time: d.at, Event: "convert", Member: d.member, Server: d.dst.String()}
	b := uint64(d.up + d.down)
	ev.Bytes = &b
	up, down := uint64(d.up), uint64(d.down)
	ev.BytesUp, ev.BytesDown = &up, &down
	if d.err != nil {
		ev.Result = conversionResult(d.err)
	} else {
		ev.Result = "ok"
	}
	s.logAttr(ev)
}
