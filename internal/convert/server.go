package convert

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Values of the first Error TLV value byte that mpdetour sends with some
// codes; RFC 8803 leaves them to the implementation. Clients that do not
// know them still get the right code.
const (
	// With CodeNotAuthorized.
	NotAuthorizedTicket      byte = 1 // the ticket is missing, unknown, expired or replayed
	NotAuthorizedDestination byte = 2 // the destination policy refuses the destination
	// With CodeDestinationUnreachable.
	UnreachableHost    byte = 0 // EHOSTUNREACH (or an unspecified unreachable)
	UnreachableNet     byte = 1 // ENETUNREACH
	UnreachableTimeout byte = 2 // the destination did not answer the SYN in time
)

// MPTCPKind is the TCP option kind of Multipath TCP, the one extension the
// converter offers (its answer to an Info TLV).
const MPTCPKind = 30

// Defaults of the Server's settings.
const (
	DefaultHeaderTimeout = 5 * time.Second
	DefaultDialTimeout   = 10 * time.Second
	DefaultMaxConns      = 1024
	// DefaultLingerTimeout bounds how long a refused connection is drained
	// after the Error TLV went out, so the client reads the error rather
	// than a reset.
	DefaultLingerTimeout = time.Second
)

// spareSplicePipes bounds the empty splice pipes a Server keeps for reuse
// (two descriptors each); conversions moving data hold their own.
const spareSplicePipes = 64

// Server is a Transport Converter. Every dependency is a field; the zero
// value refuses everything (nil Authorize or Allowed fail closed).
type Server struct {
	// Authorize validates a ticket from the member's address and returns
	// the member's name and an opaque tag handed back to Done (the relay:
	// the ticket's member key). It is called before anything else happens with
	// the connection: no byte of client data is forwarded, and no
	// connection to the destination attempted, unless it returned nil.
	// Replay protection is its job.
	Authorize func(ticket []byte, from netip.AddrPort) (member string, tag any, err error)
	// Allowed is the destination policy (the relay passes
	// (*destination.Policy).Check).
	Allowed func(dst netip.AddrPort) error
	// Done is called once per connection whose Convert message was read,
	// and for Resource Exceeded refusals (member "", no destination):
	// member ("" if not authenticated) and Authorize's tag (nil if not
	// authenticated), destination (invalid if none),
	// bytes client to destination (up) and back (down), and why it ended
	// (nil after a clean close in both directions; a *Refusal if the
	// converter refused it).
	Done func(member string, tag any, dst netip.AddrPort, up, down int64, err error)
	// Log gets one line per refusal and per ended conversion; nil discards.
	Log *slog.Logger

	// HeaderTimeout bounds the arrival of the whole Convert message
	// (slow or silent clients); DefaultHeaderTimeout if zero.
	HeaderTimeout time.Duration
	// DialTimeout bounds the connection to the destination; DefaultDialTimeout if zero.
	DialTimeout time.Duration
	// LingerTimeout bounds the drain after an Error TLV; DefaultLingerTimeout if zero.
	LingerTimeout time.Duration
	// StallTimeout, if positive, ends a conversion (resetting both sides)
	// when a side has had data outstanding and none of it acknowledged for
	// that long: a peer that stops reading (zero window) or vanishes. It is
	// TCP_USER_TIMEOUT on plain TCP sockets and a watch of MPTCP_INFO on
	// MPTCP ones, which refuse that option. Zero: no limit (keepalives only).
	StallTimeout time.Duration
	// MaxConns bounds the conversions handled at once; DefaultMaxConns if
	// zero. Beyond it a few connections (MaxConns/16, at least 4) are
	// answered Resource Exceeded at once; beyond those the converter stops
	// accepting and new clients wait in the listen backlog.
	MaxConns int
	// Dial opens the connection to the destination; it must return a
	// *net.TCPConn (splice). Nil means a net.Dialer with MPTCP off: the
	// destination does not speak MPTCP, that is the point. The relay can
	// pass its own (source address, namespace); tests pass one that dials
	// from the converter's namespace.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)

	mu      sync.Mutex
	running map[*running]struct{} // authenticated conversions (End)
}

// running is an authenticated conversion: its Authorize tag and how to
// end it.
type running struct {
	tag    any
	cancel context.CancelFunc
}

// End ends (resets both sides of) every running conversion whose
// Authorize tag match accepts, and returns how many: the relay ends the
// conversions of a member it revokes.
func (s *Server) End(match func(tag any) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for r := range s.running {
		if match(r.tag) {
			r.cancel()
			n++
		}
	}
	return n
}

