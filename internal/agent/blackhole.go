package agent

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
)

// The kernel's MPTCP blackhole fallback (Linux 6.12+, net/mptcp/ctrl.c):
// when SYNs carrying MP_CAPABLE are dropped and the plain TCP retry gets
// through, the kernel concludes that a middlebox drops MPTCP and disables
// MPTCP for every new outgoing connection of the namespace for
// net.mptcp.blackhole_timeout (3600 s; doubling on each repeat). Those
// connections are plain TCP: no path manager event, no detour, and
// nothing else in mpdetour would say so. The kernel exposes no state, only
// MPTcpExt counters; the agent reads them every BlackholePoll and infers:
//
//   - Blackhole rose: the kernel disabled active MPTCP just now;
//   - MPCapableSYNTXDisabled rose: connections were made plain TCP because
//     of it (the disable is in force);
//   - MPCapableSYNTX rose while MPCapableSYNTXDisabled did not: SYNs carry
//     MP_CAPABLE again (the timeout ran out or an operator cleared it);
//   - otherwise the state holds, a disable seen by the agent ending at the
//     earliest after blackhole_timeout (the kernel's own period, unknown
//     multiplier).
//
// Writing net.mptcp.blackhole_timeout (any value, the same one too) resets
// the kernel's disable at once (proc_blackhole_detect_timeout); `mpdetour
// doctor` prints the command.

// BlackholePoll is how often the agent reads the counters.
const BlackholePoll = 5 * time.Second

// Blackhole states.
const (
	BlackholeOK       = "ok"       // no disable seen
	BlackholeDisabled = "disabled" // new connections are plain TCP
	BlackholeOff      = "off"      // blackhole_timeout = 0: the kernel never disables
)

// BlackholeStatus is the kernel's MPTCP blackhole fallback as the agent
// sees it (JSON names stable).
type BlackholeStatus struct {
	State string `json:"state"`
	// Since: when the agent saw the disable (zero when not disabled).
	Since time.Time `json:"since,omitzero"`
	// Until: the earliest end of the kernel's disable period, when the
	// agent saw it start.
	Until time.Time `json:"until_earliest,omitzero"`
	// TimeoutS is net.mptcp.blackhole_timeout.
	TimeoutS int `json:"blackhole_timeout_s"`
	// Counters since boot: Blackhole (disables), MPCapableSYNTXDrop
	// (MP_CAPABLE SYNs given up on) and MPCapableSYNTXDisabled
	// (connections made plain TCP by a disable).
	Disables  uint64 `json:"disables"`
	SYNDrops  uint64 `json:"syn_drops"`
	Fallbacks uint64 `json:"fallbacks"`
	// Fix is what clears it (when disabled).
	Fix   string `json:"fix,omitempty"`
	Error string `json:"error,omitempty"`
}

// BlackholeFix is the command that re-enables MPTCP at once.
func BlackholeFix(timeoutS int) string {
	return "sysctl -w net.mptcp.blackhole_timeout=" + strconv.Itoa(timeoutS) +
		" (writing it re-enables MPTCP at once; first remove what drops MPTCP SYNs on the path: " +
		"mpdetour path-check, or set 0 to turn the detection off)"
}

// MIB counter names (MPTcpExt in /proc/net/netstat).
const (
	mibBlackhole   = "Blackhole"
	mibSYNTX       = "MPCapableSYNTX"
	mibSYNDrop     = "MPCapableSYNTXDrop"
	mibSYNDisabled = "MPCapableSYNTXDisabled"
)

// blackholeWatch keeps the inferred state between observations.
type blackholeWatch struct {
	log  *slog.Logger
	mu   sync.Mutex
	prev map[string]uint64
	st   BlackholeStatus
}

func newBlackholeWatch(log *slog.Logger) *blackholeWatch {
	return &blackholeWatch{log: log, st: BlackholeStatus{State: BlackholeOK}}
}

// observe takes one reading: the MPTcpExt counters and
// net.mptcp.blackhole_timeout (seconds), or the error reading them.
func (w *blackholeWatch) observe(now time.Time, mib map[string]uint64, timeoutS int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.st.Error = err.Error()
		return
	}
	w.st.Error = ""
	st := &w.st
	st.TimeoutS = timeoutS
	st.Disables, st.SYNDrops, st.Fallbacks = mib[mibBlackhole], mib[mibSYNDrop], mib[mibSYNDisabled]
	prev := w.prev
	w.prev = mib
	old := st.State
	rose := func(name string) bool { return prev != nil && mib[name] > prev[name] }
	switch {
	case timeoutS == 0:
		st.State = BlackholeOff
	case rose(mibBlackhole):
		st.State, st.Since, st.Until = BlackholeDisabled, now, now.Add(time.Duration(timeoutS)*time.Second)
	case rose(mibSYNDisabled):
		if st.State != BlackholeDisabled {
			// A disable from before the agent looked (or a second one
			// the counter did not show between two readings).
			st.State, st.Since, st.Until = BlackholeDisabled, now, time.Time{}
		}
	case rose(mibSYNTX):
		st.State = BlackholeOK
	case st.State == BlackholeOff:
		st.State = BlackholeOK
	}
	if st.State != BlackholeDisabled {
		st.Since, st.Until, st.Fix = time.Time{}, time.Time{}, ""
	} else {
		st.Fix = BlackholeFix(timeoutS)
	}
	if st.State == old {
		return
	}
	switch st.State {
	case BlackholeDisabled:
		w.log.Warn("the kernel disabled MPTCP for new connections (blackhole detection: MP_CAPABLE SYNs were dropped on a path); they are plain TCP and get no detours",
			"blackhole_timeout", time.Duration(timeoutS)*time.Second, "fallbacks", st.Fallbacks, "fix", st.Fix)
	case BlackholeOK:
		if old == BlackholeDisabled {
			w.log.Info("new connections use MPTCP again (the kernel's blackhole disable ended)")
		}
	case BlackholeOff:
		w.log.Info("net.mptcp.blackhole_timeout = 0: the kernel's blackhole detection is off")
	}
}

func (w *blackholeWatch) status() BlackholeStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

// readBlackhole reads the counters and the sysctl of netns.
func readBlackhole(netns string) (map[string]uint64, int, error) {
	mib, err := mptcppm.MIB(netns)
	if err != nil {
		return nil, 0, err
	}
	v, err := readSysctl(netns, "net.mptcp.blackhole_timeout")
	if err != nil {
		// Kernels before 6.12 have neither the sysctl nor the fallback.
		return mib, 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return nil, 0, err
	}
	return mib, n, nil
}

// run observes every poll until ctx ends.
func (w *blackholeWatch) run(ctx context.Context, poll time.Duration, read func() (map[string]uint64, int, error)) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		mib, to, err := read()
		w.observe(time.Now(), mib, to, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
