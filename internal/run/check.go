package run

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Report is what "mpdetour run --check" found on this host.
type Report struct {
	SeccompProblem string // "" when the seccomp mechanism works end to end
	SeccompProbe   string // what the end-to-end probe observed
	PreloadLib     string
	PreloadProblem string
	MPTCPEnabled   bool
	PMType         string // "in-kernel", "userspace" or ""
	Limits         *PMLimits
	LimitsProblem  string
	Warnings       []string
}

// Mechanism is what "auto" picks on this host.
func (r *Report) Mechanism() Mechanism {
	if r.SeccompProblem == "" {
		return Seccomp
	}
	if r.PreloadProblem == "" {
		return Preload
	}
	return ""
}

// Check inspects the host (and the current network namespace).
func Check() *Report {
	r := &Report{}
	if why := seccompUnavailable(); why != "" {
		r.SeccompProblem = why
	} else if proto, err := probeSeccomp(); err != nil {
		r.SeccompProblem = "end-to-end probe failed: " + err.Error()
	} else {
		r.SeccompProbe = fmt.Sprintf("a probe's socket(AF_INET, SOCK_STREAM, 0) returned a socket with SO_PROTOCOL %d", proto)
		if proto != unix.IPPROTO_MPTCP {
			r.SeccompProbe += " (MPTCP unavailable here, so the supervisor let TCP through)"
		}
	}
	if lib, err := FindPreloadLibrary(); err != nil {
		r.PreloadProblem = err.Error()
	} else {
		r.PreloadLib = lib
	}
	en, err := os.ReadFile("/proc/sys/net/mptcp/enabled")
	r.MPTCPEnabled = err == nil && strings.TrimSpace(string(en)) == "1"
	if !r.MPTCPEnabled {
		r.Warnings = append(r.Warnings, "MPTCP is disabled in this network namespace (net.mptcp.enabled != 1): programs get plain TCP sockets")
	}
	if b, err := os.ReadFile("/proc/sys/net/mptcp/pm_type"); err == nil {
		switch strings.TrimSpace(string(b)) {
		case "0":
			r.PMType = "in-kernel"
		case "1":
			r.PMType = "userspace"
			r.Warnings = append(r.Warnings, "path manager is userspace (net.mptcp.pm_type=1): servers in this namespace reject MP_JOINs unless a userspace path manager is listening for mptcp_pm events; for serving detour subflows use pm_type 0 with subflows > 0")
		}
	}
	if l, err := ReadPMLimits(); err != nil {
		r.LimitsProblem = err.Error()
	} else {
		r.Limits = &l
		if l.Subflows == 0 {
			r.Warnings = append(r.Warnings, "in-kernel PM limit subflows is 0: servers here refuse every MP_JOIN, so detour subflows cannot join (raise with `ip mptcp limits set subflows 2`)")
		}
		if l.AddAddrAccepted == 0 {
			r.Warnings = append(r.Warnings, "in-kernel PM limit add_addr_accepted is 0: clients here ignore addresses servers announce (fine when mpdetour agent creates the subflows; raise with `ip mptcp limits set add_addr_accepted 1` otherwise)")
		}
	}
	if r.SeccompProblem != "" {
		if r.PreloadProblem == "" {
			r.Warnings = append(r.Warnings, "falling back to LD_PRELOAD: statically linked programs (Go binaries, ...) keep plain TCP")
		} else {
			r.Warnings = append(r.Warnings, "no mechanism available: mpdetour run cannot convert sockets on this host")
		}
	}
	return r
}

// Format writes the report for humans.
func (r *Report) Format(w io.Writer) {
	if r.SeccompProblem == "" {
		fmt.Fprintf(w, "seccomp user notification: available (%s)\n", r.SeccompProbe)
	} else {
		fmt.Fprintf(w, "seccomp user notification: unavailable: %s\n", r.SeccompProblem)
	}
	if r.PreloadProblem == "" {
		fmt.Fprintf(w, "LD_PRELOAD fallback: %s (dynamically linked programs only)\n", r.PreloadLib)
	} else {
		fmt.Fprintf(w, "LD_PRELOAD fallback: unavailable: %s\n", r.PreloadProblem)
	}
	if m := r.Mechanism(); m != "" {
		fmt.Fprintf(w, "mechanism: %s\n", m)
	} else {
		fmt.Fprintln(w, "mechanism: none")
	}
	fmt.Fprintf(w, "MPTCP enabled in this network namespace: %v\n", r.MPTCPEnabled)
	if r.PMType != "" {
		fmt.Fprintf(w, "path manager: %s\n", r.PMType)
	}
	if r.Limits != nil {
		fmt.Fprintf(w, "in-kernel PM limits: subflows %d, add_addr_accepted %d\n", r.Limits.Subflows, r.Limits.AddAddrAccepted)
	} else {
		fmt.Fprintf(w, "in-kernel PM limits: unknown: %s\n", r.LimitsProblem)
	}
	for _, s := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", s)
	}
}

