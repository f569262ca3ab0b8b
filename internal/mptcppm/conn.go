package mptcppm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"github.com/mpdetour/mpdetour/internal/netnsx"
	"golang.org/x/sys/unix"
)

// Options say where a socket lives.
type Options struct {
	// NetNS is a namespace name (as in /run/netns) or a path to a
	// namespace file; empty means the calling thread's namespace.
	NetNS string
	// ReadBuffer is the event socket's receive buffer in bytes
	// (default 8 MiB); set with SO_RCVBUFFORCE so rmem_max does not cap it.
	ReadBuffer int
}

// openNS returns a namespace fd for netlink.Config.NetNS (0 = current).
func openNS(ns string) (int, func(), error) {
	if ns == "" {
		return 0, func() {}, nil
	}
	h, err := netnsx.Open(ns)
	if err != nil {
		return 0, nil, err
	}
	return int(h), func() { h.Close() }, nil
}

func dialGenl(o Options) (*genetlink.Conn, genetlink.Family, error) {
	fd, done, err := openNS(o.NetNS)
	if err != nil {
		return nil, genetlink.Family{}, err
	}
	defer done()
	c, err := genetlink.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		return nil, genetlink.Family{}, fmt.Errorf("generic netlink: %w", err)
	}
	// Without extended acks the kernel's explanation of an EINVAL is lost.
	if err := c.SetOption(netlink.ExtendedAcknowledge, true); err != nil {
		c.Close()
		return nil, genetlink.Family{}, fmt.Errorf("generic netlink: enable extended ack: %w", err)
	}
	f, err := c.GetFamily(FamilyName)
	if err != nil {
		c.Close()
		if errors.Is(err, os.ErrNotExist) {
			return nil, f, fmt.Errorf("generic netlink family %q not found: kernel without MPTCP path manager netlink (needs Linux 5.19+ with CONFIG_MPTCP)", FamilyName)
		}
		return nil, f, fmt.Errorf("generic netlink family %q: %w", FamilyName, err)
	}
	return c, f, nil
}

// Conn sends mptcp_pm commands. It is safe for concurrent use; commands are
// serialised on one socket.
type Conn struct {
	c   *genetlink.Conn
	fam genetlink.Family
}

// Dial opens a command socket in o.NetNS.
func Dial(o Options) (*Conn, error) {
	c, f, err := dialGenl(o)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, fam: f}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.c.Close() }

// Error is a command the kernel refused.
type Error struct {
	Cmd   string
	Token uint32 // 0 for per-namespace commands
	Errno unix.Errno
	// Msg is the kernel's extended-ack message, when it gave one.
	Msg string
	Err error // non-errno failures (socket errors)
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mptcp_pm %s", e.Cmd)
	if e.Token != 0 {
		fmt.Fprintf(&b, " token %08x", e.Token)
	}
	if e.Errno != 0 {
		fmt.Fprintf(&b, ": %s (errno %d)", e.Errno.Error(), int(e.Errno))
	} else if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Msg != "" {
		fmt.Fprintf(&b, ": kernel says %q", e.Msg)
	}
	return b.String()
}

// Unwrap lets errors.Is(err, unix.ENOTCONN) and the like work.
func (e *Error) Unwrap() error {
	if e.Errno != 0 {
		return e.Errno
	}
	return e.Err
}

func (c *Conn) exec(r request, flags netlink.HeaderFlags) ([]genetlink.Message, error) {
	name := cmdNames[r.cmd]
	data, err := r.marshal()
	if err != nil {
		return nil, &Error{Cmd: name, Token: r.token, Err: err}
	}
	msgs, err := c.c.Execute(genetlink.Message{
		Header: genetlink.Header{Command: r.cmd, Version: FamilyVer},
		Data:   data,
	}, c.fam.ID, netlink.Request|flags)
	if err != nil {
		e := &Error{Cmd: name, Token: r.token, Err: err}
		var oe *netlink.OpError
		if errors.As(err, &oe) {
			e.Msg = oe.Message
		}
		var errno unix.Errno
		if errors.As(err, &errno) {
			e.Errno = errno
		} else {
			var se syscall.Errno
			if errors.As(err, &se) {
				e.Errno = unix.Errno(se)
			}
		}
		return nil, e
	}
	return msgs, nil
}

func (c *Conn) ack(r request) error {
	_, err := c.exec(r, netlink.Acknowledge)
	return err
}

// SubflowCreate asks the kernel to open a subflow of connection token from
// local to remote. It returns once the SYN is on its way; the outcome comes
// later as SUB_ESTABLISHED or SUB_CLOSED. local.ID 0 with the connection's
// own address means "the initial address".
func (c *Conn) SubflowCreate(token uint32, local, remote Addr) error {
	return c.ack(subflowReq(CmdSubflowCreate, token, local, remote))
}

