package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// An agent killed with -9 never restores pm_type; the next agent must
// restore the value found before the first one, not the userspace PM it
// finds.
func TestKernelRestoresPMTypeAfterACrash(t *testing.T) {
	testenv.Root(t)
	testenv.MPTCP(t)
	ns := netnstest.New(t, "tk")
	if err := ns.Sysctl("net/mptcp/pm_type", "0"); err != nil {
		t.Fatal(err)
	}
	cfg := Options{NetNS: ns.Path, Socket: filepath.Join(t.TempDir(), "agent.sock"), CommandWorkers: 1}
	first, err := OpenKernel(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := readSysctl(ns.Path, "net.mptcp.pm_type"); v != "1" {
		t.Fatalf("pm_type %q after OpenKernel, want 1", v)
	}
	// Crash: sockets go, nothing is restored.
	first.restore = nil
	first.Close()

	second, err := OpenKernel(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if second.PMTypeBefore != "0" {
		t.Errorf("second agent thinks pm_type was %q before, want 0", second.PMTypeBefore)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if v, _ := readSysctl(ns.Path, "net.mptcp.pm_type"); v != "0" {
		t.Fatalf("pm_type %q after a clean stop, want the original 0", v)
	}
	if _, err := os.Stat(second.stateFile); !os.IsNotExist(err) {
		t.Fatalf("state file %s left after a clean stop (%v)", second.stateFile, err)
	}
}