// seccompUnavailable explains why the seccomp mechanism cannot work here,
// or returns "".
func seccompUnavailable() string {
	b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	if err != nil {
		return "kernel without seccomp filters (no /proc/sys/kernel/seccomp/actions_avail)"
	}
	if !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " user_notif ") {
		return "kernel lacks SECCOMP_RET_USER_NOTIF (Linux 5.0+)"
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "uname: " + err.Error()
	}
	if !kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 14) {
		return "kernel " + unix.ByteSliceToString(u.Release[:]) + " predates SECCOMP_ADDFD_FLAG_SEND (Linux 5.14)"
	}
	if err := checkNotifSizes(); err != nil {
		return err.Error()
	}
	return ""
}

// kernelAtLeast compares a release string such as "6.18.44-foo".
func kernelAtLeast(release string, major, minor int) bool {
	f := strings.FieldsFunc(release, func(r rune) bool { return r == '.' || r == '-' || r == '+' })
	if len(f) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(f[0])
	mi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// probeSeccomp runs the whole mechanism once: a child installs the filter,
// hands over the listener, and reports the protocol of a TCP socket() it
// makes; this process serves it.
func probeSeccomp() (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	ours := os.NewFile(uintptr(sp[0]), "probe")
	theirs := os.NewFile(uintptr(sp[1]), "probe-end")
	defer ours.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		theirs.Close()
		return 0, err
	}
	defer pr.Close()
	p, err := os.StartProcess(self, []string{argv0Probe}, &os.ProcAttr{
		Env:   []string{"MPDETOUR_RUN_INTERNAL=1"},
		Files: []*os.File{nil, pw, pw, theirs},
	})
	theirs.Close()
	pw.Close()
	if err != nil {
		return 0, err
	}
	lfdc := make(chan int, 1)
	go func() {
		// EOF instead of a listener when the child fails to install it.
		lfd, err := receiveListener(int(ours.Fd()))
		if err != nil {
			lfd = -1
		}
		lfdc <- lfd
	}()
	done := make(chan error, 1)
	select {
	case lfd := <-lfdc:
		if lfd >= 0 {
			go func() {
				_, err := Serve(lfd, slog.New(slog.NewTextHandler(io.Discard, nil)))
				done <- err
			}()
		} else {
			done <- nil
		}
	case <-time.After(10 * time.Second):
		p.Kill()
		done <- nil
	}
	out, _ := io.ReadAll(pr)
	st, werr := p.Wait()
	serr := <-done
	runtime.KeepAlive(ours)
	if werr != nil {
		return 0, werr
	}
	msg := strings.TrimSpace(string(out))
	if !st.Success() {
		return 0, fmt.Errorf("%s (%v)", msg, st)
	}
	if serr != nil {
		return 0, serr
	}
	proto, err := strconv.Atoi(strings.TrimPrefix(msg, "protocol "))
	if err != nil {
		return 0, fmt.Errorf("probe said %q", msg)
	}
	return proto, nil
}

func probeMain() int {
	runtime.LockOSThread()
	lfd, err := installFilter(false)
	if err != nil {
		fmt.Println(err)
		return 3
	}
	if err := unix.Sendmsg(3, []byte{'L'}, unix.UnixRights(lfd), nil, 0); err != nil {
		fmt.Println("send listener:", err)
		return 3
	}
	unix.Close(lfd)
	unix.Close(3)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Println("socket:", err)
		return 3
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		fmt.Println("getsockopt SO_PROTOCOL:", err)
		return 3
	}
	fmt.Printf("protocol %d\n", proto)
	return 0
}
