package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// threadNices reads the nice value (field 19 of stat) of every thread.
func threadNices(t *testing.T) map[string]string {
	dirs, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue // thread exited
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		out[d] = f[16]
	}
	return out
}

func TestReniceAllThreads(t *testing.T) {
	testenv.Root(t)
	if err := renice(5); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { renice(0) })
	for task, n := range threadNices(t) {
		if n != "5" {
			t.Errorf("%s: nice %s, want 5", task, n)
		}
	}
}
