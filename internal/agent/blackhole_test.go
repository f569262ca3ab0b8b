package agent

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The kernel disabled MPTCP for new connections and
// nothing said so. The watch infers the state from the MPTcpExt counters
// (a fake reader here; TestBlackholeRealKernel provokes the real one).
func TestBlackholeWatchTransitions(t *testing.T) {
	var logs bytes.Buffer
	w := newBlackholeWatch(slog.New(slog.NewTextHandler(&logs, nil)))
	t0 := time.Unix(10000, 0)
	mib := func(bh, syn, drop, dis uint64) map[string]uint64 {
		return map[string]uint64{mibBlackhole: bh, mibSYNTX: syn, mibSYNDrop: drop, mibSYNDisabled: dis}
	}
	step := func(i int, mib map[string]uint64, timeout int, want string) BlackholeStatus {
		t.Helper()
		w.observe(t0.Add(time.Duration(i)*BlackholePoll), mib, timeout, nil)
		st := w.status()
		if st.State != want {
			t.Fatalf("step %d: state %q, want %q (%+v)", i, st.State, want, st)
		}
		return st
	}
	// Counters from before the agent: nothing to infer yet.
	step(0, mib(2, 100, 3, 7), 3600, BlackholeOK)
	step(1, mib(2, 120, 3, 7), 3600, BlackholeOK) // MPTCP connections
	// A SYN with MP_CAPABLE dropped, the plain retry got through: disabled.
	st := step(2, mib(3, 121, 4, 7), 3600, BlackholeDisabled)
	if st.Since != t0.Add(2*BlackholePoll) || st.Until != st.Since.Add(time.Hour) || !strings.Contains(st.Fix, "sysctl -w net.mptcp.blackhole_timeout=3600") {
		t.Fatalf("disabled: %+v", st)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d WARN lines at the disable, want 1:\n%s", n, logs.String())
	}
	// Connections made plain TCP: still disabled, no second WARN.
	step(3, mib(3, 121, 4, 20), 3600, BlackholeDisabled)
	step(4, mib(3, 121, 4, 20), 3600, BlackholeDisabled) // quiet: holds
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d WARN lines, want 1 per state change:\n%s", n, logs.String())
	}
	// Cleared (sysctl written, or the period ran out): MP_CAPABLE SYNs again.
	st = step(5, mib(3, 130, 4, 20), 3600, BlackholeOK)
	if !st.Since.IsZero() || st.Fix != "" || st.Fallbacks != 20 || st.Disables != 3 {
		t.Fatalf("after clearing: %+v", st)
	}
	if !strings.Contains(logs.String(), "use MPTCP again") {
		t.Fatalf("no line at the end of the disable:\n%s", logs.String())
	}
	// A disable from before the agent looked shows by its fallbacks.
	w2 := newBlackholeWatch(slog.New(slog.DiscardHandler))
	w2.observe(t0, mib(1, 5, 1, 9), 3600, nil)
	w2.observe(t0.Add(BlackholePoll), mib(1, 5, 1, 12), 3600, nil)
	if st := w2.status(); st.State != BlackholeDisabled || !st.Until.IsZero() {
		t.Fatalf("disable seen by its fallbacks only: %+v", st)
	}
	// Detection off; read errors are shown, the state kept.
	step(6, mib(3, 130, 4, 20), 0, BlackholeOff)
	w.observe(t0, nil, 0, errors.New("read MPTCP counters: boom"))
	if st := w.status(); st.Error == "" || st.State != BlackholeOff {
		t.Fatalf("after a read error: %+v", st)
	}
	step(7, mib(3, 131, 4, 20), 3600, BlackholeOK)
}

// pm_type changed under the agent is set back, with one
// WARN per change found.
func TestPMTypeGuard(t *testing.T) {
	var logs bytes.Buffer
	g := &pmTypeGuard{log: slog.New(slog.NewTextHandler(&logs, nil))}
	val := "1"
	read := func() (string, error) { return val, nil }
	write := func(v string) error { val = v; return nil }
	now := time.Unix(5000, 0)
	g.check(now, read, write)
	if st := g.status(); st.Restores != 0 || val != "1" {
		t.Fatalf("untouched: %+v", st)
	}
	val = "0" // another program
	g.check(now, read, write)
	g.check(now, read, write)
	if st := g.status(); st.Restores != 1 || st.LastFound != "0" || st.LastRestore != now || val != "1" {
		t.Fatalf("after a change: %+v, pm_type %s", st, val)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "set back to 1") {
		t.Fatalf("%d WARN lines, want 1:\n%s", n, logs.String())
	}
	val = "0"
	g.check(now, read, func(string) error { return errors.New("permission denied") })
	if st := g.status(); st.Error == "" || !strings.Contains(st.Error, "cannot be set back") {
		t.Fatalf("restore failing: %+v", st)
	}
}
