package main

import (
	"context"
	"flag"
	"log/slog"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/delayline"
)

// labDelaylineCommand is the hidden "mpdetour-lab delayline" command: the same
// code the lab runs in its detached delay-line process, for running one by
// hand from a state file.
func labDelaylineCommand() *cli.Command {
	var state string
	var debug bool
	return &cli.Command{
		Name:    "delayline",
		Hidden:  true,
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
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			return delayline.RunStateFile(ctx, state, slog.New(slog.NewTextHandler(cli.Stderr, &slog.HandlerOptions{Level: level})))
		},
	}
}
