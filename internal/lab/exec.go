package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// nsExecMarker is argv[0] of a re-execution of the current binary that
// enters a namespace and then executes the real command. Go cannot enter a
// namespace between fork and exec, and a caller may Start the returned
// exec.Cmd from any thread, so the switch happens in the child instead.
const nsExecMarker = "mpdetour-lab-nsexec"

func init() {
	if len(os.Args) >= 3 && os.Args[0] == nsExecMarker {
		nsExec(os.Args[1], os.Args[2:])
	}
}

// nsExec runs during package initialisation of the re-executed binary,
// on the main thread, before any other code of the program.
func nsExec(nsPath string, argv []string) {
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "mpdetour lab: "+format+"\n", a...)
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
