package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// The product cases' flags: wrong combinations and bad builds are usage
// errors naming the problem, before any lab is built.
func TestAttackCasesFlags(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "mpdetour")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	notExe := filepath.Join(dir, "plain")
	if err := os.WriteFile(notExe, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--cases", "all", "other"}, "go with the attacks scenario"},
		{[]string{"--builds", "a=" + exe, "attacks"}, "go with the attacks scenario"},
		{[]string{"--cases", "all", "--builds", exe, "attacks"}, "is not LABEL=PATH"},
		{[]string{"--cases", "all", "--builds", "a=" + exe + ",a=" + exe, "attacks"}, "given twice"},
		{[]string{"--cases", "all", "--builds", "a=" + notExe, "attacks"}, "not an executable file"},
		{[]string{"--cases", "all", "--builds", "a=" + filepath.Join(dir, "missing"), "attacks"}, "no such file"},
		{[]string{"--cases", "nope", "--builds", "a=" + exe, "--out", dir, "attacks"}, `unknown case "nope"`},
	} {
		err := runBench(c.args...)
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}
