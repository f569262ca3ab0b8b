package run

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/convclient"
)

// envConvert passes the conversion socket to the supervisor.
const envConvert = "MPDETOUR_RUN_CONVERT"

// Mechanism names how CMD's sockets are converted.
type Mechanism string

const (
	Auto    Mechanism = "auto"
	Seccomp Mechanism = "seccomp"
	Preload Mechanism = "preload"
)

// ParseMechanism validates a --mechanism value.
func ParseMechanism(s string) (Mechanism, error) {
	switch m := Mechanism(s); m {
	case Auto, Seccomp, Preload:
		return m, nil
	}
	return "", fmt.Errorf("unknown mechanism %q (want auto, seccomp or preload)", s)
}

// Exit statuses of "mpdetour run" itself, as with env(1), nice(1), chroot(1):
// CMD's own status can be anything, so only these three are reserved.
const (
	ExitSetup      = 125 // mpdetour run could not set up the mechanism
	ExitCannotExec = 126 // CMD was found but could not be executed
	ExitNotFound   = 127 // CMD was not found
)

// ExitError carries the exit status for a failure before CMD started.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Options configure Exec.
type Options struct {
	Mechanism Mechanism
	Argv      []string  // CMD and its arguments
	Env       []string  // CMD's environment; nil means os.Environ()
	LogPath   string    // where the supervisor logs (appending); "" discards
	Warn      io.Writer // warnings about the chosen mechanism
	// Convert is the agent's conversion socket (convclient): connect()s
	// to destinations known not to speak MPTCP go through a converter
	// (seccomp only; docs/convert.md). "" = no conversion.
	Convert string
}

// Argv[0] values that mark mpdetour re-executing itself for internal work.
const (
	argv0Fork       = "mpdetour-run-fork"
	argv0Supervisor = "mpdetour-run-supervisor"
	argv0Probe      = "mpdetour-run-probe"
)

// Internal reports whether this process is one of mpdetour run's internal
// helpers; if so, the caller must exit with InternalMain's status at once.
func Internal() bool {
	switch os.Args[0] {
	case argv0Fork, argv0Supervisor, argv0Probe:
		return os.Getenv("MPDETOUR_RUN_INTERNAL") == "1"
	}
	return false
}

// InternalMain runs the helper selected by argv[0].
func InternalMain() int {
	switch os.Args[0] {
	case argv0Fork:
		return forkMain()
	case argv0Supervisor:
		return supervisorMain()
	case argv0Probe:
		return probeMain()
	}
	return ExitSetup
}

// Exec replaces the current process with CMD under the chosen mechanism. It
// only returns on failure, with an *ExitError.
func Exec(o Options) error {
	if len(o.Argv) == 0 {
		return &ExitError{ExitSetup, errors.New("no command")}
	}
	if o.Warn == nil {
		o.Warn = os.Stderr
	}
	env := o.Env
	if env == nil {
		env = os.Environ()
	}
	path, err := exec.LookPath(o.Argv[0])
	if err != nil {
		code := ExitNotFound
		if !errors.Is(err, exec.ErrNotFound) && !errors.Is(err, os.ErrNotExist) {
			code = ExitCannotExec
		}
		return &ExitError{code, err}
	}
	mech := o.Mechanism
	if mech == "" || mech == Auto {
		if why := seccompUnavailable(); why != "" {
			fmt.Fprintf(o.Warn, "mpdetour run: seccomp user notification unavailable (%s); using LD_PRELOAD fallback\n", why)
			mech = Preload
		} else {
			mech = Seccomp
		}
	}
	switch mech {
	case Preload:
		if o.Convert != "" {
			fmt.Fprintf(o.Warn, "mpdetour run: the preload mechanism does not convert connections through a converter (seccomp only)\n")
		}
		return execPreload(path, o.Argv, env, o.Warn)
	case Seccomp:
		err := execSeccomp(path, o.Argv, env, o.LogPath, o.Convert)
		var nf *noFilterError
		if errors.As(err, &nf) && (o.Mechanism == "" || o.Mechanism == Auto) {
			// Nothing irreversible happened (no filter): e.g. a container
			// policy that forbids seccomp().
			fmt.Fprintf(o.Warn, "mpdetour run: %v; using LD_PRELOAD fallback\n", nf.err)
			return execPreload(path, o.Argv, env, o.Warn)
		}
		return err
	}
	return &ExitError{ExitSetup, fmt.Errorf("unknown mechanism %q", mech)}
}

