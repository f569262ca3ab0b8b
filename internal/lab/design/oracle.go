package design

import (
	"fmt"
	"slices"
	"strings"
)

// The real oracle of the candidates scenario: the best fixed
// subset of detours, found by measuring every subset the scenario allows
// instead of a few hand-picked ones. Subsets are enumerated here so that
// the scenario file (lab/scenarios/candidates-oracle.yaml) is checked
// against the enumeration by a test.

// Subsets lists every subset of items: the empty one first, then by size,
// and within a size in the order of items (combinations in lexicographic
// order of their positions). 2^len(items) subsets; items must be distinct.
func Subsets(items []string) [][]string {
	out := [][]string{{}}
	for k := 1; k <= len(items); k++ {
		idx := make([]int, k)
		for i := range idx {
			idx[i] = i
		}
		for {
			s := make([]string, k)
			for i, j := range idx {
				s[i] = items[j]
			}
			out = append(out, s)
			// next combination
			i := k - 1
			for i >= 0 && idx[i] == len(items)-k+i {
				i--
			}
			if i < 0 {
				break
			}
			idx[i]++
			for j := i + 1; j < k; j++ {
				idx[j] = idx[j-1] + 1
			}
		}
	}
	return out
}

// OracleSpace says which subsets of a scenario's detours the oracle
// measures.
type OracleSpace struct {
	// Detours are the scenario's candidate detours.
	Detours []string
	// Shared are detours that share the default path's bottleneck: a
	// subflow through one adds no capacity, so subsets are enumerated
	// without them and the oracle states the bound instead (at most the
	// default path's unused capacity, link rate minus plain TCP's goodput
	// on it, per shared bottleneck).
	Shared []string
}

// Subsets lists the measured subsets: every subset of the detours not in
// Shared (the empty one is MPTCP over the default path alone).
func (o OracleSpace) Subsets() ([][]string, error) {
	var items []string
	seen := map[string]bool{}
	for _, d := range o.Detours {
		if seen[d] {
			return nil, fmt.Errorf("detour %s listed twice", d)
		}
		seen[d] = true
		if !slices.Contains(o.Shared, d) {
			items = append(items, d)
		}
	}
	for _, s := range o.Shared {
		if !seen[s] {
			return nil, fmt.Errorf("shared detour %s is not a candidate", s)
		}
	}
	if len(items) > 12 {
		return nil, fmt.Errorf("%d detours: 2^%d subsets is more than a run can measure", len(items), len(items))
	}
	return Subsets(items), nil
}

// SubsetDetour is a subset as a scenario procedure's detour field
// ("detour3+detour7"); "" for the empty subset.
func SubsetDetour(s []string) string { return strings.Join(s, "+") }
