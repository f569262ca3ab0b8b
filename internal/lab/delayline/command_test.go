package delayline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func runCommand(ctx context.Context, state string) error {
	return RunStateFile(ctx, state, slog.New(slog.NewTextHandler(os.Stderr, nil)))
}

func TestCommandErrors(t *testing.T) {
	if err := runCommand(context.Background(), filepath.Join(t.TempDir(), "none.json")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing state file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(bad, []byte(`{"links":[{"netns":"/n","a":"a","b":"b","delay_ab":"5"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	err := runCommand(context.Background(), bad)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "delay_ab") && !strings.Contains(err.Error(), "bad duration") {
		t.Errorf("bad state: %v, want the file and the problem named", err)
	}
	missingNs := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(missingNs, []byte(`{"links":[{"netns":"/run/netns/td-no-such-ns","a":"a","b":"b"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runCommand(context.Background(), missingNs); err == nil || !strings.Contains(err.Error(), "td-no-such-ns") {
		t.Errorf("missing namespace: %v", err)
	}
}

// TestCommandRunsAndStops: the subcommand, in its own process as the lab
// runs it (Run changes the process's scheduling priority), forwards frames
// until SIGTERM, then exits 0 and logs its statistics.
func TestCommandRunsAndStops(t *testing.T) {
	w := newWire(t, 3*time.Millisecond, 3*time.Millisecond)
	b, err := json.Marshal(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childCommandEnv+"="+state)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var rtts []time.Duration
	for i := 0; i < 20 && len(rtts) == 0; i++ {
		rtts = pingRTTs(t, w.A, addrB, 3, 10*time.Millisecond)
	}
	if len(rtts) == 0 || slices.Min(rtts) < 6*time.Millisecond-2*window {
		t.Fatalf("RTTs through the command's delay line: %v (log: %s)", rtts, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v (log: %s)", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "delay line stats") {
		t.Errorf("no statistics logged at exit: %s", stderr.String())
	}
}
