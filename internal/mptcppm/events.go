package mptcppm

import (
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/genetlink"
	"golang.org/x/sys/unix"
)

// ErrEventsLost means the kernel dropped events because the receive buffer
// overflowed (ENOBUFS). The socket stays usable; the caller must rebuild its
// view of the connections (Dump) because some events never arrive.
var ErrEventsLost = errors.New("mptcp_pm events lost (receive buffer overflow)")

// Events receives the mptcp_pm_events multicast group of one namespace.
type Events struct {
	c *genetlink.Conn
}

// ListenEvents joins the event group in o.NetNS.
func ListenEvents(o Options) (*Events, error) {
	c, f, err := dialGenl(o)
	if err != nil {
		return nil, err
	}
	var gid uint32
	for _, g := range f.Groups {
		if g.Name == GroupEvents {
			gid = g.ID
		}
	}
	if gid == 0 {
		c.Close()
		return nil, fmt.Errorf("generic netlink family %q has no %q group", FamilyName, GroupEvents)
	}
	size := o.ReadBuffer
	if size <= 0 {
		size = 8 << 20
	}
	if err := setRcvBufForce(c, size); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.JoinGroup(gid); err != nil {
		c.Close()
		return nil, fmt.Errorf("join %s: %w", GroupEvents, err)
	}
	return &Events{c: c}, nil
}

// setRcvBufForce bypasses net.core.rmem_max (a root-namespace setting we
// must not change) so bursts of connections do not overflow the socket.
func setRcvBufForce(c *genetlink.Conn, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
	}); err != nil {
		return err
	}
	if serr != nil {
		// Without CAP_NET_ADMIN fall back to what rmem_max allows.
		return c.SetReadBuffer(size)
	}
	return nil
}

// Receive blocks until events arrive and returns them decoded. It returns
// ErrEventsLost (possibly with events received before the loss) when the
// kernel dropped some. Messages that fail to decode are skipped and
// reported in the returned error only if nothing else was received.
func (e *Events) Receive() ([]Event, error) {
	msgs, _, err := e.c.Receive()
	if err != nil {
		if errors.Is(err, unix.ENOBUFS) {
			return nil, ErrEventsLost
		}
		return nil, err
	}
	out := make([]Event, 0, len(msgs))
	var derr error
	for _, m := range msgs {
		ev, err := DecodeEvent(EventType(m.Header.Command), m.Data)
		if err != nil {
			derr = err
			continue
		}
		out = append(out, ev)
	}
	if len(out) == 0 && derr != nil {
		return nil, derr
	}
	return out, nil
}

// ReceiveRaw returns undecoded messages (used to record test fixtures).
func (e *Events) ReceiveRaw() ([]genetlink.Message, error) {
	msgs, _, err := e.c.Receive()
	if errors.Is(err, unix.ENOBUFS) {
		return nil, ErrEventsLost
	}
	return msgs, err
}

// SetReadDeadline bounds how long Receive blocks.
func (e *Events) SetReadDeadline(t time.Time) error { return e.c.SetReadDeadline(t) }

// Close closes the socket, unblocking Receive.
func (e *Events) Close() error { return e.c.Close() }
