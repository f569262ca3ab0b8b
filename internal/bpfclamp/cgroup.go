package bpfclamp

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup2Root finds the cgroup v2 mount (unified or hybrid hierarchy),
// where Attach attaches by default.
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup rw,... shared:9 - cgroup2 cgroup2 rw"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fs, pf := strings.Fields(post), strings.Fields(pre)
		if ok && len(fs) > 0 && fs[0] == "cgroup2" && len(pf) > 4 {
			return pf[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup v2 mount (cgroup_no_v1 / systemd.unified_cgroup_hierarchy, or set bpf_cgroup; ip netns exec remounts /sys without it: start the agent in the host's mount namespace with the netns: key)")
}

// OwnCgroup is the cgroup v2 directory this process is in, under root
// (Cgroup2Root).
func OwnCgroup(root string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, rest), nil
		}
	}
	return "", fmt.Errorf("no cgroup v2 line in /proc/self/cgroup")
}

// Probe says whether the program can be loaded and attached under the
// cgroup v2 directory dir ("" = the cgroup v2 mount's root), as the
// agent would: it loads the program and attaches it to a fresh child
// cgroup of dir (so that no socket of the host runs it, not even for a
// moment), then detaches it and removes the child. The error says what
// is missing: no cgroup v2, a kernel whose verifier refuses the program
// (bpf_skc_to_mptcp_sock needs kernel BTF and Linux 5.19), or the
// privileges (CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, or root). Where dir
// is a cgroup v2 directory it may not write (no child to attach to), it
// only loads the program: *AttachNotTriedError.
func Probe(dir string) (string, error) { return prober{mkdir: os.Mkdir}.probe(dir) }

// prober is Probe with its two seams: mkdir makes the child cgroup
// (os.Mkdir; tests stand in a read-only cgroup) and attached, when set,
// sees the child while the program is attached to it (tests).
type prober struct {
	mkdir    func(string, os.FileMode) error
	attached func(child string)
}

func (pr prober) probe(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = Cgroup2Root(); err != nil {
			return "", err
		}
	}
	btf := func(err error) error {
		if _, serr := os.Stat("/sys/kernel/btf/vmlinux"); errors.Is(serr, os.ErrNotExist) {
			err = fmt.Errorf("%w (no /sys/kernel/btf/vmlinux: the kernel has no BTF, CONFIG_DEBUG_INFO_BTF)", err)
		}
		return err
	}
	removeStaleProbes(dir)
	child := filepath.Join(dir, fmt.Sprintf("mpdetour-probe-%d", os.Getpid()))
	if err := pr.mkdir(child, 0o755); err != nil {
		err = fmt.Errorf("bpfclamp: create a probe cgroup under %s: %w", dir, err)
		var fs unix.Statfs_t
		if !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) ||
			unix.Statfs(dir, &fs) != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
			return dir, err
		}
		// A cgroup v2 directory this process may not write (a read-only
		// mount in a container, a delegated cgroup): the agent only opens
		// it read-only to attach, so load the program and say attaching
		// was not tried.
		c, lerr := load(Options{})
		if lerr != nil {
			return dir, btf(lerr)
		}
		return dir, errors.Join(&AttachNotTriedError{Err: err}, c.Close())
	}
	defer os.Remove(child)
	c, err := Attach(child, Options{})
	if err != nil {
		return dir, btf(err)
	}
	if pr.attached != nil {
		pr.attached(child)
	}
	return dir, c.Close()
}

// removeStaleProbes removes the probe cgroups under dir of processes that
// are gone (a doctor killed between making and removing its child): an
// empty cgroup, so rmdir is all it takes; one still in use stays.
func removeStaleProbes(dir string) {
	old, _ := filepath.Glob(filepath.Join(dir, "mpdetour-probe-*"))
	for _, p := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "mpdetour-probe-"))
		if err == nil && pid != os.Getpid() && errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			_ = os.Remove(p)
		}
	}
}

// AttachNotTriedError: Probe loaded the program but could not make a
// child cgroup to attach it to (Err says why); the agent, which attaches
// to the directory itself, may well succeed.
type AttachNotTriedError struct{ Err error }

func (e *AttachNotTriedError) Error() string {
	return "the program loads; attaching not tried: " + e.Err.Error()
}

func (e *AttachNotTriedError) Unwrap() error { return e.Err }