// track registers an authenticated conversion until the returned func.
func (s *Server) track(tag any, cancel context.CancelFunc) (untrack func()) {
	r := &running{tag: tag, cancel: cancel}
	s.mu.Lock()
	if s.running == nil {
		s.running = map[*running]struct{}{}
	}
	s.running[r] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.running, r)
		s.mu.Unlock()
	}
}

// Refusal is why the converter refused a connection: the Error TLV it sent
// and the underlying cause.
type Refusal struct {
	Code  ErrorCode
	Value byte
	Err   error
}

func (r *Refusal) Error() string { return fmt.Sprintf("refused (%s): %v", r.Code, r.Err) }
func (r *Refusal) Unwrap() error { return r.Err }

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

func orDefault[T int | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// Listen opens the converter's listener: MPTCP (falls back to TCP where
// the kernel has no MPTCP) with TCP Fast Open enabled on the listening
// socket, so a cached client receives the Convert message in its SYN. The
// kernel also needs bit 2 of net.ipv4.tcp_fastopen (value 2 or 3) in the
// listener's namespace. tfoErr says why TFO could not be enabled (the
// listener works without it, at one round trip more).
func Listen(ctx context.Context, network, address string, tfoQueue int) (ln net.Listener, tfoErr error, err error) {
	if tfoQueue <= 0 {
		tfoQueue = 256
	}
	lc := net.ListenConfig{
		Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) {
				tfoErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN, tfoQueue)
			})
		},
	}
	lc.SetMultipathTCP(true)
	ln, err = lc.Listen(ctx, network, address)
	if err != nil {
		return nil, nil, err
	}
	if tfoErr != nil {
		tfoErr = fmt.Errorf("TCP_FASTOPEN on the converter listener: %w", tfoErr)
	}
	return ln, tfoErr, nil
}

// Serve accepts connections on ln until ctx is done or ln fails, and
// converts each. It closes ln, ends every conversion still running when ctx
// is done, and returns after all of them are gone (nil if ctx ended it).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	maxConns := orDefault(s.MaxConns, DefaultMaxConns)
	sem := make(chan struct{}, maxConns)
	// A few more connections than MaxConns are accepted only to be told
	// Resource Exceeded at once (the client can go direct instead of
	// waiting); beyond those, new clients wait in the listen backlog.
	overflow := make(chan struct{}, max(maxConns/16, 4))
	// Empty splice pipes for reuse, closed once every conversion is gone.
	pipes := newPipePool(spareSplicePipes)
	defer pipes.close()
	var wg sync.WaitGroup
	var err error
	backoff := 5 * time.Millisecond
accept:
	for {
		slot := sem
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break accept
		default:
			select {
			case sem <- struct{}{}:
			case overflow <- struct{}{}:
				slot = overflow
			case <-ctx.Done():
				break accept
			}
		}
		c, aerr := ln.Accept()
		if aerr != nil {
			<-slot
			if ctx.Err() != nil {
				break
			}
			if errors.Is(aerr, syscall.EMFILE) || errors.Is(aerr, syscall.ENFILE) ||
				errors.Is(aerr, syscall.ENOBUFS) || errors.Is(aerr, syscall.ENOMEM) ||
				errors.Is(aerr, syscall.ECONNABORTED) {
				s.log().Warn("convert: accept", "err", aerr)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			err = aerr
			break
		}
		backoff = 5 * time.Millisecond
		if slot == overflow { // a slot may have freed while Accept waited
			select {
			case sem <- struct{}{}:
				<-overflow
				slot = sem
			default:
			}
		}
		tc, ok := c.(*net.TCPConn)
		if !ok { // only TCP listeners make sense; splice needs *net.TCPConn
			c.Close()
			<-slot
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slot }()
			if slot == overflow {
				s.busy(ctx, tc, maxConns)
				return
			}
			s.handle(ctx, tc, pipes)
		}()
	}
	cancel()
	ln.Close()
	wg.Wait()
	return err
}

// busy answers Resource Exceeded without reading the message.
func (s *Server) busy(ctx context.Context, client *net.TCPConn, maxConns int) {
	stop := context.AfterFunc(ctx, func() { abort(client) })
	defer stop()
	defer client.Close()
	log := s.log().With("from", addrPort(client.RemoteAddr()).String())
	s.refuse(client, "", nil, netip.AddrPort{}, log, &Refusal{Code: CodeResourceExceeded, Err: fmt.Errorf("%d connections already", maxConns)})
}

