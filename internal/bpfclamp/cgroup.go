package bpfclamp

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	return "", errors.New("no cgroup v2 mount (cgroup_no_v1 / systemd.unified_cgroup_hierarchy, or set bpf_cgroup)")
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
