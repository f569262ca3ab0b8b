package run

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/convert"
)

// Conversion of connect() (docs/convert.md, "mpdetour run"): with a
// conversion socket the filter also sends connect() here. The supervisor
// reads the destination from the caller's memory, asks the agent's Router
// (convclient) what to do and then:
//
//   - direct: lets the caller's connect() run (CONTINUE); for a destination
//     the Router does not know yet it keeps a duplicate of the socket
//     (pidfd_getfd) until the handshake is done and reports whether the
//     destination spoke MPTCP (the kernel's fallback, MPTCP_INFO);
//   - convert: takes a duplicate of the caller's own socket and, on it,
//     connects to the converter and exchanges the Convert message
//     (convert.ConvertFD: TCP Fast Open, the message in the SYN). The
//     caller's connect() then returns 0: its socket *is* the MPTCP
//     connection to the converter, nothing of ours stays in the data path.
//     The caller's thread waits in connect() meanwhile; so does a direct
//     connect() until the handshake, for the same time or less.
//   - the converter fails (unreachable, refuses the ticket, no resources,
//     a broken reply): the caller's fd is replaced by a fresh socket of the
//     same kind (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD) and its connect()
//     runs direct on it; the Router holds the converter back for a while.
//   - the destination refuses or cannot be reached (the converter's
//     Error TLV): the caller's connect() fails with that errno, as it would
//     have directly.

// Conversion timeouts: the converter's SYN+ACK, and the whole exchange
// (the converter's own dial to the destination is bounded by 10 s there).
const (
	convertConnectTimeout = 3 * time.Second
	convertTimeout        = 15 * time.Second
	// learnTimeout bounds how long a direct connection is watched for its
	// handshake; maxLearning bounds the sockets watched at once.
	learnTimeout = 10 * time.Second
	maxLearning  = 256
)

type convStats struct {
	connects, converted, direct, learning, learners atomic.Int64
}

func (c *convStats) add(st Stats) Stats {
	st.Connects, st.Converted = int(c.connects.Load()), int(c.converted.Load())
	st.ConvertDirect, st.Learning = int(c.direct.Load()), int(c.learning.Load())
	return st
}

// connect handles one trapped connect(fd, addr, len).
func (s *supervisor) connect(n *seccompNotif) error {
	if s.conv == nil {
		return s.cont(n.ID)
	}
	fd := int(int32(n.Data.Args[0]))
	alen := int(int32(n.Data.Args[2]))
	dst, ok := s.readDest(n.Pid, uintptr(n.Data.Args[1]), alen)
	if !ok {
		return s.cont(n.ID)
	}
	// The memory read must have been the caller's (pid reuse).
	if err := notifIDValid(s.lfd, n.ID); err != nil {
		s.stats.Gone++
		return nil
	}
	// Only MPTCP stream sockets not yet connected (what run made of the
	// caller's TCP socket) are ours to convert or learn from: UDP
	// connect()s (resolvers), sockets the kernel left TCP and the rest
	// continue without asking the agent.
	dup, err := s.dupCallerFD(n.Pid, fd)
	if err != nil {
		s.log.Debug("cannot take the caller's socket; going direct", "pid", n.Pid, "fd", fd, "err", err)
		return s.cont(n.ID)
	}
	if !mptcpStreamUnconnected(dup) {
		unix.Close(dup)
		return s.cont(n.ID)
	}
	if err := notifIDValid(s.lfd, n.ID); err != nil {
		unix.Close(dup)
		s.stats.Gone++
		return nil
	}
	s.convs.connects.Add(1)
	d, err := s.conv.Route(dst)
	if err != nil {
		s.log.Debug("no conversion decision; going direct", "dst", dst, "err", err)
	}
	if err != nil || !d.Convert && !d.Learn || d.Learn && s.convs.learners.Load() >= maxLearning {
		unix.Close(dup)
		return s.cont(n.ID)
	}
	if d.Learn {
		s.convs.learners.Add(1)
		s.convs.learning.Add(1)
		// After the answer: the watcher must see the caller's connect.
		err := s.cont(n.ID)
		s.wg.Go(func() {
			defer s.convs.learners.Add(-1)
			s.learn(dup, dst)
		})
		return err
	}
	pid := n.Pid
	id := n.ID
	s.wg.Go(func() { s.convert(id, pid, fd, dup, dst, d) })
	return nil
}

