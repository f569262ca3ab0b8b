package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A second agent in the same namespace and state directory is refused,
// naming the first one's pid, and may start once the first released.
func TestLockOneAgentPerNamespace(t *testing.T) {
	dir := t.TempDir()
	cfg := Options{Socket: filepath.Join(dir, "agent.sock")}
	release, err := Lock(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Lock(cfg)
	if err == nil {
		t.Fatal("a second agent got the lock while the first held it")
	}
	if !strings.Contains(err.Error(), "another mpdetour agent") || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("error does not say who holds it: %v", err)
	}
	// Another state directory is another scope (as the crash state files).
	other, err := Lock(Options{Socket: filepath.Join(t.TempDir(), "agent.sock")})
	if err != nil {
		t.Fatalf("lock in another state directory: %v", err)
	}
	other()
	release()
	again, err := Lock(cfg)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again()
}
