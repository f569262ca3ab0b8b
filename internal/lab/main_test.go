package lab

import (
	"os"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestMain lets this test binary serve as the lab's helpers (namespace exec
// shim, delay line), which are re-executions of the current binary. The
// labs it builds go with it when it is interrupted (what
// labtest.DownOnInterrupt does; this package's tests cannot import labtest).
func TestMain(m *testing.M) {
	Reexec()
	testenv.OnInterrupt(func() { _ = DownBuiltBy(os.Getpid()) })
	os.Exit(m.Run())
}