// handle converts one connection.
func (s *Server) handle(ctx context.Context, client *net.TCPConn, pipes *pipePool) {
	ctx, cancel := context.WithCancel(ctx) // End cancels it
	defer cancel()
	stop := context.AfterFunc(ctx, func() { abort(client) })
	defer stop()
	defer client.Close()
	from := addrPort(client.RemoteAddr())
	log := s.log().With("from", from.String())

	client.SetReadDeadline(time.Now().Add(orDefault(s.HeaderTimeout, DefaultHeaderTimeout)))
	msg, err := ReadMessage(client)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) {
			s.refuse(client, "", nil, netip.AddrPort{}, log, &Refusal{Code: pe.Code, Value: first(pe.Value), Err: pe})
			return
		}
		// Nothing usable arrived (silence, a slow drip, a close, a reset):
		// nothing to answer; reset so the socket goes at once.
		log.Info("convert: no message", "err", err)
		abort(client)
		return
	}
	var dst netip.AddrPort
	if msg.Connect != nil {
		dst = msg.Connect.Dst
	}
	if msg.Ticket == nil {
		s.refuse(client, "", nil, dst, log, &Refusal{Code: CodeNotAuthorized, Value: NotAuthorizedTicket, Err: errors.New("no ticket")})
		return
	}
	if s.Authorize == nil {
		s.refuse(client, "", nil, dst, log, &Refusal{Code: CodeNotAuthorized, Value: NotAuthorizedTicket, Err: errors.New("no authorizer configured")})
		return
	}
	member, tag, err := s.Authorize(msg.Ticket, from)
	if err != nil {
		s.refuse(client, "", nil, dst, log, &Refusal{Code: CodeNotAuthorized, Value: NotAuthorizedTicket, Err: fmt.Errorf("ticket: %w", err)})
		return
	}
	log = log.With("member", member)
	defer s.track(tag, cancel)()
	// Authenticated from here on.
	switch {
	case msg.Error != nil:
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeUnsupportedMessage, Value: byte(TypeError), Err: errors.New("a client sent an Error TLV")})
		return
	case msg.ExtendedTCPHeader != nil:
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeUnsupportedMessage, Value: byte(TypeExtendedTCPHeader), Err: errors.New("a client sent an Extended TCP Header TLV")})
		return
	case msg.SupportedTCPExtensions != nil:
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeUnsupportedMessage, Value: byte(TypeSupportedTCPExtensions), Err: errors.New("a client sent a Supported TCP Extensions TLV")})
		return
	}
	var reply Message
	if msg.Info {
		reply.SupportedTCPExtensions = []byte{MPTCPKind}
	}
	if msg.Connect == nil {
		if msg.Info { // a query only: answer it and close
			s.answerAndLinger(client, &reply, log)
			s.done(member, tag, dst, 0, 0, nil)
			return
		}
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeMalformedMessage, Err: errors.New("no Connect TLV")})
		return
	}
	if dst.Port() == 0 || dst.Addr().IsUnspecified() {
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeMalformedMessage, Err: fmt.Errorf("destination %v is not connectable", dst)})
		return
	}
	if kinds := TCPOptionKinds(msg.Connect.TCPOptions); len(kinds) > 0 {
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeUnsupportedTCPOption, Value: kinds[0], Err: fmt.Errorf("TCP option kind %d asked for", kinds[0])})
		return
	}
	if s.Allowed == nil {
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeNotAuthorized, Value: NotAuthorizedDestination, Err: errors.New("no destination policy configured")})
		return
	}
	if err := s.Allowed(dst); err != nil {
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeNotAuthorized, Value: NotAuthorizedDestination, Err: fmt.Errorf("destination policy: %w", err)})
		return
	}
	dial := s.Dial
	if dial == nil {
		var d net.Dialer
		d.SetMultipathTCP(false)
		dial = d.DialContext
	}
	dctx, dcancel := context.WithTimeout(ctx, orDefault(s.DialTimeout, DefaultDialTimeout))
	c, err := dial(dctx, "tcp", dst.String())
	dcancel()
	if err != nil {
		code, value := dialErrorCode(err)
		s.refuse(client, member, tag, dst, log, &Refusal{Code: code, Value: value, Err: err})
		return
	}
	server, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		s.refuse(client, member, tag, dst, log, &Refusal{Code: CodeNetworkFailure, Err: fmt.Errorf("dialer returned %T, not a TCP connection", c)})
		return
	}
	log = log.With("dst", dst.String())
	stopServer := context.AfterFunc(ctx, func() { abort(server) })
	defer stopServer()
	defer server.Close()

	b, err := reply.Marshal()
	if err == nil {
		deadline := time.Now().Add(orDefault(s.HeaderTimeout, DefaultHeaderTimeout))
		err = waitRemoteKey(client, deadline)
		if err == nil {
			client.SetWriteDeadline(deadline)
			_, err = client.Write(b)
		}
	}
	if err != nil {
		abort(client)
		abort(server)
		log.Info("convert: reply", "err", err)
		s.done(member, tag, dst, 0, 0, err)
		return
	}
	client.SetDeadline(time.Time{})
	var watch []*net.TCPConn
	if s.StallTimeout > 0 {
		ms := int(s.StallTimeout / time.Millisecond)
		for _, tc := range []*net.TCPConn{client, server} {
			// MPTCP sockets refuse TCP_USER_TIMEOUT (ENOPROTOOPT, 6.18):
			// those are watched from user space instead.
			if err := setsockopt(tc, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms); err != nil {
				watch = append(watch, tc)
			}
		}
	}
	stalled := watchStalls(watch, s.StallTimeout, func() { abort(client); abort(server) })
	up, down, err := relay(client, server, pipes)
	if stalled() {
		err = fmt.Errorf("no data acknowledged for %v (a peer stopped reading or vanished): %w", s.StallTimeout, err)
	}
	log.Info("convert: done", "up", up, "down", down, "err", err)
	s.done(member, tag, dst, up, down, err)
}

