package agent_test

import (
	"os"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
)

// TestMain lets this test binary serve as the lab's helpers (namespace exec
// shim, delay line), which are re-executions of the current binary.
func TestMain(m *testing.M) {
	lab.Reexec()
	labtest.DownOnInterrupt() // the labs this process built go with it on Ctrl-C or SIGTERM
	os.Exit(m.Run())
}
