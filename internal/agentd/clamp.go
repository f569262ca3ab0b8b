package agentd

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// clampMap is where clamps go: the BPF program's map (bpfclamp.Clamper),
// or a fake in tests.
type clampMap interface {
	Set(k bpfclamp.Key, segs uint32) error
	Close() error
}

// attachClamp loads and attaches the clamp program to the cgroup v2
// directory cgroup ("" = the cgroup v2 mount's root).
func attachClamp(cgroup string) (clampMap, error) {
	if cgroup == "" {
		var err error
		if cgroup, err = cgroup2Root(); err != nil {
			return nil, err
		}
	}
	return bpfclamp.Attach(cgroup)
}

// cgroup2Root finds the cgroup v2 mount (unified or hybrid hierarchy).
func cgroup2Root() (string, error) {
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
	return "", errors.New("no cgroup v2 mount (cgroup_no_v1 / systemd.unified_cgroup_hierarchy, or set cwnd_clamp.cgroup)")
}

// cwndClamps runs the cwnd_clamp mechanism: the policy's clamp decisions
// (policy.Clamps) from every round of measurements, written into the BPF
// program's map. A program that cannot be loaded or attached leaves the
// agent running without clamps, said once in the log and in status.
type cwndClamps struct {
	log    *slog.Logger
	decide *policy.Clamps
	m      clampMap // nil: failed
	err    string
}

// startClamps attaches through attach (attachClamp outside tests).
func startClamps(s ClampSettings, sources []detour.Source, log *slog.Logger, attach func(string) (clampMap, error)) *cwndClamps {
	c := &cwndClamps{log: log, decide: policy.NewClamps(sources)}
	m, err := attach(s.Cgroup)
	if err != nil {
		c.err = err.Error()
		log.Warn("cwnd clamps off: the BPF program could not be loaded or attached; running without them", "err", err)
		return c
	}
	c.m = m
	log.Info("cwnd clamps on: tunnel subflows are clamped to 1.25 x their measured bandwidth-delay product")
	return c
}

// measured decides and applies the clamps of one round of measurements
// (agent.Options.OnMeasured).
func (c *cwndClamps) measured(ms []policy.Measurement) {
	if c.m == nil {
		return
	}
	for _, cl := range c.decide.Decide(ms) {
		if err := c.m.Set(bpfclamp.Key{Local: cl.Local, Remote: cl.Remote}, cl.Segments); err != nil {
			c.log.Warn("cwnd clamp not set", "local", cl.Local, "remote", cl.Remote, "err", err)
			continue
		}
		c.log.Info("cwnd clamp", "local", cl.Local, "remote", cl.Remote, "segments", cl.Segments, "rule", cl.Reason)
	}
}

// status is the mechanism for "mpdetour status".
func (c *cwndClamps) status() policy.ClampStatus {
	if c.m == nil {
		return policy.ClampStatus{State: "failed", Error: c.err}
	}
	return policy.ClampStatus{State: "active", Pairs: c.decide.Pairs()}
}

// close detaches the program (the kernel also does when the agent dies:
// the BPF link goes with its last file descriptor).
func (c *cwndClamps) close() error {
	if c.m == nil {
		return nil
	}
	if err := c.m.Close(); err != nil {
		return fmt.Errorf("cwnd clamps: %w", err)
	}
	return nil
}