// relay copies both ways until both directions ended, each direction with
// spliceCopy (splice(2) through a pipe taken only while data moves, see
// splice.go), so payload never enters user space. Nothing may wrap the two
// conns; the byte counts come from the copies.
//
// A FIN (EOF) is passed on as CloseWrite, so half-closed connections work;
// any error in one direction (a reset, a write to a peer that reset) resets
// both sockets, so the other side sees ECONNRESET as it would directly.
func relay(client, server *net.TCPConn, pipes *pipePool) (up, down int64, err error) {
	type result struct {
		n   int64
		err error
		up  bool
	}
	ch := make(chan result, 2)
	go func() {
		n, err := spliceCopy(server, client, pipes)
		ch <- result{n, err, true}
	}()
	go func() {
		n, err := spliceCopy(client, server, pipes)
		ch <- result{n, err, false}
	}()
	for range 2 {
		r := <-ch
		if r.up {
			up = r.n
		} else {
			down = r.n
		}
		if r.err == nil {
			to := client
			if r.up {
				to = server
			}
			if cerr := to.CloseWrite(); cerr != nil && err == nil {
				err = cerr
				abort(client)
				abort(server)
			}
			continue
		}
		if err == nil {
			err = r.err
		}
		abort(client)
		abort(server)
	}
	return up, down, err
}

// watchStalls polls the MPTCP-level send state (MPTCP_INFO) of conns: a
// connection with data outstanding whose snd_una has not moved for timeout
// is stalled (the peer's window stays shut or the peer is gone), and
// onStall runs. That is TCP_USER_TIMEOUT for sockets that lack it, without
// touching the payload path. The returned function stops the watch and
// reports whether a stall was seen.
func watchStalls(conns []*net.TCPConn, timeout time.Duration, onStall func()) (stop func() bool) {
	if len(conns) == 0 {
		return func() bool { return false }
	}
	quit, finished := make(chan struct{}), make(chan bool, 1)
	go func() {
		every := max(timeout/4, 50*time.Millisecond)
		tick := time.NewTicker(every)
		defer tick.Stop()
		last := make([]uint64, len(conns))
		since := make([]time.Time, len(conns))
		for {
			select {
			case <-quit:
				finished <- false
				return
			case now := <-tick.C:
				for i, c := range conns {
					writeSeq, sndUna, err := mptcpSendState(c)
					if err != nil || writeSeq == sndUna || sndUna != last[i] || since[i].IsZero() {
						last[i], since[i] = sndUna, now
						continue
					}
					if now.Sub(since[i]) >= timeout {
						onStall()
						<-quit
						finished <- true
						return
					}
				}
			}
		}
	}()
	return func() bool {
		close(quit)
		return <-finished
	}
}