// readDest reads a sockaddr_in/in6 from the caller's memory.
func (s *supervisor) readDest(pid uint32, addr uintptr, alen int) (netip.AddrPort, bool) {
	if pid == 0 || addr == 0 || alen < unix.SizeofSockaddrInet4 || alen > 128 {
		return netip.AddrPort{}, false
	}
	var buf [unix.SizeofSockaddrInet6]byte
	want := min(alen, len(buf))
	local := []unix.Iovec{{Base: &buf[0], Len: uint64(want)}}
	remote := []unix.RemoteIovec{{Base: addr, Len: want}}
	got, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
	if err != nil || got < unix.SizeofSockaddrInet4 {
		return netip.AddrPort{}, false
	}
	fam := binary.NativeEndian.Uint16(buf[0:2])
	port := binary.BigEndian.Uint16(buf[2:4])
	switch {
	case fam == unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port), port != 0
	case fam == unix.AF_INET6 && got >= unix.SizeofSockaddrInet6:
		a := netip.AddrFrom16([16]byte(buf[8:24])).Unmap()
		if a.Is6() && a.IsLinkLocalUnicast() {
			return netip.AddrPort{}, false // scoped: leave alone
		}
		return netip.AddrPortFrom(a, port), port != 0
	}
	return netip.AddrPort{}, false
}

// dupCallerFD returns our own descriptor for the caller's fd.
func (s *supervisor) dupCallerFD(tid uint32, fd int) (int, error) {
	pfd, err := unix.PidfdOpen(int(tid), pidfdThread)
	if err == unix.EINVAL {
		pfd, err = unix.PidfdOpen(int(tid), 0) // before Linux 6.9: the leader only
	}
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	return unix.PidfdGetfd(pfd, fd, 0)
}

// mptcpStreamUnconnected: an MPTCP stream socket not connected yet (what
// run made of the caller's TCP socket).
func mptcpStreamUnconnected(fd int) bool {
	if p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || p != unix.IPPROTO_MPTCP {
		return false
	}
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return false
	}
	_, err := unix.Getpeername(fd)
	return err == unix.ENOTCONN
}

// learn waits until the caller's direct connection is established and
// reports whether it kept MPTCP. The duplicate is closed at once after
// that (and after learnTimeout at the latest), so a socket the caller
// closes outlives it by at most the polling interval.
func (s *supervisor) learn(dup int, dst netip.AddrPort) {
	defer unix.Close(dup)
	deadline := time.Now().Add(learnTimeout)
	for delay := 2 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		last := false
		select {
		case <-time.After(delay):
		case <-s.done:
			// No program left, but the duplicate still holds the socket:
			// look once more. A program that connects and exits within
			// milliseconds must teach too (found by the converter-speed
			// bench: such programs never taught, so every connection to
			// that server went direct).
			last = true
		}
		if _, err := unix.Getpeername(dup); err != nil {
			if last || !time.Now().Before(deadline) {
				return // SYN_SENT (or failed: then nothing to learn)
			}
			continue
		}
		native, err := mptcpNative(dup)
		if err != nil {
			s.log.Debug("MPTCP_INFO", "dst", dst, "err", err)
			return
		}
		if err := s.conv.Learn(dst, native); err != nil {
			s.log.Debug("report what was learned", "dst", dst, "err", err)
		}
		return
	}
}

// mptcpNative reports whether an established MPTCP socket kept MPTCP:
// getsockopt(SOL_MPTCP, MPTCP_INFO) with length 0 fails with EOPNOTSUPP
// after a fallback to TCP (the documented probe, as Go's MultipathTCP()).
func mptcpNative(fd int) (bool, error) {
	const solMPTCP, mptcpInfo = 284, 1
	var l uint32
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), solMPTCP, mptcpInfo, 0, uintptr(unsafe.Pointer(&l)), 0)
	switch e {
	case 0:
		return true, nil
	case unix.EOPNOTSUPP:
		return false, nil
	}
	return false, e
}

