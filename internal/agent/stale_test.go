package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

func staleLossCnt(t *testing.T, ns *netnstest.NS) string {
	t.Helper()
	var v string
	if err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/mptcp/stale_loss_cnt")
		v = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// waitStale polls until the namespace's stale_loss_cnt reads want.
func waitStale(t *testing.T, ns *netnstest.NS, want, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for staleLossCnt(t, ns) != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if v := staleLossCnt(t, ns); v != want {
		t.Fatalf("%s: stale_loss_cnt %s, want %s", what, v, want)
	}
}

// stale_loss_cnt: the agent sets net.mptcp.stale_loss_cnt in its
// namespace while it runs and puts back what it found when it stops; a
// state file left by an agent that did not stop makes the next one restore
// the value it names first. The kernel is the fake; the sysctl is a real
// namespace's.
func TestAgentStaleLossCntSetsAndRestores(t *testing.T) {
	testenv.MPTCP(t)
	ns := netnstest.New(t, "stl")
	if err := ns.Sysctl("net/mptcp/stale_loss_cnt", "4"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := agent.Options{NetNS: ns.Name, Socket: filepath.Join(dir, "agent.sock"), Subflows: 1, MaxConnections: 10,
		CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: time.Second, StallRetransmits: 3, Policy: policy.Static, StaleLossCnt: 2}
	h := run(t, cfg)
	waitStale(t, ns, "2", "running")
	if st := h.a.Status().StaleLossCnt; st == nil || st.State != "set" || st.Want != 2 || st.Was != "4" {
		t.Fatalf("status %+v, want set 2, was 4", st)
	}
	h.stop()
	if v := staleLossCnt(t, ns); v != "4" {
		t.Fatalf("after stop stale_loss_cnt %s, want 4 back", v)
	}
	if states, _ := filepath.Glob(filepath.Join(dir, "stale.*")); len(states) != 0 {
		t.Fatalf("state files left: %v", states)
	}

	// An agent killed with the value set left its state file (found 4,
	// set 2): the next one restores 4 before it sets its own.
	if err := ns.Sysctl("net/mptcp/stale_loss_cnt", "2"); err != nil {
		t.Fatal(err)
	}
	writeNSState(t, ns, dir, "stale", "4\n")
	cfg.StaleLossCnt = 3
	h2 := run(t, cfg)
	waitStale(t, ns, "3", "second agent")
	h2.stop()

	// A namespace the agent cannot write to (read-only /proc/sys is hard to
	// fake; a namespace that does not exist fails the same path): one
	// warning, status says failed, the agent runs.
	bad := cfg
	bad.NetNS = "mpdetour-no-such-ns-stl"
	bad.Socket = filepath.Join(t.TempDir(), "agent.sock")
	h3 := run(t, bad)
	if st := h3.a.Status().StaleLossCnt; st == nil || st.State != "failed" || st.Error == "" {
		t.Fatalf("status %+v, want failed with a reason", st)
	}
	h3.stop()
	if v := staleLossCnt(t, ns); v != "4" {
		t.Fatalf("after a crashed agent's state file and a clean stop: stale_loss_cnt %s, want the original 4", v)
	}
}
