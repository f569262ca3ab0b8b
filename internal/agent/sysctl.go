package agent

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// inNetNS runs fn on a thread inside namespace ns ("" = the current one).
// /proc/sys/net resolves against the opening thread's namespace, so sysctl
// files must be opened there.
func inNetNS(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: Go then retires the thread instead of reusing a
		// thread left in another namespace.
		runtime.LockOSThread()
		var h netns.NsHandle
		var err error
		if strings.ContainsRune(ns, '/') {
			h, err = netns.GetFromPath(ns)
		} else {
			h, err = netns.GetFromName(ns)
		}
		if err != nil {
			errc <- fmt.Errorf("network namespace %q: %w", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter network namespace %q: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func readSysctl(ns, name string) (string, error) {
	var v string
	err := inNetNS(ns, func() error {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(name, ".", "/"))
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return v, nil
}

func writeSysctl(ns, name, value string) error {
	err := inNetNS(ns, func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(name, ".", "/"), []byte(value), 0)
	})
	if err != nil {
		return fmt.Errorf("set %s=%s: %w", name, value, err)
	}
	return nil
}

// useUserspacePM switches the namespace to the userspace path manager and
// returns a function restoring the previous choice.
func useUserspacePM(ns string) (restore func() error, err error) {
	if v, err := readSysctl(ns, "net.mptcp.enabled"); err != nil {
		return nil, fmt.Errorf("MPTCP unavailable: %w", err)
	} else if v != "1" {
		return nil, fmt.Errorf("MPTCP is disabled in this namespace (net.mptcp.enabled=%s)", v)
	}
	old, err := readSysctl(ns, "net.mptcp.pm_type")
	if err != nil {
		return nil, err
	}
	if err := writeSysctl(ns, "net.mptcp.pm_type", "1"); err != nil {
		return nil, err
	}
	return func() error { return writeSysctl(ns, "net.mptcp.pm_type", old) }, nil
}
