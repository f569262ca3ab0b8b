package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// unitCaps returns the capabilities a deploy/ unit grants its daemon
// (CapabilityBoundingSet), in setpriv's spelling: "+net_admin,+net_raw".
func unitCaps(t *testing.T, unit string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../deploy", unit))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s has no CapabilityBoundingSet", unit)
	}
	var caps []string
	for _, c := range strings.Fields(string(m[1])) {
		caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	return strings.Join(caps, ",")
}

// lockedWriter collects a daemon's output while the test reads it.
type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// startWithCaps runs bin with only caps (bounding, inheritable and ambient
// sets, no new privileges: what the unit's CapabilityBoundingSet and
// AmbientCapabilities give it) in namespace ns and waits for want in its
// output; it stops the daemon with SIGTERM before returning.
func startWithCaps(t *testing.T, ns *netnstest.NS, caps, want string, args ...string) {
	t.Helper()
	argv := append([]string{"netns", "exec", ns.Name, "setpriv",
		"--bounding-set=-all," + caps, "--inh-caps=-all," + caps, "--ambient-caps=-all," + caps,
		"--no-new-privs"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", argv...)
	var out lockedWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(15 * time.Second)
	for !strings.Contains(out.String(), want) {
		select {
		case err := <-exited:
			t.Fatalf("%s exited with the unit's capabilities (%s) before %q: %v\n%s", args[1], caps, want, err, out.String())
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("%s did not say %q within 15 s with the unit's capabilities (%s)\n%s", args[1], want, caps, out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := <-exited; err != nil {
		t.Errorf("%s after SIGINT: %v\n%s", args[1], err, out.String())
	}
}

// TestDeployUnitCapabilities starts the agent and the relay with exactly the
// capabilities their deploy/ units grant (no CAP_SYS_ADMIN) in a fresh
// namespace: both once failed at start because a netlink handle for "the
// current namespace" entered it with setns, which needs CAP_SYS_ADMIN, so the
// documented deployment could not start either daemon.
func TestDeployUnitCapabilities(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "setpriv")
	bin := mpdetourBin(t)
	dir := t.TempDir()

	t.Run("agent", func(t *testing.T) {
		ns := netnstest.New(t, "capa")
		cfg := filepath.Join(dir, "agent.yaml")
		// subflow_lowat: 0: the BPF program needs CAP_BPF, which is not what this test is about.
		if err := os.WriteFile(cfg, []byte("socket: "+filepath.Join(dir, "agent.sock")+"\nsubflow_lowat: 0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		startWithCaps(t, ns, unitCaps(t, "mpdetour-agent.service"), "agent running", bin, "agent", "--config", cfg)
	})

	t.Run("relay", func(t *testing.T) {
		ns := netnstest.New(t, "capr")
		key, err := exec.Command(bin, "relay", "genkey").Output()
		if err != nil {
			t.Fatal(err)
		}
		pubCmd := exec.Command(bin, "relay", "pubkey")
		pubCmd.Stdin = bytes.NewReader(key)
		pub, err := pubCmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		keyFile := filepath.Join(dir, "relay.key")
		if err := os.WriteFile(keyFile, key, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, "relay.yaml")
		conf := "listen: 127.0.0.1:45673\nprivate_key_file: " + keyFile + "\nports: 20000-20999\nlease: 2m\n" +
			"members:\n  - {name: alice, public_key: " + strings.TrimSpace(string(pub)) + "}\n" +
			"state_file: " + filepath.Join(dir, "relay-state.json") + "\n" +
			"tunnel:\n  listen_port: 51820\n  state_file: " + filepath.Join(dir, "tunnel.json") + "\n"
		if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		startWithCaps(t, ns, unitCaps(t, "mpdetour-relay.service"), "relay serving", bin, "relay", "--config", cfg)
	})
}
