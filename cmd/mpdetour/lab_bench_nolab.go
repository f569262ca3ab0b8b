//go:build nolab

package main

import (
	"context"
	"errors"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// labBenchCommand in a `nolab` build (relay and agent hosts: `make
// build-host`) is a stub, so that the plotting library the bench report
// uses is not linked into the binary that runs on detour hosts.
func labBenchCommand() *cli.Command {
	return &cli.Command{
		Name:    "bench",
		Summary: "not in this build (built with -tags nolab; use the full build for benchmarks)",
		Run: func(ctx context.Context, args []string) error {
			return errors.New("lab bench: this mpdetour was built with -tags nolab (no benchmark reports or plots); build it without the tag")
		},
	}
}

// labDesignCommand in a `nolab` build is a stub like labBenchCommand.
func labDesignCommand() *cli.Command {
	return &cli.Command{
		Name:    "design",
		Summary: "not in this build (built with -tags nolab; use the full build for benchmarks)",
		Run: func(ctx context.Context, args []string) error {
			return errors.New("lab design: this mpdetour was built with -tags nolab; build it without the tag")
		},
	}
}
