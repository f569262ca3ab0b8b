// Package labtest brings up the project's lab topologies for integration
// tests and takes them down in t.Cleanup, also when the test fails.
package labtest

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// UpDetours builds the built-in "detours" topology with the given number
// of detour nodes and no delay (a delay would need the user-space delay
// line; these are functional tests), as lab name. Node namespaces are
// "<name>-<node>".
func UpDetours(ctx context.Context, t testing.TB, name string, detours int) *lab.Lab {
	t.Helper()
	topo, err := topology.Builtin("detours")
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.Set("detours", fmt.Sprint(detours)); err != nil {
		t.Fatal(err)
	}
	if err := topo.Set("all.delay", "0"); err != nil {
		t.Fatal(err)
	}
	l, err := lab.Up(ctx, topo, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// DownOnInterrupt makes this test process take down the labs it built
// when it is interrupted (SIGINT, SIGTERM), which runs no t.Cleanup; call
// it from TestMain after lab.Reexec. The process still dies of the signal.
func DownOnInterrupt() {
	testenv.OnInterrupt(func() {
		if err := lab.DownBuiltBy(os.Getpid()); err != nil {
			fmt.Fprintf(os.Stderr, "labtest: taking down this process's labs after a signal: %v\n", err)
		}
	})
}
