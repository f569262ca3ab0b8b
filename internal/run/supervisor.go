package run

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/convclient"
)

// Stats counts what the supervisor did with the socket() calls it saw.
type Stats struct {
	MPTCP    int // converted: CMD got an IPPROTO_MPTCP socket
	Fallback int // MPTCP socket creation failed; the original call ran unchanged
	Gone     int // the caller vanished or was interrupted before the answer

	// With conversion (docs/convert.md): IPv4/IPv6 connect()s seen,
	// connections converted, conversions that failed at the converter and
	// went direct, direct connections watched to learn about MPTCP.
	Connects, Converted, ConvertDirect, Learning int
}

// supervisor answers notifications on one locked OS thread. That thread
// takes on the network namespace and filesystem uid/gid of each caller so
// that the socket it creates belongs where, and to whom, the caller's own
// socket would have: it is never unlocked, so Go discards it at exit.
type supervisor struct {
	lfd   int
	log   *slog.Logger
	stats Stats
	// conv is the conversion client (nil: connect() is not trapped).
	conv  *convclient.Client
	convs convStats
	wg    sync.WaitGroup
	done  chan struct{} // closed when no task uses the filter any more

	root      bool
	nsDev     uint64
	nsIno     uint64
	fsuid     int
	fsgid     int
	procCheck bool
	// noPidfdInfo: the kernel lacks PIDFD_GET_INFO; read /proc instead.
	noPidfdInfo bool
}

// Serve handles notifications on the listener lfd until no task uses the
// filter any more (POLLHUP), then closes lfd.
func Serve(lfd int, log *slog.Logger) (Stats, error) { return serve(lfd, log, nil) }

// serve is Serve with conversion of connect()s through conv (nil: none).
func serve(lfd int, log *slog.Logger, conv *convclient.Client) (stats Stats, err error) {
	runtime.LockOSThread()
	defer unix.Close(lfd)
	s := &supervisor{lfd: lfd, log: log, root: os.Geteuid() == 0, fsuid: os.Geteuid(), fsgid: os.Getegid(), conv: conv, done: make(chan struct{})}
	// Conversions in progress answer their notification from their own
	// goroutine: wait for them before the listener goes.
	defer func() { close(s.done); s.wg.Wait(); stats = s.convs.add(stats) }()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err == nil {
		s.nsDev, s.nsIno, s.procCheck = st.Dev, st.Ino, true
	} else {
		log.Warn("cannot read own network namespace; sockets are created in the supervisor's namespace", "err", err)
	}
	fds := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}
	failures := 0
	for {
		fds[0].Revents = 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return s.stats, fmt.Errorf("poll seccomp listener: %w", err)
		}
		re := fds[0].Revents
		switch {
		case re&unix.POLLIN != 0:
			// One bad notification must not end the supervisor: every later
			// socket() of the tree would then fail with ENOSYS. Only an
			// error that keeps repeating does.
			if err := s.handle(); err != nil {
				failures++
				log.Error("notification failed", "err", err, "consecutive", failures)
				if failures >= 100 {
					return s.stats, err
				}
			} else {
				failures = 0
			}
		case re&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0:
			return s.stats, nil
		}
	}
}

func (s *supervisor) handle() error {
	var n seccompNotif
	if err := notifRecv(s.lfd, &n); err != nil {
		switch err {
		case unix.EINTR:
			return nil // still pending; poll reports it again
		case unix.ENOENT:
			s.stats.Gone++ // the caller left between poll and receive
			return nil
		}
		return fmt.Errorf("SECCOMP_IOCTL_NOTIF_RECV: %w", err)
	}
	if nr := n.Data.Nr &^ x32SyscallBit; nr == sysConnectX86_64 && n.Data.Arch == unix.AUDIT_ARCH_X86_64 ||
		nr == sysConnectI386 && n.Data.Arch == unix.AUDIT_ARCH_I386 {
		return s.connect(&n)
	}
	// socket() takes ints: only the low 32 bits count, as in the kernel.
	domain := int(int32(n.Data.Args[0]))
	typ := int(int32(n.Data.Args[1]))
	if err := s.become(&n); err != nil {
		if errors.Is(err, unix.ENOENT) {
			s.stats.Gone++
			return nil
		}
		s.log.Warn("cannot take on the caller's namespace or ids; leaving its socket() as TCP", "pid", n.Pid, "err", err)
		return s.cont(n.ID)
	}
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, unix.IPPROTO_MPTCP)
	if err != nil {
		// ENOPROTOOPT (net.mptcp.enabled=0), EPROTONOSUPPORT (no MPTCP),
		// EMFILE here...: the caller's own call then runs as if unwatched.
		s.log.Debug("MPTCP socket failed; falling back to the original socket()", "pid", n.Pid, "err", err)
		s.stats.Fallback++
		return s.cont(n.ID)
	}
	add := seccompNotifAddfd{ID: n.ID, Flags: unix.SECCOMP_ADDFD_FLAG_SEND, Srcfd: uint32(fd)}
	if typ&unix.SOCK_CLOEXEC != 0 {
		add.NewfdFlags = unix.O_CLOEXEC
	}
	for {
		if _, err = notifAddfd(s.lfd, &add); err != unix.EINTR {
			break
		}
	}
	unix.Close(fd)
	switch {
	case err == nil:
		s.stats.MPTCP++
		return nil
	case err == unix.ENOENT:
		s.stats.Gone++
		return nil
	default:
		// E.g. EMFILE in the caller: its own socket() reports that best.
		s.log.Debug("ADDFD failed; falling back to the original socket()", "pid", n.Pid, "err", err)
		s.stats.Fallback++
		return s.cont(n.ID)
	}
}

