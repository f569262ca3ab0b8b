package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
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

// savedSysctls keeps what a mechanism found in sysctls of the agent's
// namespace before it changes them, for restore at stop and, through a
// state file beside the status socket (nsStateFile), for the next agent
// after a crash. One name is recorded as its bare value, several as
// name=value lines.
type savedSysctls struct {
	ns, state string
	names     []string
	orig      map[string]string
}

// saveSysctls first restores what a previous agent that did not stop
// cleanly recorded under prefix (every name present and valid), then
// records the current values (each checked by valid) in the state file.
// what names the mechanism in errors and the log.
func saveSysctls(cfg Options, prefix, what string, names []string, valid func(string) error, log *slog.Logger) (*savedSysctls, error) {
	state, err := nsStateFile(cfg, prefix)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s := &savedSysctls{ns: cfg.NetNS, state: state, names: names, orig: map[string]string{}}
	if saved, err := os.ReadFile(state); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(saved)), "\n") {
			name, v, ok := strings.Cut(line, "=")
			if !ok && len(names) == 1 {
				name, v = names[0], line
			}
			if v = strings.TrimSpace(v); slices.Contains(names, name) && valid(v) == nil {
				s.orig[name] = v
			}
		}
		if len(s.orig) == len(names) {
			log.Warn("a previous agent did not stop cleanly; restoring the "+what+" values it found", "state", state)
			if err := s.restore(); err != nil {
				return nil, err
			}
		}
		s.orig = map[string]string{}
	}
	var lines []string
	for _, name := range names {
		v, err := readSysctl(cfg.NetNS, name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if err := valid(v); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", what, name, err)
		}
		s.orig[name] = v
		lines = append(lines, name+"="+v)
	}
	if len(names) == 1 {
		lines = []string{s.orig[names[0]]}
	}
	if err := writeStateFile(state, strings.Join(lines, "\n")+"\n"); err != nil {
		return nil, fmt.Errorf("%s: state file: %w", what, err)
	}
	return s, nil
}

// restore puts back what was found and removes the state file.
func (s *savedSysctls) restore() error {
	var errs []error
	for _, name := range s.names {
		if v, ok := s.orig[name]; ok {
			errs = append(errs, writeSysctl(s.ns, name, v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(s.state); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
