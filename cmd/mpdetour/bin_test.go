package main

import (
	"os"
	"sync"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// The mpdetour binary the package's tests run, built from this tree once
// for all of them: each build relinks the whole binary, which cost several
// seconds per test (more on a loaded machine). TestMain removes it.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// mpdetourBin returns the path of the binary, building it on first use;
// a failed build fails every test that needs it.
func mpdetourBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "mpdetour-cmdtest-"); binErr == nil {
			binPath, binErr = testenv.BuildMpdetour(binDir)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}
