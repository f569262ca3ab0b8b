package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// testCgroup makes a cgroup v2 directory of the test's own for an
// agent's bpf_cgroup (never the cgroup v2 root: other labs' sockets),
// removed when the test ends.
func testCgroup(t *testing.T, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, BPF)")
	}
	root, err := bpfclamp.Cgroup2Root()
	if err != nil {
		t.Skip(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	})
	return dir
}

// sockOpsAttached counts the sock_ops programs attached to cgroup dir.
func sockOpsAttached(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatal(err)
	}
	return len(r.Programs)
}

// runAgentStatus starts the real agent binary for a fresh namespace with
// config text cfg (its socket added), waits for its status and returns
// it with the text status, then stops it with SIGTERM and returns its
// log.
func runAgentStatus(t *testing.T, cfg string) (agent.Status, string, string) {
	t.Helper()
	return runAgentStatusWhile(t, cfg, nil)
}

// runAgentStatusWhile is runAgentStatus; while (if set) runs once the
// status answered, before the agent is stopped.
func runAgentStatusWhile(t *testing.T, cfg string, while func()) (agent.Status, string, string) {
	t.Helper()
	testenv.MPTCP(t)
	dir := t.TempDir()
	bin := mpdetourBin(t)
	ns := netnstest.New(t, "talw")
	sock := filepath.Join(dir, "agent.sock")
	path := filepath.Join(dir, "agent.yaml")
	// netns: the agent manages the namespace from the host's mount
	// namespace, where the cgroup v2 mount is (ip netns exec remounts
	// /sys without it).
	if err := os.WriteFile(path, []byte("socket: "+sock+"\nnetns: "+ns.Name+"\n"+cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "agent", "--config", path)
	st, logs, exited := startAgentStatus(t, bin, cmd, sock)
	text, err := exec.Command(bin, "status", "--socket", sock).CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v: %s", err, text)
	}
	if while != nil {
		while()
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exit after SIGTERM: %v; log: %s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent ignored SIGTERM")
	}
	return st, string(text), logs.String()
}

// A config that sets subflow_lowat: 131072, and one that does not set it
// (the default), get the limit in the cgroup bpf_cgroup names (attached
// there while the agent runs, not at the cgroup v2 root); status says
// which is the default; nothing stays attached after SIGTERM.
func TestAgentLowatSet(t *testing.T) {
	for _, tc := range []struct {
		name, cfg string
		dflt      bool
	}{{"set", "subflow_lowat: 131072\n", false}, {"default", "", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cg := testCgroup(t, "mpd-agent-lowat")
			running := -1
			st, text, logs := runAgentStatusWhile(t, tc.cfg+"bpf_cgroup: "+cg+"\n", func() { running = sockOpsAttached(t, cg) })
			// Attached to bpf_cgroup, not anywhere else (the cgroup v2 root).
			if running != 1 {
				t.Errorf("%d sock_ops programs attached to %s while the agent ran, want 1; log: %s", running, cg, logs)
			}
			if l := st.SubflowLowat; l == nil || l.State != "active" || l.Bytes != 131072 || l.Default != tc.dflt || l.Cgroup != cg {
				t.Fatalf("status subflow_lowat %+v, want active with 131072 bytes at %s, default %v; log: %s", l, cg, tc.dflt, logs)
			}
			if !strings.Contains(text, "subflow lowat: active, 131072 bytes unsent at most per subflow") || !strings.Contains(text, "program at "+cg) ||
				strings.Contains(text, "(the default)") != tc.dflt {
				t.Errorf("status text:\n%s", text)
			}
			if strings.Contains(logs, "level=WARN") {
				t.Errorf("warnings with the program attached: %s", logs)
			}
			if n := sockOpsAttached(t, cg); n != 0 {
				t.Errorf("%d programs attached to %s after the agent exited", n, cg)
			}
		})
	}
}

// subflow_lowat_scale: rtt: the same program, status says the limit is
// scaled, with subflow_lowat its floor and the namespace's tcp_wmem
// maximum its ceiling (a new namespace starts with the host's).
func TestAgentLowatScaled(t *testing.T) {
	cg := testCgroup(t, "mpd-agent-lowatrtt")
	wmem, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(wmem))
	st, text, logs := runAgentStatus(t, "subflow_lowat: 131072\nsubflow_lowat_scale: rtt\nbpf_cgroup: "+cg+"\n")
	l := st.SubflowLowat
	t.Logf("status: %s", text)
	if l == nil || l.State != "active" || l.Bytes != 131072 || l.Scale != "rtt" || l.Ceil != max(atoiOr(f[2]), 131072) {
		t.Fatalf("status subflow_lowat %+v, want active, scale rtt, 131072 up to tcp_wmem's maximum %s; log: %s", l, f[2], logs)
	}
	if !strings.Contains(text, "subflow lowat: active, unsent limit scaled to the subflows' RTTs (scale rtt), 131072-") {
		t.Errorf("status text:\n%s", text)
	}
	if strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "scaled to the subflows' RTTs") {
		t.Errorf("log: %s", logs)
	}
}

// atoiOr is s as a uint32 (0 if it is not one).
func atoiOr(s string) uint32 {
	var n uint32
	fmt.Sscan(s, &n)
	return n
}

// subflow_lowat: 0 runs without the limit: no program, no status line,
// no warning. (A config without subflow_lowat gets the default limit:
// TestAgentLowatSet; never run here without bpf_cgroup, which would
// attach the program to the cgroup v2 root.)
func TestAgentLowatOff(t *testing.T) {
	st, text, logs := runAgentStatus(t, "subflow_lowat: 0\n")
	if st.SubflowLowat != nil || strings.Contains(text, "subflow lowat") || strings.Contains(logs, "subflow lowat on") || strings.Contains(logs, "level=WARN") {
		t.Errorf("status %+v, text %q, log %q: want no limit and no warning", st.SubflowLowat, text, logs)
	}
}

// An explicit limit and the default when the program cannot attach
// (bpf_cgroup is no cgroup v2 directory, standing for a host without
// cgroup v2, BTF or privileges): exactly one warning line, status says
// failed and that the agent runs without it (for the default also that
// it is the default and how to turn it off), the agent runs and exits
// cleanly.
func TestAgentLowatFallback(t *testing.T) {
	for _, tc := range []struct {
		name, cfg string
		dflt      bool
	}{{"set", "subflow_lowat: 131072\n", false}, {"default", "", true}} {
		t.Run(tc.name, func(t *testing.T) {
			notCgroup := t.TempDir()
			st, text, logs := runAgentStatus(t, tc.cfg+"bpf_cgroup: "+notCgroup+"\n")
			if l := st.SubflowLowat; l == nil || l.State != "failed" || l.Bytes != 131072 || l.Default != tc.dflt || !strings.Contains(l.Error, notCgroup) {
				t.Fatalf("status subflow_lowat %+v, want failed naming %s; log: %s", l, notCgroup, logs)
			}
			if !strings.Contains(text, "subflow lowat: failed: ") || !strings.Contains(text, "(running without it") ||
				strings.Contains(text, "the default: subflow_lowat: 0 turns it off") != tc.dflt {
				t.Errorf("status text:\n%s", text)
			}
			var warns []string
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, "level=WARN") {
					warns = append(warns, line)
				}
			}
			if len(warns) != 1 || !strings.Contains(warns[0], "subflow lowat off") || !strings.Contains(warns[0], "running without it") ||
				strings.Contains(warns[0], "on by default") != tc.dflt {
				t.Errorf("warnings %q, want exactly one saying the limit is off and why", warns)
			}
		})
	}
}
