package main

import (
	"path"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// module is this module's import path.
const module = "github.com/mpdetour/mpdetour"

// badDep says why a package must not be linked into the product binary,
// or "" if it may. The evaluation lab (emulated networks, benchmarks and
// their plots, the attack suite, simulations) is the mpdetour-lab binary;
// test apparatus stays in tests (in the style of tailscale's
// tstest/deptest).
func badDep(pkg string) string {
	switch {
	case pkg == module+"/internal/lab" || strings.HasPrefix(pkg, module+"/internal/lab/"):
		if strings.HasPrefix(pkg, module+"/internal/lab/attack") {
			return "the attack suite belongs to the lab (mpdetour-lab)"
		}
		return "the lab belongs to mpdetour-lab"
	case strings.HasPrefix(pkg, module+"/lab/"):
		return "lab scenario files belong to mpdetour-lab"
	case strings.HasPrefix(pkg, "gonum.org/"):
		return "the plotting and statistics library is for lab reports"
	case pkg == "testing" || strings.HasPrefix(pkg, "testing/"):
		return "the standard testing package is for tests"
	case strings.HasPrefix(pkg, module+"/") && (strings.HasSuffix(path.Base(pkg), "test") || strings.Contains(pkg, "/testenv")):
		return "test apparatus (fakes, namespace helpers) is for tests"
	}
	return ""
}

// The product binary links no lab, plotting, attack or test package:
// `go list -deps` of this command (what the linker gets, tests excluded).
func TestProductDependencies(t *testing.T) {
	deps := testenv.Deps(t, module+"/cmd/mpdetour")
	for _, pkg := range deps {
		if why := badDep(pkg); why != "" {
			t.Errorf("cmd/mpdetour depends on %s: %s (find the import chain with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/mpdetour)", pkg, why)
		}
	}
}

// badDep recognises what it must (so that the test above can fail) and
// lets the product's own packages through.
func TestBadDep(t *testing.T) {
	for _, pkg := range []string{
		module + "/internal/lab", module + "/internal/lab/bench/report", module + "/internal/lab/attack",
		module + "/lab/scenarios", "gonum.org/v1/plot", "testing", "testing/quick",
		module + "/internal/testenv", module + "/internal/testenv/netnstest", module + "/internal/agent/kerneltest",
	} {
		if badDep(pkg) == "" {
			t.Errorf("%s not recognised as a lab or test package", pkg)
		}
	}
	for _, pkg := range []string{
		module + "/internal/relay", module + "/internal/agent", module + "/internal/benchtool",
		module + "/internal/collective", "golang.org/x/sys/unix", "flag", module + "/cmd/mpdetour",
		module + "/internal/labels",
	} {
		if why := badDep(pkg); why != "" {
			t.Errorf("%s flagged (%s)", pkg, why)
		}
	}
}