func execSeccomp(path string, argv, env []string, logPath, convert string) error {
	setup := func(err error) error { return &ExitError{ExitSetup, err} }
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return setup(fmt.Errorf("socketpair: %w", err))
	}
	ours := os.NewFile(uintptr(sp[0]), "supervisor")
	theirs := os.NewFile(uintptr(sp[1]), "supervisor-end")
	defer ours.Close()
	if err := startSupervisor(theirs, logPath, convert); err != nil {
		theirs.Close()
		return setup(err)
	}
	theirs.Close()

	// From here on this thread installs the filter and calls execve.
	runtime.LockOSThread()
	lfd, err := installFilter(convert != "")
	if err != nil {
		runtime.UnlockOSThread()
		return setup(&noFilterError{err})
	}
	// The filter cannot be removed again: any failure below must end this
	// process rather than run anything else under an unserved filter.
	rights := unix.UnixRights(lfd)
	if err := unix.Sendmsg(sp[0], []byte{'L'}, rights, nil, 0); err != nil {
		return setup(fmt.Errorf("hand the seccomp listener to the supervisor: %w", err))
	}
	unix.Close(lfd)
	tv := unix.Timeval{Sec: 10}
	_ = unix.SetsockoptTimeval(sp[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	var ack [1]byte
	if n, err := unix.Read(sp[0], ack[:]); err != nil || n != 1 {
		return setup(fmt.Errorf("supervisor did not confirm (n=%d): %v", n, err))
	}
	ours.Close()
	restoreSignals()
	err = syscall.Exec(path, argv, env)
	return &ExitError{ExitCannotExec, fmt.Errorf("exec %s: %w", path, err)}
}

// restoreSignals undoes mpdetour's own signal handling before execve, so
// that the SIG_IGN a caller set for SIGINT or SIGHUP (background jobs,
// nohup) reaches CMD as it would without mpdetour: the Go runtime keeps
// those two ignored unless a handler is installed, and Reset reinstates
// the inherited disposition. (Other inherited SIG_IGNs, e.g. SIGQUIT, are
// replaced by the Go runtime before any of our code runs; see docs/run.md.)
func restoreSignals() {
	signal.Reset(syscall.SIGINT, syscall.SIGTERM)
}

// noFilterError reports a seccomp setup failure before the filter was
// installed, when another mechanism can still be used.
type noFilterError struct{ err error }

func (e *noFilterError) Error() string { return e.err.Error() }

// startSupervisor starts the supervisor detached from CMD: an intermediate
// process starts it and exits, so the supervisor is never a child of CMD
// (which could otherwise reap it or be confused by its SIGCHLD).
func startSupervisor(end *os.File, logPath, convert string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locate own binary: %w", err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	args := []string{argv0Fork}
	if logPath != "" {
		args = append(args, logPath)
	}
	p, err := os.StartProcess(self, args, &os.ProcAttr{
		Dir:   "/",
		Env:   []string{"MPDETOUR_RUN_INTERNAL=1", envConvert + "=" + convert},
		Files: []*os.File{devnull, devnull, os.Stderr, end},
	})
	if err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	st, err := p.Wait()
	if err != nil {
		return fmt.Errorf("start supervisor: %w", err)
	}
	if !st.Success() {
		return fmt.Errorf("start supervisor: helper %v", st)
	}
	return nil
}

// forkMain is the intermediate: it starts the supervisor in its own session
// (no terminal signals reach it) and exits.
func forkMain() int {
	// Descriptors mpdetour inherited without close-on-exec (a caller's pipe,
	// a jobserver) must not stay open in the long-lived supervisor.
	_ = unix.CloseRange(4, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mpdetour run:", err)
		return 1
	}
	logf, err := os.Open(os.DevNull)
	if len(os.Args) > 1 {
		logf, err = os.OpenFile(os.Args[1], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mpdetour run: supervisor log:", err)
		return 1
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mpdetour run:", err)
		return 1
	}
	// The supervisor's stdio never points at CMD's pipes: a reader waiting
	// for EOF before reaping CMD would otherwise wait forever.
	_, err = os.StartProcess(self, []string{argv0Supervisor}, &os.ProcAttr{
		Dir:   "/",
		Env:   []string{"MPDETOUR_RUN_INTERNAL=1", envConvert + "=" + os.Getenv(envConvert)},
		Files: []*os.File{devnull, devnull, logf, os.NewFile(3, "supervisor-end")},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mpdetour run: start supervisor:", err)
		return 1
	}
	return 0
}

func supervisorMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("pid", os.Getpid())
	// systemd's stop and terminal hangups also reach the supervisor; it must
	// keep serving until the last task using the filter is gone.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	lfd, err := receiveListener(3)
	if err != nil {
		log.Error("no seccomp listener received", "err", err)
		return 1
	}
	if _, err := unix.Write(3, []byte{'A'}); err != nil {
		log.Error("cannot confirm to mpdetour run", "err", err)
		return 1
	}
	unix.Close(3)
	start := time.Now()
	var conv *convclient.Client
	if p := os.Getenv(envConvert); p != "" {
		conv = convclient.NewClient(p, 0)
		defer conv.Close()
	}
	st, err := serve(lfd, log, conv)
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	log.Info("supervisor done", "mptcp", st.MPTCP, "fallback", st.Fallback, "gone", st.Gone,
		"connects", st.Connects, "converted", st.Converted, "convert_failed_direct", st.ConvertDirect, "learning", st.Learning,
		"uptime", time.Since(start).Round(time.Millisecond), "cpu", cpu.Round(time.Microsecond))
	if err != nil {
		log.Error("supervisor failed", "err", err)
		return 1
	}
	return 0
}

// receiveListener reads one SCM_RIGHTS file descriptor from the socket fd.
func receiveListener(fd int) (int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("no control message (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, fmt.Errorf("no file descriptor (%v)", err)
	}
	return fds[0], nil
}
