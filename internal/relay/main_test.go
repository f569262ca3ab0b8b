package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/relayd"
)

// The integration tests run the relay as a separate process inside a
// namespace, so that kill -9 and SIGTERM are real. The test binary itself is
// that process when TR_RELAY_CONFIG is set, running the daemon
// (internal/relayd) as `mpdetour relay` does. TestMain is in the external
// test package because relayd imports the relay.
func TestMain(m *testing.M) {
	lab.Reexec()
	if cfg := os.Getenv("TR_RELAY_CONFIG"); cfg != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		err := relayd.Run(ctx, cfg, log, nil)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
