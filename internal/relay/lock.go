package relay

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// lockName is an abstract unix socket: abstract names belong to the
// network namespace of the socket, and the kernel frees them when the
// process dies (kill -9 included), so this is a per-namespace lock that
// cannot go stale, unlike a lock file.
const lockName = "@mpdetour-relay"

// Lock makes sure only one relay runs per network namespace: a second
// one would replace the first one's nftables table (same name) and leave it
// answering "internal" to every grant. Take it before the data plane; the
// listener is also the relay's status socket (Deps.Status).
func Lock() (*net.UnixListener, error) {
	addr := &net.UnixAddr{Name: lockName, Net: "unix"}
	l, err := net.ListenUnix("unix", addr)
	if err == nil {
		return l, nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("relay lock %s: %w", lockName, err)
	}
	holder := ""
	if pid := lockHolder(addr); pid > 0 {
		holder = fmt.Sprintf(" (pid %d)", pid)
	}
	return nil, fmt.Errorf("another mpdetour relay is running in this network namespace%s: stop it first (a second relay would replace its nftables table)", holder)
}

// lockHolder is the pid of the process listening on addr, 0 if unknown.
func lockHolder(addr *net.UnixAddr) int {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.Dial("unix", addr.Name)
	if err != nil {
		return 0
	}
	defer c.Close()
	rc, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = rc.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}
