package agent

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// LockName is the abstract unix socket that marks a namespace's agent
// (`ss -xl` shows it as @mpdetour-agent).
const LockName = "@mpdetour-agent"

// Lock makes this agent the only one in its network namespace
// (cfg.NetNS): it binds the abstract unix socket LockName there. Abstract
// socket names belong to the network namespace, so the lock covers
// exactly what an agent's start changes: it removes what a crashed agent
// left (tunnels, congestion control routes, clamps, sysctls) namespace-
// wide, which would tear down a running agent's, whatever its socket or
// state directory. It must be the first thing an agent does. The kernel
// drops the name when the process ends, however it ends, so a killed
// agent never blocks its successor, and nothing is left on disk.
func Lock(cfg Options) (release func(), err error) {
	var l *net.UnixListener
	err = netnsx.Do(cfg.NetNS, func() error {
		var lerr error
		l, lerr = net.ListenUnix("unix", &net.UnixAddr{Name: LockName, Net: "unix"})
		return lerr
	})
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("another mpdetour agent runs in this network namespace%s; stop it first (`mpdetour status` shows it; its lock is the abstract socket %s, `ss -xlp`)",
			holder(cfg), LockName)
	}
	if err != nil {
		return nil, fmt.Errorf("agent lock %s: %w", LockName, err)
	}
	return func() { l.Close() }, nil
}

// holder is " (pid N)" of the process holding the lock, from the
// listener's credentials (SO_PEERCRED of a connection to it), or "".
func holder(cfg Options) string {
	pid := 0
	_ = netnsx.Do(cfg.NetNS, func() error {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: LockName, Net: "unix"})
		if err != nil {
			return err
		}
		defer c.Close()
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		return rc.Control(func(fd uintptr) {
			if cr, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cr.Pid)
			}
		})
	})
	if pid <= 0 {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}
