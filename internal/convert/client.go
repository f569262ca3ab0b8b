package convert

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultClientTimeout bounds Dial when neither the context nor the options
// give a deadline: connection to the converter, the converter's own dial
// to the destination (DefaultDialTimeout there too) and its reply.
const DefaultClientTimeout = 15 * time.Second

// DialOptions tune Dial; the zero value is fine.
type DialOptions struct {
	// Dialer is the base for the connection to the converter (LocalAddr,
	// KeepAlive, Control...). Dial works on a copy with MPTCP on and, unless
	// NoFastOpen, TCP_FASTOPEN_CONNECT set after the Dialer's own Control.
	Dialer *net.Dialer
	// NoFastOpen keeps the Convert message out of the SYN.
	NoFastOpen bool
	// Timeout bounds the whole Dial, reply included; DefaultClientTimeout
	// if zero and ctx has no earlier deadline.
	Timeout time.Duration
}

// RemoteError is the converter's Error TLV. It unwraps to the errno an
// application would have seen connecting to the destination itself, so
// errors.Is(err, syscall.ECONNREFUSED) and friends work:
//
//	Connection Reset (96)            ECONNREFUSED (the destination answered the SYN with a RST)
//	Destination Unreachable (97)     EHOSTUNREACH; ENETUNREACH with value 1; ETIMEDOUT with value 2
//	Not Authorized (32)              EACCES (bad ticket: value 1; destination policy: value 2)
//	Resource Exceeded (64)           EAGAIN
//	Network Failure (65)             ENETDOWN
//	anything else                    EPROTO
//
// An error that is not a *RemoteError (errors.As) means the converter
// itself could not be reached or broke the protocol: the caller's cue to
// go direct.
type RemoteError struct {
	Code  ErrorCode
	Value []byte
}

func (e *RemoteError) Error() string {
	detail := ""
	switch {
	case e.Code == CodeNotAuthorized && first(e.Value) == NotAuthorizedTicket:
		detail = ", ticket refused"
	case e.Code == CodeNotAuthorized && first(e.Value) == NotAuthorizedDestination:
		detail = ", destination refused by policy"
	case e.Code == CodeUnsupportedMessage || e.Code == CodeUnsupportedTCPOption || e.Code == CodeUnsupportedVersion:
		detail = fmt.Sprintf(", value %d", first(e.Value))
	}
	return fmt.Sprintf("converter: %s%s: %v", e.Code, detail, e.Unwrap())
}

// Unwrap returns the errno equivalent of the error code.
func (e *RemoteError) Unwrap() error {
	switch e.Code {
	case CodeConnectionReset:
		return syscall.ECONNREFUSED
	case CodeDestinationUnreachable:
		switch first(e.Value) {
		case UnreachableNet:
			return syscall.ENETUNREACH
		case UnreachableTimeout:
			return syscall.ETIMEDOUT
		}
		return syscall.EHOSTUNREACH
	case CodeNotAuthorized:
		return syscall.EACCES
	case CodeResourceExceeded:
		return syscall.EAGAIN
	case CodeNetworkFailure:
		return syscall.ENETDOWN
	}
	return syscall.EPROTO
}

// Timeout reports whether the destination timed out (net.Error style).
func (e *RemoteError) Timeout() bool { return errors.Is(e.Unwrap(), syscall.ETIMEDOUT) }

// Dial opens an MPTCP connection to the converter, asks it to connect to
// dst with ticket as credentials, and returns the connection once the
// converter has connected to dst. The connection is a *net.TCPConn (on the
// MPTCP socket), so (*net.TCPConn).ReadFrom/WriteTo keep their splice path.
//
// TCP Fast Open: TCP_FASTOPEN_CONNECT makes connect() defer the SYN to the
// first write when the kernel holds a TFO cookie for the converter; the
// Convert message then travels in the SYN and the conversion costs no round
// trip. The first connection to a converter (no cookie yet) is an ordinary
// handshake whose SYN asks for a cookie; the message goes right after it,
// one round trip later, and the converter's SYN+ACK leaves the cookie for
// the next connections. Kernels without TFO for MPTCP refuse the socket
// option; Dial then simply connects without it.
//
// Errors are *net.OpError (Op "dial", Addr dst); see RemoteError for the
// converter's refusals.
func Dial(ctx context.Context, converter, dst netip.AddrPort, ticket []byte, opts DialOptions) (net.Conn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(dst), Err: err}
	}
	req, err := (&Message{Connect: &Connect{Dst: dst}, Ticket: ticket}).Marshal()
	if err != nil {
		return nil, opErr(err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultClientTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	d := net.Dialer{}
	if opts.Dialer != nil {
		d = *opts.Dialer
	}
	d.SetMultipathTCP(true)
	if !opts.NoFastOpen {
		// Best effort: without it the message goes after the handshake.
		fastOpen := func(c syscall.RawConn) {
			_ = c.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1)
			})
		}
		// The Dialer's own hook runs first; ControlContext, if set, is the
		// one net.Dialer calls.
		if base := d.ControlContext; base != nil {
			d.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
				if err := base(ctx, network, address, c); err != nil {
					return err
				}
				fastOpen(c)
				return nil
			}
		} else {
			base := d.Control
			d.Control = func(network, address string, c syscall.RawConn) error {
				if base != nil {
					if err := base(network, address, c); err != nil {
						return err
					}
				}
				fastOpen(c)
				return nil
			}
		}
	}
	c, err := d.DialContext(ctx, "tcp", converter.String())
	if err != nil {
		return nil, opErr(fmt.Errorf("converter %v: %w", converter, err))
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, opErr(fmt.Errorf("converter %v: dialer returned %T", converter, c))
	}
	// The context ends the exchange below: the deadline, and cancellation
	// through an immediate deadline.
	tc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (net.Conn, error) {
		tc.Close()
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, opErr(err)
	}
	// With a cached cookie this write is what sends the SYN, message inside.
	if _, err := tc.Write(req); err != nil {
		return fail(fmt.Errorf("converter %v: sending the Convert message: %w", converter, err))
	}
	reply, err := ReadMessage(tc)
	if err != nil {
		return fail(fmt.Errorf("converter %v: reading its reply: %w", converter, err))
	}
	if reply.Error != nil {
		return fail(&RemoteError{Code: reply.Error.Code, Value: reply.Error.Value})
	}
	if !stop() { // the context ended just now
		return fail(ctx.Err())
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}
