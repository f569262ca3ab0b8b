package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
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

func TestParseAttackBuilds(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "mpdetour")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "notes")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bs, err := parseBuilds("before=" + exe + ",after=" + exe)
	if err != nil || len(bs) != 2 || bs[0].label != "before" || bs[1].path != exe {
		t.Fatalf("parseBuilds: %+v, %v", bs, err)
	}
	for _, bad := range []string{"before", "=" + exe, "a=" + exe + ",a=" + exe, "a=" + plain, "a=" + dir, "a=" + filepath.Join(dir, "missing")} {
		if _, err := parseBuilds(bad); err == nil {
			t.Errorf("parseBuilds(%q): no error", bad)
		}
	}
}
