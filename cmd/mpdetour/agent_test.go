package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

func TestAgentRejectsBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("detours:\n  - kind: nat\n    relay: r1\n    address: 10.1.1.2\n    server: 10.0.3.2:5201\n"), 0o644)
	var out, errb bytes.Buffer
	code := cli.Main(context.Background(), "mpdetour", commands(), []string{"agent", "--config", path}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "detours[0].address") || !strings.Contains(errb.String(), path) {
		t.Fatalf("exit %d, stderr %q: want 1 and the file and field named", code, errb.String())
	}
	errb.Reset()
	os.WriteFile(path, []byte("server:\n  announce:\n    - {name: d, address: 127.0.0.1:5201}\n"), 0o644)
	code = cli.Main(context.Background(), "mpdetour", commands(), []string{"agent", "--check", "--config", path}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), path+":3:") || !strings.Contains(errb.String(), "server.announce[0].address") {
		t.Fatalf("bad server section: exit %d, stderr %q: want 1 and file:line and the field named", code, errb.String())
	}
	errb.Reset()
	// --check lists the relays and the v1 daemons with their own leases.
	os.WriteFile(path, []byte("legacy_v1:\n  - {name: old, address: 10.1.1.3:45672, lease: 5m}\n  - {name: older, address: 10.1.1.4:45672}\n"), 0o644)
	printed := captureStdout(t, func() {
		code = cli.Main(context.Background(), "mpdetour", commands(), []string{"agent", "--check", "--config", path}, &out, &errb)
	})
	for _, want := range []string{"legacy v1 daemon old at 10.1.1.3:45672 (unauthenticated), lease 5m0s", "legacy v1 daemon older at 10.1.1.4:45672 (unauthenticated), lease 10m0s"} {
		if code != 0 || !strings.Contains(printed, want) {
			t.Fatalf("--check: exit %d, stdout %q lacks %q (stderr %q)", code, printed, want, errb.String())
		}
	}
	errb.Reset()
	if code := cli.Main(context.Background(), "mpdetour", commands(), []string{"agent"}, &out, &errb); code != cli.ExitUsage {
		t.Fatalf("agent without --config: exit %d (%s), want %d", code, errb.String(), cli.ExitUsage)
	}
	errb.Reset()
	sock := filepath.Join(t.TempDir(), "none.sock")
	if code := cli.Main(context.Background(), "mpdetour", commands(), []string{"status", "--socket", sock}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "is mpdetour agent running") {
		t.Fatalf("status without agent: exit %d, %q", code, errb.String())
	}
}

// The real binary in a namespace: status over the socket, and SIGTERM
// restores the namespace's path manager.
func TestAgentProcess(t *testing.T) {
	testenv.MPTCP(t)
	dir := t.TempDir()
	bin := mpdetourBin(t)
	ns := netnstest.New(t, "tap")
	sock := filepath.Join(dir, "agent.sock")
	cfg := filepath.Join(dir, "agent.yaml")
	// Without the BPF program (subflow_lowat: 0, the default written
	// out; the limit has its own tests, agent_lowat_test.go): never at
	// the cgroup v2 root.
	const cg = "subflow_lowat: 0\n"
	os.WriteFile(cfg, []byte("socket: "+sock+"\n"+cg+"detours:\n  - {kind: nat, relay: r1, address: 10.1.1.2:4000, server: 10.0.3.2:5201}\n"), 0o644)
	cmd := exec.Command("ip", "netns", "exec", ns.Name, bin, "agent", "--config", cfg)
	st, logs, exited := startAgentStatus(t, bin, cmd, sock)
	if st.PMTypeSaved != "0" || len(st.Detours) != 1 || st.Detours[0].Relay != "r1" || !st.Detours[0].Healthy {
		t.Fatalf("status %+v", st)
	}
	// Buffer sizing is on by default: what it found is kept beside the
	// socket until the agent stops.
	rmem := strings.Join(strings.Fields(ns.Run("sysctl", "-n", "net.ipv4.tcp_rmem")), " ")
	if b := st.BufferSizing; b == nil || b.State != "on" || b.Found["net.ipv4.tcp_rmem"] != rmem {
		t.Fatalf("status buffer_sizing %+v, want on by default, found tcp_rmem %q", b, rmem)
	}
	if states, _ := filepath.Glob(filepath.Join(dir, "buffers.*")); len(states) != 1 {
		t.Fatalf("buffer sizing state files %v, want one while the agent runs", states)
	}
	if v := strings.TrimSpace(ns.Run("sysctl", "-n", "net.mptcp.pm_type")); v != "1" {
		t.Fatalf("pm_type under the agent = %s", v)
	}
	// A second agent in the namespace, even with its socket elsewhere, is
	// refused before it touches anything: before the lock it restored the
	// path manager and the buffer sizes the first one had set when it gave
	// up on the status socket (and with another socket it would have run).
	cfg2 := filepath.Join(t.TempDir(), "agent2.yaml")
	os.WriteFile(cfg2, []byte("socket: "+filepath.Join(filepath.Dir(cfg2), "agent.sock")+"\n"+cg+"detours:\n  - {kind: nat, relay: r1, address: 10.1.1.2:4000, server: 10.0.3.2:5201}\n"), 0o644)
	for _, c := range []string{cfg, cfg2} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		second, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, bin, "agent", "--config", c).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(second), "another mpdetour agent runs in this network namespace (pid ") {
			t.Fatalf("second agent in the namespace (%s): %v: %s", c, err, second)
		}
	}
	if v := strings.TrimSpace(ns.Run("sysctl", "-n", "net.mptcp.pm_type")); v != "1" {
		t.Fatalf("pm_type after a refused second agent = %s, want the first agent's 1", v)
	}
	if states, _ := filepath.Glob(filepath.Join(dir, "buffers.*")); len(states) != 1 {
		t.Fatalf("buffer sizing state files %v after a refused second agent, want the first agent's", states)
	}
	text, err := exec.Command(bin, "status", "--socket", sock).CombinedOutput()
	if err != nil || !strings.Contains(string(text), "nat:r1") || !strings.Contains(string(text), "DETOUR") || !strings.Contains(string(text), "buffer sizing: on") {
		t.Fatalf("status table: %v: %s", err, text)
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
	if v := strings.TrimSpace(ns.Run("sysctl", "-n", "net.mptcp.pm_type")); v != "0" {
		t.Fatalf("pm_type after SIGTERM = %s, want 0 restored", v)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("status socket left behind: %v", err)
	}
	if states, _ := filepath.Glob(filepath.Join(dir, "buffers.*")); len(states) != 0 {
		t.Errorf("buffer sizing state files left after SIGTERM: %v", states)
	}
	if v := strings.Join(strings.Fields(ns.Run("sysctl", "-n", "net.ipv4.tcp_rmem")), " "); v != rmem {
		t.Errorf("tcp_rmem after SIGTERM %q, want %q", v, rmem)
	}
}

// startAgentStatus starts the agent command cmd (its stderr collected in
// logs; killed at cleanup if still running) and waits up to 10 s for its
// status socket sock to answer `status --json`.
func startAgentStatus(t *testing.T, bin string, cmd *exec.Cmd, sock string) (agent.Status, *bytes.Buffer, <-chan error) {
	t.Helper()
	logs := &bytes.Buffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	var st agent.Status
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, err := exec.Command(bin, "status", "--json", "--socket", sock).Output()
		if err == nil {
			if err := json.Unmarshal(out, &st); err != nil {
				t.Fatalf("status --json: %v: %s", err, out)
			}
			return st, logs, exited
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent status never answered: %v; agent log: %s", err, logs.String())
		}
	}
}
