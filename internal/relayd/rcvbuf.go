package relayd

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// The bounds of receive_buffer: below 64 KiB a flood fills it in a few
// milliseconds; above 256 MiB the kernel's int bookkeeping (it keeps twice
// the size asked) comes close to overflowing.
const (
	minReceiveBuffer = 64 << 10
	maxReceiveBuffer = 256 << 20
)

// setReceiveBuffer asks for a receive buffer of size bytes on conn with
// SO_RCVBUFFORCE, which may exceed net.core.rmem_max (the relay runs with
// CAP_NET_ADMIN, deploy/mpdetour-relay.service), falling back to
// SO_RCVBUF (capped at rmem_max) without that capability. It returns what
// the kernel holds, read back with getsockopt (the kernel doubles the size
// asked for its own bookkeeping), so the caller can say when it is less.
func setReceiveBuffer(conn *net.UDPConn, size int) (int, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
		}
		if serr == nil {
			got, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		}
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("receive buffer of %d bytes: %w", size, serr)
	}
	return got, nil
}
