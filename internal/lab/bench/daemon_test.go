package bench

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
)

// agentLog writes lines the way the agent logs them (slog's text
// handler at info level), so that a change of format fails here.
func agentLog(t *testing.T, write func(*slog.Logger)) string {
	t.Helper()
	var b bytes.Buffer
	write(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo})))
	return b.String()
}

func TestAgentPolicyLog(t *testing.T) {
	dir := t.TempDir()
	env := &Env{Dir: dir}
	got, err := AgentPolicyLog(env)
	if err != nil || got != nil {
		t.Fatalf("no agent log: got %q, %v; want nil, nil", got, err)
	}
	log := agentLog(t, func(l *slog.Logger) {
		l.Info("agent started", "policy", "guard")
		l.Info("subflow shed: slower and delivering little", "token", "0a0b0c0d", "path", "default", "why", "share 0.04 < 0.15")
		l.Debug("probe", "token", "0a0b0c0d", "path", "nat:r1") // not at info level: not written
		l.Info("server subflow limit learned", "server", "10.0.0.2:5201", "extra_subflows", 1)
		l.Warn("subflow destroy refused by the kernel: kept", "token", "0a0b0c0d", "path", "nat:r1", "err", "EINVAL")
		l.Error("status socket", "path", "/run/x.sock")
	})
	if err := os.WriteFile(filepath.Join(dir, "agent.log"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = AgentPolicyLog(env)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !strings.Contains(got[0], `msg="subflow shed: slower and delivering little"`) || !strings.Contains(got[0], "path=default") ||
		!strings.Contains(got[1], "level=WARN") || !strings.Contains(got[1], "path=nat:r1") {
		t.Fatalf("policy log: got %q; want the shed and the refused destroy", got)
	}
}

func TestPolicyLinesBounded(t *testing.T) {
	log := agentLog(t, func(l *slog.Logger) {
		for i := range results.PolicyLogMax + 7 {
			l.Info("path failed", "token", fmt.Sprintf("%08x", i), "path", "nat:r1", "reason", "timeout")
		}
	})
	got := policyLines(log, results.PolicyLogMax)
	if len(got) != results.PolicyLogMax {
		t.Fatalf("kept %d lines, want %d", len(got), results.PolicyLogMax)
	}
	if last := got[len(got)-1]; last != "(8 more lines not kept)" {
		t.Fatalf("last line %q, want the count of the 8 left out", last)
	}
	if !strings.Contains(got[0], "token=00000000") || !strings.Contains(got[len(got)-2], fmt.Sprintf("token=%08x", results.PolicyLogMax-2)) {
		t.Fatalf("kept lines are not the first ones in order: %q ... %q", got[0], got[len(got)-2])
	}
	if got := policyLines(log, len(strings.Split(strings.TrimSpace(log), "\n"))); len(got) != results.PolicyLogMax+7 || strings.HasPrefix(got[len(got)-1], "(") {
		t.Fatalf("exactly max lines: got %d (last %q), want all kept", len(got), got[len(got)-1])
	}
}
