package main

import (
	"os"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab"
)

// TestMain lets this test binary serve as the lab's helpers (namespace exec
// shim, delay line), which are re-executions of the current binary.
func TestMain(m *testing.M) {
	lab.Reexec()
	os.Exit(m.Run())
}