// SubflowDestroy closes the subflow local -> remote (ports required).
func (c *Conn) SubflowDestroy(token uint32, local, remote Addr) error {
	return c.ack(subflowReq(CmdSubflowDestroy, token, local, remote))
}

// SetBackup marks the subflow local -> remote as backup or not (SET_FLAGS
// with the userspace PM: token, local address with flags, remote address).
func (c *Conn) SetBackup(token uint32, local, remote Addr, backup bool) error {
	local.Flags &^= FlagBackup
	if backup {
		local.Flags |= FlagBackup
	}
	return c.ack(subflowReq(CmdSetFlags, token, local, remote))
}

// SetFlags changes an in-kernel PM endpoint's flags (token 0) or, with a
// token, a connection's subflow as SetBackup does.
func (c *Conn) SetFlags(token uint32, local Addr, remote *Addr) error {
	return c.ack(request{cmd: CmdSetFlags, token: token, enc: func(ae *netlink.AttributeEncoder) error {
		if token != 0 {
			ae.Uint32(attrToken, token)
		}
		nested(ae, attrAddr, local)
		if remote != nil {
			nested(ae, attrAddrRemote, *remote)
		}
		return nil
	}})
}

// Announce sends ADD_ADDR for a on connection token (a.ID must be non-zero).
// The kernel insists on the signal flag, so it is always set.
func (c *Conn) Announce(token uint32, a Addr) error { return c.ack(announceReq(token, a)) }

// Remove sends RM_ADDR for local address id on connection token.
func (c *Conn) Remove(token uint32, id uint8) error { return c.ack(removeReq(token, id)) }

func endpointReq(cmd uint8, a Addr) request {
	return request{cmd: cmd, enc: func(ae *netlink.AttributeEncoder) error {
		nested(ae, endpointAddr, a)
		return nil
	}}
}

// AddAddr adds an in-kernel PM endpoint (ip mptcp endpoint add).
func (c *Conn) AddAddr(a Addr) error { return c.ack(endpointReq(CmdAddAddr, a)) }

// DelAddr deletes the in-kernel PM endpoint with a.ID.
func (c *Conn) DelAddr(a Addr) error { return c.ack(endpointReq(CmdDelAddr, a)) }

// FlushAddrs removes every in-kernel PM endpoint.
func (c *Conn) FlushAddrs() error {
	return c.ack(request{cmd: CmdFlushAddrs})
}

// Addrs lists the in-kernel PM endpoints (GET_ADDR dump).
func (c *Conn) Addrs() ([]Addr, error) {
	msgs, err := c.exec(request{cmd: CmdGetAddr}, netlink.Dump)
	if err != nil {
		return nil, err
	}
	var out []Addr
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return nil, fmt.Errorf("mptcp_pm GET_ADDR reply: %w", err)
		}
		for ad.Next() {
			if ad.Type()&0x3fff == endpointAddr {
				a, err := decodeAddr(ad.Bytes())
				if err != nil {
					return nil, fmt.Errorf("mptcp_pm GET_ADDR reply: %w", err)
				}
				out = append(out, a)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("mptcp_pm GET_ADDR reply: %w", err)
		}
	}
	return out, nil
}

// Limits are the per-namespace MPTCP limits (ip mptcp limits).
type Limits struct {
	AddAddrAccepted uint32 // MPTCP_PM_ATTR_RCV_ADD_ADDRS
	Subflows        uint32
}

// SetLimits sets the namespace's limits.
func (c *Conn) SetLimits(l Limits) error {
	return c.ack(request{cmd: CmdSetLimits, enc: func(ae *netlink.AttributeEncoder) error {
		ae.Uint32(attrRcvAddAddrs, l.AddAddrAccepted)
		ae.Uint32(attrSubflows, l.Subflows)
		return nil
	}})
}

// GetLimits reads the namespace's limits.
func (c *Conn) GetLimits() (Limits, error) {
	var l Limits
	msgs, err := c.exec(request{cmd: CmdGetLimits}, 0)
	if err != nil {
		return l, err
	}
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return l, fmt.Errorf("mptcp_pm GET_LIMITS reply: %w", err)
		}
		for ad.Next() {
			switch ad.Type() {
			case attrRcvAddAddrs:
				l.AddAddrAccepted = ad.Uint32()
			case attrSubflows:
				l.Subflows = ad.Uint32()
			}
		}
		if err := ad.Err(); err != nil {
			return l, fmt.Errorf("mptcp_pm GET_LIMITS reply: %w", err)
		}
	}
	return l, nil
}
