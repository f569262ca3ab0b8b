package delayline

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// packetSocket is an AF_PACKET socket bound to one interface of a middle
// namespace. It is non-blocking and registered with Go's poller, so a
// reader or writer parks in epoll instead of holding an OS thread.
type packetSocket struct {
	f       *os.File
	rc      syscall.RawConn
	ifindex int
	mtu     int
}

// Socket buffers: large enough to absorb a burst of full-size frames while
// the reader is descheduled on a busy 2-core machine (~2700 frames).
const (
	rcvBuf = 4 << 20
	sndBuf = 4 << 20
)

// openPacketSocket opens the socket inside the namespace at nsPath, on a
// thread netnsx.Do discards afterwards.
func openPacketSocket(nsPath, ifname string) (ps *packetSocket, err error) {
	err = netnsx.Do(nsPath, func() error {
		var e error
		ps, e = openHere(nsPath, ifname)
		return e
	})
	return ps, err
}

// openHere opens the socket in the calling thread's namespace; nsPath only
// names it in errors.
func openHere(nsPath, ifname string) (*packetSocket, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("interface %s in %s: %w", ifname, nsPath, err)
	}
	// Protocol 0 at creation: the socket receives nothing until bind, so no
	// frame of another interface slips in before it is bound.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket for %s: %w", ifname, err)
	}
	fail := func(what string, err error) (*packetSocket, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("packet socket for %s in %s: %s: %w", ifname, nsPath, what, err)
	}
	// Without this the socket would also read back every frame the delay
	// line itself sends out of this interface, and loop it.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return fail("PACKET_IGNORE_OUTGOING", err)
	}
	// Kernel arrival timestamps: the delay counts from when the frame reached
	// the interface, not from when this process got around to reading it.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fail("SO_TIMESTAMPNS", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sndBuf); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sndBuf)
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	f := os.NewFile(uintptr(fd), "packet:"+ifname)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("packet socket for %s: %w", ifname, err)
	}
	return &packetSocket{f: f, rc: rc, ifindex: ifc.Index, mtu: ifc.MTU}, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// kernelDrops returns frames the kernel dropped because the socket's
// receive buffer was full since the last call (the kernel resets the counter).
func (p *packetSocket) kernelDrops() uint64 {
	var n uint64
	_ = p.rc.Control(func(fd uintptr) {
		st, err := unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
		if err == nil {
			n = uint64(st.Drops)
		}
	})
	return n
}

func recvmmsg(fd uintptr, hs []unix.Mmsghdr) (int, unix.Errno) {
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&hs[0])), uintptr(len(hs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

func sendmmsg(fd uintptr, hs []unix.Mmsghdr) (int, unix.Errno) {
	n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&hs[0])), uintptr(len(hs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

// ctrlSize holds one SCM_TIMESTAMPNS message with room to spare.
const ctrlSize = 64

// parseTimestamp returns the SCM_TIMESTAMPNS time in Unix ns, or 0. It
// reads the cmsghdr fields byte-wise so that no length the buffer holds can
// make it read out of bounds.
func parseTimestamp(ctrl []byte) int64 {
	const hdr = 16 // struct cmsghdr on 64-bit Linux: len u64, level i32, type i32
	ne := binary.NativeEndian
	for len(ctrl) >= hdr {
		l := ne.Uint64(ctrl)
		if l < hdr || l > uint64(len(ctrl)) {
			return 0
		}
		level, typ := int32(ne.Uint32(ctrl[8:])), int32(ne.Uint32(ctrl[12:]))
		if level == unix.SOL_SOCKET && typ == unix.SCM_TIMESTAMPNS && l >= hdr+16 {
			sec, nsec := int64(ne.Uint64(ctrl[hdr:])), int64(ne.Uint64(ctrl[hdr+8:]))
			return sec*1e9 + nsec
		}
		ctrl = ctrl[min(unix.CmsgSpace(int(l)-hdr), len(ctrl)):]
	}
	return 0
}

// timer is an absolute CLOCK_MONOTONIC timerfd waited on through Go's
// poller. time.Sleep rounds its deadline up to the poller's millisecond
// timeout (measured ~0.97 ms late here); a timerfd fires from an hrtimer,
// ~35 µs late at the median, without spinning.
type timer struct {
	f    *os.File
	rc   syscall.RawConn
	spec unix.ItimerSpec
	serr error
	buf  [8]byte
	// callbacks bound once, so that waiting allocates nothing
	read   func(uintptr) bool
	setCtl func(uintptr)
}

func newTimer() (*timer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "timerfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("timerfd: %w", err)
	}
	t := &timer{f: f, rc: rc}
	t.setCtl = func(fd uintptr) { t.serr = unix.TimerfdSettime(int(fd), unix.TFD_TIMER_ABSTIME, &t.spec, nil) }
	t.read = func(fd uintptr) bool {
		_, err := unix.Read(int(fd), t.buf[:])
		return err != unix.EAGAIN
	}
	return t, nil
}

// waitUntil blocks until CLOCK_MONOTONIC reaches ns or the timer is closed.
func (t *timer) waitUntil(ns int64) error {
	t.spec.Value = unix.NsecToTimespec(ns)
	if err := t.rc.Control(t.setCtl); err != nil {
		return err
	}
	if t.serr != nil {
		return fmt.Errorf("timerfd_settime: %w", t.serr)
	}
	return t.rc.Read(t.read)
}
