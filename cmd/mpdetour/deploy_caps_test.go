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
	// AmbientCapabilities grants the same (what the daemon keeps if the
	// unit is given a User= other than root; the test starts it so).
	if a := regexp.MustCompile(`(?m)^AmbientCapabilities=(.+)$`).FindSubmatch(b); a == nil || string(a[1]) != string(m[1]) {
		t.Errorf("%s: AmbientCapabilities %q differ from CapabilityBoundingSet %q", unit, a, m[1])
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
	runWithCaps(t, ns, caps, false, want, nil, args...)
}

// runWithCaps is startWithCaps; with cgroupMount the command runs with a
// cgroup v2 mount at /sys/fs/cgroup (ip netns exec remounts /sys without
// one; the mount stays in the exec's own mount namespace), and while
// runs with the daemon's output so far once want appeared, before the
// daemon is stopped.
func runWithCaps(t *testing.T, ns *netnstest.NS, caps string, cgroupMount bool, want string, while func(out string), args ...string) {
	t.Helper()
	argv := []string{"netns", "exec", ns.Name}
	if cgroupMount {
		argv = append(argv, "sh", "-c", `mount -t cgroup2 none /sys/fs/cgroup && exec "$@"`, "sh")
	}
	argv = append(argv, "setpriv",
		"--bounding-set=-all,"+caps, "--inh-caps=-all,"+caps, "--ambient-caps=-all,"+caps,
		"--no-new-privs")
	argv = append(argv, args...)
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
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := <-exited; err != nil {
			t.Errorf("%s after SIGINT: %v\n%s", args[1], err, out.String())
		}
	}
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
	if while != nil {
		defer stop()
		while(out.String())
		return
	}
	stop()
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
		// subflow_lowat: 0 (off; the limit is on by default): the BPF program needs CAP_BPF, which is not what this test is about.
		if err := os.WriteFile(cfg, []byte("socket: "+filepath.Join(dir, "agent.sock")+"\nsubflow_lowat: 0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		startWithCaps(t, ns, unitCaps(t, "mpdetour-agent.service"), "agent running", bin, "agent", "--config", cfg)
	})

	// With the unit's capabilities the agent's BPF program (the default
	// subflow_lowat: the config does not set it) loads and attaches to
	// its bpf_cgroup; without
	// CAP_BPF it runs without it and says what is missing.
	lowat := func(t *testing.T, caps string, attached int, say string) {
		cg := testCgroup(t, "mpdetour-capcg")
		ns := netnstest.New(t, "capl")
		cfg := filepath.Join(dir, "agent-lowat.yaml")
		// bpf_cgroup as the agent sees it: the cgroup v2 mount is at
		// /sys/fs/cgroup inside (runWithCaps), wherever the host has it.
		conf := "socket: " + filepath.Join(dir, "agent-lowat.sock") + "\nbpf_cgroup: /sys/fs/cgroup/" + filepath.Base(cg) + "\n"
		if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		runWithCaps(t, ns, caps, true, "agent running", func(out string) {
			if n := sockOpsAttached(t, cg); n != attached {
				t.Errorf("%d sock_ops programs attached to %s with capabilities %s, want %d\n%s", n, cg, caps, attached, out)
			}
			if !strings.Contains(out, say) {
				t.Errorf("agent log with capabilities %s does not say %q:\n%s", caps, say, out)
			}
		}, bin, "agent", "--config", cfg)
		if n := sockOpsAttached(t, cg); n != 0 {
			t.Errorf("%d sock_ops programs left on %s after the agent stopped", n, cg)
		}
	}
	t.Run("agent-bpf", func(t *testing.T) {
		lowat(t, unitCaps(t, "mpdetour-agent.service"), 1, "subflow lowat on")
	})
	t.Run("agent-no-cap-bpf", func(t *testing.T) {
		var caps []string
		for _, c := range strings.Split(unitCaps(t, "mpdetour-agent.service"), ",") {
			if c != "+bpf" {
				caps = append(caps, c)
			}
		}
		lowat(t, strings.Join(caps, ","), 0, "CAP_BPF")
	})

	// An agent started with ip netns exec (no cgroup v2 mount in its
	// view) and the default limit (subflow_lowat not set): it runs
	// without the program and one warning names ip netns exec, the
	// netns: key and that the limit is the default.
	t.Run("agent-ip-netns-exec", func(t *testing.T) {
		ns := netnstest.New(t, "capx")
		cfg := filepath.Join(dir, "agent-nocg.yaml")
		if err := os.WriteFile(cfg, []byte("socket: "+filepath.Join(dir, "agent-nocg.sock")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		runWithCaps(t, ns, unitCaps(t, "mpdetour-agent.service"), false, "agent running", func(out string) {
			if strings.Count(out, "subflow lowat off") != 1 || !strings.Contains(out, "ip netns exec") || !strings.Contains(out, "netns:") || !strings.Contains(out, "on by default") {
				t.Errorf("agent log does not say the limit is off because ip netns exec hides the cgroup mount (use netns:):\n%s", out)
			}
		}, bin, "agent", "--config", cfg)
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
