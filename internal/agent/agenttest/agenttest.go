// Package agenttest runs an agent inside the test process for integration
// tests of the packages that feed it (relay, tunnels, run). The agent's
// own tests cannot use it (import cycle) and keep their own helper.
package agenttest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/detour"
)

// Agent is an agent.Run running in a goroutine of the test.
type Agent struct {
	cancel context.CancelFunc
	done   chan error
}

// Start runs agent.RunLinux(ctx, cfg, log, nil, sources...) until ctx ends or Stop,
// and returns once its status socket (cfg.Socket) answers; it fails the
// test if that takes more than 10 s. The caller stops it with Stop (a
// defer or t.Cleanup, whichever order its other resources need).
func Start(ctx context.Context, t testing.TB, cfg agent.Options, log *slog.Logger, sources ...detour.Source) *Agent {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	a := &Agent{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- agent.RunLinux(ctx, cfg, log, nil, sources...) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := agent.FetchStatus(cfg.Socket)
		if err == nil {
			return a
		}
		if time.Now().After(deadline) {
			a.Stop(t)
			t.Fatalf("agent status socket never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop cancels the agent and fails the test if Run returned an error or did
// not return within 10 s. Only the first call does anything.
func (a *Agent) Stop(t testing.TB) {
	t.Helper()
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("agent: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("agent did not stop within 10s")
	}
}
