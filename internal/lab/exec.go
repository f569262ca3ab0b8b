package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// nsExecMarker is argv[0] of a re-execution of the current binary that
// enters a namespace and then executes the real command. Go cannot enter a
// namespace between fork and exec, and a caller may Start the returned
// exec.Cmd from any thread, so the switch happens in the child instead.
const nsExecMarker = "mpdetour-lab-nsexec"

// Reexec runs this process as one of the lab's helpers when it was started
// as one: the shim that enters a namespace and executes a command
// (Lab.Command), or a lab's delay line. Every program that brings up labs
// calls it first thing (cmd/mpdetour-lab's main, and TestMain of the test
// binaries that build labs, since the helpers are re-executions of the
// current binary); it returns at once in any other process, and never
// returns in a helper.
func Reexec() {
	reexecCalled.Store(true)
	switch {
	case len(os.Args) >= 3 && os.Args[0] == nsExecMarker:
		nsExec(os.Args[1], os.Args[2:])
	case len(os.Args) == 3 && os.Args[0] == delayLineMarker:
		os.Exit(delayLineMain(os.Args[1], os.Args[2]))
	}
}

// reexecCalled guards against a program that starts helpers without having
// called Reexec: its re-executions would run the program itself.
var reexecCalled atomic.Bool

func errNoReexec() error {
	return errors.New("this program does not call lab.Reexec() at start, so it cannot run lab helpers (namespace exec, delay line)")
}

// nsExec replaces the process with argv inside the namespace at nsPath. It
// enters the namespace on the locked main thread and execs from it: the
// executed program keeps that thread's namespace.
func nsExec(nsPath string, argv []string) {
	runtime.LockOSThread()
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "mpdetour-lab: "+format+"\n", a...)
		os.Exit(127)
	}
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail("opening namespace %s: %v", nsPath, err)
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		fail("entering namespace %s: %v", nsPath, err)
	}
	unix.Close(fd)
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fail("%v", err)
	}
	err = unix.Exec(path, argv, os.Environ())
	fail("exec %s: %v", path, err)
}

// Command returns a command that runs argv inside node's namespace. It is
// an ordinary exec.Cmd (set Stdout, Env, ... as usual, then Start/Run);
// internally the current binary re-executes itself, enters the namespace
// and executes argv, keeping the pid, so ctx cancellation and Wait behave
// as for any command. An unknown node makes Start fail.
func (l *Lab) Command(ctx context.Context, node string, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	path := l.NetnsPath(node)
	switch {
	case path == "":
		cmd.Err = fmt.Errorf("lab %s has no node %q", l.name, node)
	case len(argv) == 0:
		cmd.Err = fmt.Errorf("lab %s: empty command", l.name)
	case !reexecCalled.Load():
		cmd.Err = errNoReexec()
	default:
		cmd.Args = append([]string{nsExecMarker, path}, argv...)
	}
	return cmd
}

// Do runs fn on a locked OS thread inside node's namespace: sockets fn
// opens belong to the node. Goroutines fn starts do not inherit the
// namespace.
func (l *Lab) Do(node string, fn func() error) error {
	path := l.NetnsPath(node)
	if path == "" {
		return fmt.Errorf("lab %s has no node %q", l.name, node)
	}
	return netnsx.Do(path, fn)
}
