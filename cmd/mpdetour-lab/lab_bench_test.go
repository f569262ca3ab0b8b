package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/cli"
)

func runBench(args ...string) error {
	c := labBenchCommand()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Flags(fs)
	if err := fs.Parse(args); err != nil {
		return &cli.UsageError{Msg: err.Error()}
	}
	return c.Run(context.Background(), fs.Args())
}

func TestBenchCommandErrors(t *testing.T) {
	var ue *cli.UsageError
	for _, args := range [][]string{
		{},
		{"a", "b"},
		{"--procedures", "tcp,udp", "smoke"},
		{"--trials", "-1", "smoke"},
	} {
		if err := runBench(args...); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	if err := runBench("nosuch"); err == nil || !strings.Contains(err.Error(), "built-in: ") {
		t.Errorf("unknown scenario: %v", err)
	}
	// --report on a directory without trials names the missing log.
	dir := t.TempDir()
	err := runBench("--report", "--out", dir, "smoke")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "trials.jsonl")) {
		t.Errorf("--report without trials: %v", err)
	}
}
