package delayline

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// RunStateFile runs the delay line described by a state file (Config as
// JSON, written by the lab) until ctx ends; errors name the file. The lab
// starts one such process per lab ("mpdetour-lab delayline --state FILE",
// or a re-execution of a test binary), detached, and stops it with SIGTERM.
func RunStateFile(ctx context.Context, state string, log *slog.Logger) error {
	data, err := os.ReadFile(state)
	if err != nil {
		return err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return fmt.Errorf("%s: %w", state, err)
	}
	return Run(ctx, cfg, log)
}
