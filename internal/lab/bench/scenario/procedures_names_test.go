package scenario

import (
	"slices"
	"testing"
)

// TestProcedureNamesListsEveryProcedure: the list that error messages and
// reports use names every procedure the scenario layer knows, once.
func TestProcedureNamesListsEveryProcedure(t *testing.T) {
	names := ProcedureNames()
	for name := range procs {
		if n := len(slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s != name })); n != 1 {
			t.Errorf("procedure %q listed %d times in ProcedureNames", name, n)
		}
	}
	if len(names) != len(procs) {
		t.Errorf("ProcedureNames has %d entries, %d procedures known", len(names), len(procs))
	}
}