// convert runs one conversion on the caller's socket and answers the
// notification.
func (s *supervisor) convert(id uint64, pid uint32, fd, dup int, dst netip.AddrPort, d convclient.Decision) {
	defer unix.Close(dup)
	now := time.Now()
	err := convert.ConvertFD(dup, d.Converter, dst, d.Ticket, now.Add(convertConnectTimeout), now.Add(convertTimeout))
	if err == nil {
		s.convs.converted.Add(1)
		s.answer(id, 0)
		var local netip.AddrPort
		if sa, err := unix.Getsockname(dup); err == nil {
			local = sockaddrPort(sa)
		}
		s.report(dst, d.Name, convclient.OutcomeOK, local, "")
		return
	}
	if errno, ok := convert.DestinationError(err); ok {
		s.log.Debug("destination refused through the converter", "dst", dst, "err", err)
		s.answer(id, errno)
		s.report(dst, d.Name, convclient.OutcomeDestination, netip.AddrPort{}, err.Error())
		return
	}
	out := convclient.OutcomeConverterFailed
	var re *convert.RemoteError
	if errors.As(err, &re) && re.Code == convert.CodeNotAuthorized && len(re.Value) > 0 {
		switch re.Value[0] {
		case convert.NotAuthorizedDestination:
			out = convclient.OutcomePolicy
		case convert.NotAuthorizedTicket:
			out = convclient.OutcomeTicketRefused
		}
	}
	s.report(dst, d.Name, out, netip.AddrPort{}, err.Error())
	// Go direct on a fresh socket in place of the used one.
	if ferr := s.replaceFD(id, pid, fd, dup); ferr != nil {
		s.log.Warn("conversion failed and the socket could not be replaced", "dst", dst, "err", err, "replace", ferr)
		errno := unix.ECONNREFUSED
		var en unix.Errno
		if errors.As(err, &en) {
			errno = en
		}
		s.answer(id, errno)
		return
	}
	s.convs.direct.Add(1)
	s.log.Info("conversion failed; connecting direct", "dst", dst, "converter", d.Converter, "err", err)
	if err := s.cont(id); err != nil {
		s.log.Debug("continue after replacing the socket", "err", err)
	}
}

func (s *supervisor) report(dst netip.AddrPort, relay string, out convclient.Outcome, local netip.AddrPort, detail string) {
	if err := s.conv.Report(dst, relay, out, local, detail); err != nil {
		s.log.Debug("report conversion outcome", "err", err)
	}
}

// answer completes the caller's connect() with 0 or -errno.
func (s *supervisor) answer(id uint64, errno unix.Errno) {
	r := seccompNotifResp{ID: id, Error: -int32(errno)}
	if err := notifSend(s.lfd, &r); err != nil && err != unix.ENOENT {
		s.log.Warn("SECCOMP_IOCTL_NOTIF_SEND", "err", err)
	}
}

// replaceFD puts a fresh MPTCP socket of the same family, flags, namespace
// and owner as dup at the caller's fd (its connect() then runs on it).
// Options the caller set on the old socket (and a bind) are not carried.
func (s *supervisor) replaceFD(id uint64, pid uint32, fd, dup int) error {
	dom, err := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return err
	}
	fl, err := unix.FcntlInt(uintptr(dup), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(dup, &st); err != nil {
		return err
	}
	// SIOCGSKNS: the socket's network namespace.
	nsfd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(dup), unix.SIOCGSKNS, 0)
	if e != 0 {
		return fmt.Errorf("SIOCGSKNS: %w", e)
	}
	defer unix.Close(int(nsfd))
	typ := unix.SOCK_STREAM | unix.SOCK_CLOEXEC
	if fl&unix.O_NONBLOCK != 0 {
		typ |= unix.SOCK_NONBLOCK
	}
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// A thread of its own that takes on the namespace and owner and is
		// then discarded (never unlocked).
		runtime.LockOSThread()
		if err := unix.Setns(int(nsfd), unix.CLONE_NEWNET); err != nil {
			ch <- res{-1, fmt.Errorf("setns: %w", err)}
			return
		}
		unix.Setfsgid(int(st.Gid))
		unix.Setfsuid(int(st.Uid))
		nfd, err := unix.Socket(dom, typ, unix.IPPROTO_MPTCP)
		ch <- res{nfd, err}
	}()
	r := <-ch
	if r.err != nil {
		return r.err
	}
	defer unix.Close(r.fd)
	add := seccompNotifAddfd{ID: id, Flags: seccompAddfdFlagSetfd, Srcfd: uint32(r.fd), Newfd: uint32(fd)}
	if callerCloexec(pid, fd) {
		add.NewfdFlags = unix.O_CLOEXEC
	}
	for {
		if _, err = notifAddfd(s.lfd, &add); err != unix.EINTR {
			return err
		}
	}
}

// seccompAddfdFlagSetfd is SECCOMP_ADDFD_FLAG_SETFD: install at Newfd
// (replacing what is there, as dup2).
const seccompAddfdFlagSetfd = 1

// callerCloexec reads the close-on-exec flag of the caller's fd.
func callerCloexec(pid uint32, fd int) bool {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return true
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			f, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err != nil || f&unix.O_CLOEXEC != 0
		}
	}
	return true
}

func sockaddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}