// waitRemoteKey works around what 6.18 does with a reply written on a TCP
// Fast Open MPTCP connection before the client's final ACK arrived (the
// destination answered faster than half the client's round trip): the
// bytes stay in the MPTCP send queue and are never pushed, the client
// waits forever (seen in the lab: write_seq ahead of snd_una, the subflow
// with nothing sent). The final ACK carries the keys; once the remote key
// is known (MPTCP_INFO_FLAG_REMOTE_KEY_RECEIVED) a write goes out. Without
// TFO the handshake is complete before accept and this returns at once.
// It polls every millisecond: the wait is at most half a client round trip.
func waitRemoteKey(c *net.TCPConn, deadline time.Time) error {
	const mptcpInfo, flagRemoteKey = 1, 1 << 1
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for {
		var buf [16]byte
		var e unix.Errno
		l := uint32(len(buf))
		if err := rc.Control(func(fd uintptr) {
			_, _, e = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_MPTCP, mptcpInfo,
				uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
		}); err != nil {
			return err
		}
		if e != 0 || l < 12 {
			return nil // plain TCP (fallback) or an old kernel: nothing to wait for
		}
		if binary.NativeEndian.Uint32(buf[8:12])&flagRemoteKey != 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the client did not complete the handshake: %w", os.ErrDeadlineExceeded)
		}
		time.Sleep(time.Millisecond)
	}
}

// mptcpSendState reads write_seq and snd_una from struct mptcp_info
// (getsockopt SOL_MPTCP, MPTCP_INFO; offsets 16 and 24 since Linux 5.16).
func mptcpSendState(c *net.TCPConn) (writeSeq, sndUna uint64, err error) {
	const mptcpInfo = 1
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var buf [32]byte
	var serr error
	err = rc.Control(func(fd uintptr) {
		l := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_MPTCP, mptcpInfo,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
		if e != 0 {
			serr = e
		} else if l < 32 {
			serr = fmt.Errorf("mptcp_info of %d bytes", l)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, 0, err
	}
	return binary.NativeEndian.Uint64(buf[16:24]), binary.NativeEndian.Uint64(buf[24:32]), nil
}

// refuse answers with an Error TLV, drains what the client still sends for
// a moment (a close with unread data would reset the connection and could
// take the error with it) and closes. Nothing read is forwarded anywhere.
func (s *Server) refuse(client *net.TCPConn, member string, tag any, dst netip.AddrPort, log *slog.Logger, r *Refusal) {
	if dst.IsValid() {
		log = log.With("dst", dst.String())
	}
	log.Info("convert: refused", "code", r.Code.String(), "value", r.Value, "err", r.Err)
	m := Message{Error: &ErrorTLV{Code: r.Code, Value: []byte{r.Value}}}
	s.answerAndLinger(client, &m, log)
	s.done(member, tag, dst, 0, 0, r)
}

func (s *Server) answerAndLinger(client *net.TCPConn, m *Message, log *slog.Logger) {
	b, err := m.Marshal()
	if err != nil { // cannot happen with the messages the server builds
		log.Error("convert: encoding reply", "err", err)
		abort(client)
		return
	}
	// The answer must not be written before the handshake is complete
	// (waitRemoteKey): it would stay queued and the close reset it.
	if err := waitRemoteKey(client, time.Now().Add(orDefault(s.HeaderTimeout, DefaultHeaderTimeout))); err != nil {
		abort(client)
		return
	}
	deadline := time.Now().Add(orDefault(s.LingerTimeout, DefaultLingerTimeout))
	client.SetDeadline(deadline)
	if _, err := client.Write(b); err != nil {
		abort(client)
		return
	}
	client.CloseWrite()
	// Drain (bounded in time and bytes) until the client closes too.
	if _, err := io.CopyN(io.Discard, client, 1<<20); err != nil && !errors.Is(err, io.EOF) {
		abort(client)
	}
}

func (s *Server) done(member string, tag any, dst netip.AddrPort, up, down int64, err error) {
	if s.Done != nil {
		s.Done(member, tag, dst, up, down, err)
	}
}

// dialErrorCode maps the outcome of the destination dial to the Error TLV.
// The client turns it back into the errno an application would have seen
// connecting directly (see RemoteError).
func dialErrorCode(err error) (ErrorCode, byte) {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return CodeConnectionReset, 0 // the destination answered the SYN with a RST
	case errors.Is(err, syscall.ENETUNREACH):
		return CodeDestinationUnreachable, UnreachableNet
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EHOSTDOWN):
		return CodeDestinationUnreachable, UnreachableHost
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return CodeDestinationUnreachable, UnreachableTimeout
	}
	return CodeNetworkFailure, 0
}

// abort resets the connection: SO_LINGER 0, then close sends a RST.
func abort(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func setsockopt(c *net.TCPConn, level, opt, value int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, value) }); err != nil {
		return err
	}
	return serr
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

func first(b []byte) byte {
	if len(b) > 0 {
		return b[0]
	}
	return 0
}
