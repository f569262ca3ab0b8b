package relay

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// RunDir holds the relay's lock and status socket, one pair per network
// namespace (named for the namespace's inode). It must belong to root (or
// to the relay's user) and be writable by nobody else: then no other local
// user can take the lock (keeping the relay from starting) or answer
// `relay status` in the relay's place. An abstract socket name, as before,
// belongs to whoever binds it first, any user of the namespace.
const RunDir = "/run/mpdetour"

// lockPaths are the lock file and the status socket of the current
// thread's network namespace.
func lockPaths() (lock, sock string, err error) {
	fi, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		return "", "", fmt.Errorf("relay lock: network namespace: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", "", errors.New("relay lock: network namespace: no inode")
	}
	base := filepath.Join(RunDir, fmt.Sprintf("relay-netns-%d", st.Ino))
	return base + ".lock", base + ".sock", nil
}

// checkRunDir makes sure RunDir exists, belongs to root or to us, and is
// writable by nobody else.
func checkRunDir(create bool) (uid uint32, err error) {
	if create {
		if err := os.Mkdir(RunDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("relay lock: %w", err)
		}
	}
	fi, err := os.Lstat(RunDir)
	if err != nil {
		return 0, fmt.Errorf("relay lock: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return 0, fmt.Errorf("relay lock: %s is not a directory", RunDir)
	case st == nil || st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return 0, fmt.Errorf("relay lock: %s belongs to another user (uid %d): remove it (it must belong to root or to the relay's user)", RunDir, st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		return 0, fmt.Errorf("relay lock: %s is writable by others (mode %v): chmod go-w %s", RunDir, fi.Mode().Perm(), RunDir)
	}
	return st.Uid, nil
}

// Lock makes sure only one relay runs per network namespace: a second
// one would replace the first one's nftables table (same name) and leave it
// answering "internal" to every grant. The lock is an flock on a file in
// RunDir, which the kernel releases when the process dies (kill -9
// included), so it cannot go stale; the returned listener is the relay's
// status socket (Deps.Status) beside it. Take it before the data plane.
func Lock() (*StatusSocket, error) {
	if _, err := checkRunDir(true); err != nil {
		return nil, err
	}
	lockPath, sockPath, err := lockPaths()
	if err != nil {
		return nil, err
	}
	f, err := lockFile(lockPath, sockPath)
	if err != nil {
		return nil, err
	}
	// Ours now: a socket file left by a relay killed with -9 goes.
	if err := os.Remove(sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.Close()
		return nil, fmt.Errorf("relay lock: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("relay status socket: %w", err)
	}
	if err := os.Chmod(sockPath, 0o666); err != nil { // the relay checks each peer's uid itself
		l.Close()
		f.Close()
		return nil, fmt.Errorf("relay status socket: %w", err)
	}
	return &StatusSocket{UnixListener: l, lock: f}, nil
}

// lockFile opens and flocks lockPath. A relay that stops removes its lock
// file while it still holds the lock (StatusSocket.Close), so a lock taken
// on a file that was unlinked meanwhile is no lock: the path is checked to
// still name the locked file, and opened again if it does not.
func lockFile(lockPath, sockPath string) (*os.File, error) {
	for range 5 {
		f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("relay lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if !errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("relay lock %s: %w", lockPath, err)
			}
			holder := ""
			if pid := lockHolder(sockPath); pid > 0 {
				holder = fmt.Sprintf(" (pid %d)", pid)
			}
			return nil, fmt.Errorf("another mpdetour relay is running in this network namespace%s: stop it first (a second relay would replace its nftables table)", holder)
		}
		held, err1 := f.Stat()
		named, err2 := os.Lstat(lockPath)
		if err1 == nil && err2 == nil && os.SameFile(held, named) {
			return f, nil
		}
		f.Close() // unlinked by a relay that stopped meanwhile: take the new one
	}
	return nil, fmt.Errorf("relay lock %s: the file keeps being replaced", lockPath)
}

// StatusSocket is the relay's status socket with the namespace's lock:
// Close releases both.
type StatusSocket struct {
	*net.UnixListener
	lock *os.File
}

// Close closes the socket (removing its file), removes the lock file while
// still holding the lock (lockFile re-checks for that), and releases the
// lock: a relay that stops leaves nothing in RunDir.
func (s *StatusSocket) Close() error {
	err := s.UnixListener.Close()
	if e := os.Remove(s.lock.Name()); e != nil && !errors.Is(e, os.ErrNotExist) && err == nil {
		err = e
	}
	if e := s.lock.Close(); err == nil {
		err = e
	}
	return err
}

// lockHolder is the pid of the process listening on the status socket
// path, 0 if unknown.
func lockHolder(path string) int {
	c, err := dialStatus(path, time.Second)
	if err != nil {
		return 0
	}
	defer c.Close()
	pid, _, _ := peerCred(c)
	return pid
}

func dialStatus(path string, timeout time.Duration) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// peerCred is the pid and uid of the process at the other end of c.
func peerCred(c *net.UnixConn) (pid int, uid uint32, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	_ = rc.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid, uid, ok = int(cred.Pid), cred.Uid, true
		}
	})
	return pid, uid, ok
}
