package delayline

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// Command is the hidden "lab delayline" subcommand. The lab starts one such
// process per lab, detached, and stops it with SIGTERM (main turns SIGTERM
// and Ctrl-C into ctx cancellation).
func Command() *cli.Command {
	var state string
	var debug bool
	return &cli.Command{
		Name:    "delayline",
		Summary: "internal: run a lab's user-space delay line (started by lab up)",
		Usage:   "--state FILE",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&state, "state", "", "JSON file describing the delayed links (delayline.Config)")
			fs.BoolVar(&debug, "debug", false, "verbose logs")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("delayline takes no arguments, got %q", args[0])
			}
			if state == "" {
				return cli.Usagef("--state FILE is required")
			}
			data, err := os.ReadFile(state)
			if err != nil {
				return err
			}
			cfg, err := ParseConfig(data)
			if err != nil {
				return fmt.Errorf("%s: %w", state, err)
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(cli.Stderr, &slog.HandlerOptions{Level: level}))
			return Run(ctx, cfg, log)
		},
	}
}