// cont lets the trapped socket() run in the kernel unchanged. That is safe
// here: its arguments are plain integers the caller cannot change anymore.
func (s *supervisor) cont(id uint64) error {
	r := seccompNotifResp{ID: id, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	if err := notifSend(s.lfd, &r); err != nil && err != unix.ENOENT {
		return fmt.Errorf("SECCOMP_IOCTL_NOTIF_SEND: %w", err)
	}
	return nil
}

// become moves the supervisor thread into the caller's network namespace and
// filesystem ids. It validates the notification after reading /proc so that
// a recycled pid cannot lend its namespace to someone else.
func (s *supervisor) become(n *seccompNotif) error {
	if n.Pid == 0 || !s.procCheck {
		// The caller lives in a pid namespace we cannot see.
		return notifIDValid(s.lfd, n.ID)
	}
	tid := strconv.FormatUint(uint64(n.Pid), 10)
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+tid+"/ns/net", &st); err != nil {
		if err == unix.ENOENT {
			return notifIDValid(s.lfd, n.ID)
		}
		return err
	}
	uid, gid := s.fsuid, s.fsgid
	if s.root {
		var err error
		if uid, gid, err = s.callerFsIDs(int(n.Pid), tid); err != nil {
			return notifIDValid(s.lfd, n.ID)
		}
	}
	if st.Dev != s.nsDev || st.Ino != s.nsIno {
		nsfd, err := unix.Open("/proc/"+tid+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return notifIDValid(s.lfd, n.ID)
		}
		defer unix.Close(nsfd)
		if err := notifIDValid(s.lfd, n.ID); err != nil {
			return err
		}
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns into the caller's network namespace: %w", err)
		}
		s.nsDev, s.nsIno = st.Dev, st.Ino
	} else if err := notifIDValid(s.lfd, n.ID); err != nil {
		return err
	}
	if uid != s.fsuid || gid != s.fsgid {
		// The socket inode takes its owner from the creator's fsuid/fsgid;
		// uid-based routing and nftables "meta skuid" look at it.
		unix.Setfsgid(gid)
		unix.Setfsuid(uid)
		s.fsuid, s.fsgid = uid, gid
	}
	return nil
}

// callerFsIDs returns the filesystem uid and gid of thread tid: through
// PIDFD_GET_INFO (Linux 6.13) when available, a few microseconds, else from
// /proc/TID/status, which costs ~13 us to generate.
func (s *supervisor) callerFsIDs(pid int, tid string) (int, int, error) {
	if !s.noPidfdInfo {
		fd, err := unix.PidfdOpen(pid, pidfdThread)
		if err == nil {
			info := pidfdInfo{Mask: pidfdInfoCreds}
			_, err = ioctlPtr(fd, pidfdGetInfo, unsafe.Pointer(&info))
			unix.Close(fd)
			if err == nil && info.Mask&pidfdInfoCreds != 0 {
				return int(info.Fsuid), int(info.Fsgid), nil
			}
		}
		if err == unix.ESRCH {
			return 0, 0, err
		}
		// EINVAL/ENOTTY: older kernel (no thread pidfds or no GET_INFO).
		s.noPidfdInfo = true
	}
	b, err := os.ReadFile("/proc/" + tid + "/status")
	if err != nil {
		return 0, 0, err
	}
	return parseStatusFsIDs(b)
}

// parseStatusFsIDs extracts the filesystem uid and gid (the fourth value of
// the Uid: and Gid: lines) from /proc/PID/status.
func parseStatusFsIDs(b []byte) (uid, gid int, err error) {
	uid, gid = -1, -1
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		var dst *int
		switch {
		case bytes.HasPrefix(line, []byte("Uid:")):
			dst = &uid
		case bytes.HasPrefix(line, []byte("Gid:")):
			dst = &gid
		default:
			continue
		}
		f := bytes.Fields(line[4:])
		if len(f) != 4 {
			return -1, -1, fmt.Errorf("/proc status: malformed %q", line)
		}
		v, err := strconv.ParseUint(string(f[3]), 10, 32)
		if err != nil {
			return -1, -1, fmt.Errorf("/proc status: malformed %q", line)
		}
		*dst = int(v)
	}
	if uid < 0 || gid < 0 {
		return -1, -1, errors.New("/proc status: no Uid:/Gid: line")
	}
	return uid, gid, nil
}
