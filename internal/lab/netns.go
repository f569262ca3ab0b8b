package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// NetnsDir is where named namespaces live, as with `ip netns add`.
const NetnsDir = "/run/netns"

// prepareNetnsDir makes NetnsDir a shared mount point the way iproute2
// does, so that namespaces we create are visible to `ip netns` in other
// mount namespaces and vice versa.
func prepareNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", NetnsDir, err)
	}
	return nil
}

// createNetns creates a new named network namespace without touching the
// calling thread's namespace: the unshare happens on a throw-away thread.
func createNetns(name string) error {
	path := filepath.Join(NetnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("network namespace %s already exists", name)
		}
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends up in the new namespace and the
		// runtime destroys it when this goroutine exits.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mounting namespace: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return fmt.Errorf("creating network namespace %s: %w", name, err)
	}
	return nil
}

// deleteNetns removes a named namespace; the kernel frees it once no
// process and no open file refers to it. Missing namespaces are fine.
func deleteNetns(name string) error {
	path := filepath.Join(NetnsDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// netnsIno returns the namespace inode of a named namespace (0 if gone).
func netnsIno(name string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(NetnsDir, name), &st); err != nil {
		return 0
	}
	if st.Ino == 0 {
		return 0
	}
	// An unmounted placeholder file lives on tmpfs, not nsfs.
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(NetnsDir, name), &fs); err != nil || fs.Type != unix.NSFS_MAGIC {
		return 0
	}
	return st.Ino
}

// killNetnsProcs SIGKILLs every process (other than us) whose network
// namespace is one of inos, as `ip netns pids` would find them, so that
// deleting the namespace really frees it. It returns the pids signalled.
func killNetnsProcs(inos map[uint64]bool) []int {
	if len(inos) == 0 {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var killed []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue
		}
		if inos[st.Ino] {
			if unix.Kill(pid, syscall.SIGKILL) == nil {
				killed = append(killed, pid)
			}
		}
	}
	return killed
}

// listNetns returns the named namespaces that belong to lab: "<lab>-X"
// where X has no '-' (node and link names cannot contain one, so lab "a"
// never claims lab "a-b"'s namespaces).
func listNetns(lab string) []string {
	ents, err := os.ReadDir(NetnsDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), lab+"-")
		if ok && rest != "" && !strings.Contains(rest, "-") {
			out = append(out, e.Name())
		}
	}
	return out
}
