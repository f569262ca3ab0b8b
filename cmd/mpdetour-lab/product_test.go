package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The lab finds the product binary from --bin, or beside itself, and says
// which path it looked at when there is none there.
func TestProductBinary(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "mpdetour")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := productBinary(exe); err != nil || got != exe {
		t.Errorf("--bin %s: %q, %v", exe, got, err)
	}
	for _, c := range []struct{ bin, want string }{
		{filepath.Join(dir, "nope"), filepath.Join(dir, "nope") + " does not exist: build it (make build), or give --bin PATH"},
		{plain, plain + " is not an executable file"},
		{dir, dir + " is not an executable file"},
	} {
		if _, err := productBinary(c.bin); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--bin %s: %v, want an error with %q", c.bin, err, c.want)
		}
	}
	// Without --bin: mpdetour in this executable's directory (the test
	// binary's, where there is none).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	beside := filepath.Join(filepath.Dir(self), "mpdetour")
	if _, err := os.Stat(beside); err == nil {
		t.Skipf("%s exists", beside)
	}
	if _, err := productBinary(""); err == nil || !strings.Contains(err.Error(), beside+" does not exist") {
		t.Errorf("no --bin: %v, want it to name %s", err, beside)
	}
}
