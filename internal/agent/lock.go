package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Lock makes this agent the only one in its namespace (cfg.NetNS) for the
// state directory it uses (beside the status socket, as the crash state
// files): it takes an exclusive flock on the file agent.lock.INODE there,
// INODE naming the namespace, and writes its pid into it. It must be the
// first thing an agent does: starting removes what a crashed agent left
// (tunnels, congestion control routes, clamps, sysctls), which would tear
// down a running agent's. The kernel drops the lock when the process
// ends, however it ends, so a killed agent never blocks its successor.
// release unlocks (the file stays; its content is only informative).
func Lock(cfg Options) (release func(), err error) {
	path, err := nsStateFile(cfg, "agent.lock")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("agent lock: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("agent lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another mpdetour agent runs in this network namespace%s (it holds %s); stop it first (`mpdetour status` shows it)",
				holder(path), path)
		}
		return nil, fmt.Errorf("agent lock %s: %w", path, err)
	}
	// The pid is for the message above only; a failure to write it does
	// not matter.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// holder is ", pid N" from the lock file, or "" when it says nothing.
func holder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return fmt.Sprintf(" (pid %d)", pid)
	}
	return ""
}
