// Package labtest brings up the project's lab topologies for integration
// tests and takes them down in t.Cleanup, also when the test fails.
package labtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
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
