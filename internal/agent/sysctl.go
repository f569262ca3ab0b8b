package agent

import (
	"fmt"
	"os"
	"strings"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

func readSysctl(ns, name string) (string, error) {
	var v string
	err := netnsx.Do(ns, func() error {
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
	err := netnsx.Do(ns, func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(name, ".", "/"), []byte(value), 0)
	})
	if err != nil {
		return fmt.Errorf("set %s=%s: %w", name, value, err)
	}
	return nil
}

// useUserspacePM switches the namespace to the userspace path manager and
// returns a function restoring old.
func useUserspacePM(ns, old string) (restore func() error, err error) {
	if v, err := readSysctl(ns, "net.mptcp.enabled"); err != nil {
		return nil, fmt.Errorf("MPTCP unavailable: %w", err)
	} else if v != "1" {
		return nil, fmt.Errorf("MPTCP is disabled in this namespace (net.mptcp.enabled=%s)", v)
	}
	if err := writeSysctl(ns, "net.mptcp.pm_type", "1"); err != nil {
		return nil, err
	}
	return func() error { return writeSysctl(ns, "net.mptcp.pm_type", old) }, nil
}
