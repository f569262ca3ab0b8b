package convert

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// ConverterError is a failure of the converter itself on the way to a
// conversion (not reachable, no reply, a broken or non-destination reply):
// the caller's cue to go direct. Sent says whether the Convert message may
// have left (the socket is then used up and cannot be connected again).
type ConverterError struct {
	Stage string // "connect", "send", "reply"
	Sent  bool
	Err   error
}

func (e *ConverterError) Error() string {
	return fmt.Sprintf("converter %s: %v", e.Stage, e.Err)
}
func (e *ConverterError) Unwrap() error { return e.Err }

// DestinationError reports whether err (from ConvertFD) is about the
// destination as a direct connection would have seen it (refused,
// unreachable, timed out): the app should get that errno. Everything else
// (the converter unreachable, a ticket or policy refusal, resource
// exhaustion, a protocol failure) is the converter's problem: go direct.
func DestinationError(err error) (unix.Errno, bool) {
	var re *RemoteError
	if !errors.As(err, &re) {
		return 0, false
	}
	switch re.Code {
	case CodeConnectionReset, CodeDestinationUnreachable:
		var en unix.Errno
		if errors.As(re.Unwrap(), &en) {
			return en, true
		}
	}
	return 0, false
}

// ConvertFD turns the unconnected stream socket fd (an IPPROTO_MPTCP
// socket, someone else's: mpdetour run works on the application's own
// socket through pidfd_getfd) into a connection to dst through the
// converter: connect to the converter with TCP_FASTOPEN_CONNECT, send the
// Convert message (in the SYN when the kernel holds a TFO cookie for the
// converter), read exactly the reply and nothing more, so the
// destination's first bytes stay in the socket for the application. The
// socket's O_NONBLOCK is set for the exchange and restored after it (the
// file is shared with the application, which is blocked in connect()
// meanwhile).
//
// Errors: *RemoteError for the converter's Error TLV (DestinationError
// separates the destination's answers), *ConverterError for everything
// else. connectBy bounds the handshake with the converter (its SYN+ACK:
// a converter that does not answer is soon given up, so the caller can go
// direct), deadline the whole exchange (the converter's own connection to
// the destination included).
func ConvertFD(fd int, converter, dst netip.AddrPort, ticket []byte, connectBy, deadline time.Time) error {
	req, err := (&Message{Connect: &Connect{Dst: dst}, Ticket: ticket}).Marshal()
	if err != nil {
		return &ConverterError{Stage: "connect", Err: err}
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return &ConverterError{Stage: "connect", Err: fmt.Errorf("F_GETFL: %w", err)}
	}
	if fl&unix.O_NONBLOCK == 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl|unix.O_NONBLOCK); err != nil {
			return &ConverterError{Stage: "connect", Err: fmt.Errorf("F_SETFL: %w", err)}
		}
		defer unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl)
	}
	// Best effort: without it the message goes one round trip later.
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1)

	var sa unix.Sockaddr
	if converter.Addr().Is4() || converter.Addr().Is4In6() {
		a := converter.Addr().Unmap()
		if dom, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); dom == unix.AF_INET6 {
			sa = &unix.SockaddrInet6{Port: int(converter.Port()), Addr: netip.AddrFrom16(a.As16()).As16()}
		} else {
			sa = &unix.SockaddrInet4{Port: int(converter.Port()), Addr: a.As4()}
		}
	} else {
		sa = &unix.SockaddrInet6{Port: int(converter.Port()), Addr: converter.Addr().As16()}
	}
	switch err := unix.Connect(fd, sa); err {
	case nil: // TFO deferred the SYN to the first write, or already connected
	case unix.EINPROGRESS:
		if err := waitConnected(fd, connectBy); err != nil {
			return &ConverterError{Stage: "connect", Err: err}
		}
	default:
		return &ConverterError{Stage: "connect", Err: err}
	}
	for off := 0; off < len(req); {
		// MSG_NOSIGNAL: a converter that reset must not SIGPIPE us.
		n, err := unix.SendmsgN(fd, req[off:], nil, nil, unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EAGAIN || err == unix.EINPROGRESS || err == unix.EINTR:
			if err := waitFor(fd, unix.POLLOUT, connectBy); err != nil {
				return &ConverterError{Stage: "send", Sent: off > 0, Err: err}
			}
			if e, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); e != 0 {
				return &ConverterError{Stage: "send", Sent: off > 0, Err: unix.Errno(e)}
			}
		case err != nil:
			// With TFO the write is what sends the SYN: a refused or
			// unreachable converter shows here.
			return &ConverterError{Stage: "send", Sent: off > 0, Err: err}
		default:
			off += n
		}
	}
	// With TFO the SYN left with the message: the socket becomes writable
	// once the converter's SYN+ACK is in.
	if err := waitConnected(fd, connectBy); err != nil {
		return &ConverterError{Stage: "connect", Sent: true, Err: err}
	}
	hdr := make([]byte, HeaderLen)
	if err := readFull(fd, hdr, deadline); err != nil {
		return &ConverterError{Stage: "reply", Sent: true, Err: err}
	}
	total, err := ParseHeader(hdr)
	if err != nil {
		return &ConverterError{Stage: "reply", Sent: true, Err: err}
	}
	msg := make([]byte, total)
	copy(msg, hdr)
	if err := readFull(fd, msg[HeaderLen:], deadline); err != nil {
		return &ConverterError{Stage: "reply", Sent: true, Err: err}
	}
	reply, err := Parse(msg)
	if err != nil {
		return &ConverterError{Stage: "reply", Sent: true, Err: err}
	}
	if reply.Error != nil {
		return &RemoteError{Code: reply.Error.Code, Value: reply.Error.Value}
	}
	return nil
}

// waitConnected waits for a non-blocking connect to finish.
func waitConnected(fd int, deadline time.Time) error {
	if err := waitFor(fd, unix.POLLOUT, deadline); err != nil {
		return err
	}
	e, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if e != 0 {
		return unix.Errno(e)
	}
	return nil
}

// waitFor polls fd for ev until the deadline (ETIMEDOUT after it).
func waitFor(fd int, ev int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: ev}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil // errors show in the following call
		}
	}
}

// readFull reads exactly len(b) bytes (a message boundary: never more).
func readFull(fd int, b []byte, deadline time.Time) error {
	for off := 0; off < len(b); {
		n, err := unix.Read(fd, b[off:])
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			if err := waitFor(fd, unix.POLLIN, deadline); err != nil {
				return err
			}
		case err != nil:
			return err
		case n == 0:
			return errors.New("connection closed before a complete reply")
		default:
			off += n
		}
	}
	return nil
}
