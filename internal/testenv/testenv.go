// Package testenv gates integration tests on what the host offers.
//
// Outside CI a missing prerequisite skips the test with the reason; with
// CI=true it fails the test instead, so that CI can never go green by
// silently running nothing.
package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// missing skips or fails t with the reason.
func missing(t testing.TB, reason string) {
	t.Helper()
	if InCI() {
		t.Fatalf("prerequisite missing (CI=true, not skipping): %s", reason)
	}
	t.Skipf("prerequisite missing: %s", reason)
}

// Root requires uid 0 and the ability to create network namespaces.
func Root(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		missing(t, "must run as root (network namespaces)")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		missing(t, "kernel without network namespaces")
	}
}

// MPTCP requires root and an MPTCP-enabled kernel.
func MPTCP(t testing.TB) {
	t.Helper()
	Root(t)
	b, err := os.ReadFile("/proc/sys/net/mptcp/enabled")
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		missing(t, "MPTCP is not enabled (net.mptcp.enabled)")
	}
}

// Tools requires the named programs on PATH (tests use CLI tools to check state).
func Tools(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing(t, fmt.Sprintf("%s not installed (run scripts/setup.sh)", n))
		}
	}
}

// BuildMpdetour compiles the mpdetour command into dir and returns the
// binary's path.
func BuildMpdetour(dir string) (string, error) { return BuildCommand(dir, "mpdetour") }

// BinDirEnv names a directory holding binaries already built from this
// tree (make unit sets it to bin/ after make build): BuildCommand returns
// the binary there instead of linking it again in every test process.
const BinDirEnv = "MPDETOUR_TEST_BINDIR"

// BuildCommand compiles the command cmd/NAME (mpdetour, mpdetour-lab) into
// dir and returns the binary's path; with BinDirEnv set it returns the
// binary NAME there (an error if it is missing) and builds nothing.
func BuildCommand(dir, name string) (string, error) {
	if bd := os.Getenv(BinDirEnv); bd != "" {
		bin := filepath.Join(bd, name)
		st, err := os.Stat(bin)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %w (run make build)", BinDirEnv, bd, err)
		}
		if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s: %s is not an executable file (run make build)", BinDirEnv, bd, bin)
		}
		return bin, nil
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return "", fmt.Errorf("build %s: cannot find the module root (go env GOMOD: %q, %v)", name, gomod, err)
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "cmd", name)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, out)
	}
	return bin, nil
}

// DashboardMetrics returns the metric names starting with prefix that the
// Grafana dashboard at path (deploy/grafana-mpdetour.json) queries, with the
// histogram suffixes (_bucket, _count, _sum) removed.
func DashboardMetrics(t testing.TB, path, prefix string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	names := map[string]bool{}
	re := regexp.MustCompile(regexp.QuoteMeta(prefix) + `[a-z_]+`)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range re.FindAllString(tg.Expr, -1) {
				for _, suf := range []string{"_bucket", "_count", "_sum"} {
					n = strings.TrimSuffix(n, suf)
				}
				names[n] = true
			}
		}
	}
	return names
}

// Deps returns `go list -deps` of the package in the test's directory
// (what the linker gets, tests excluded), last the package itself, whose
// import path must be self; the test fails when go cannot list them.
func Deps(t testing.TB, self string) []string {
	t.Helper()
	Tools(t, "go")
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 || deps[len(deps)-1] != self {
		t.Fatalf("go list -deps printed %d packages, last %q: not %s's dependencies", len(deps), deps[len(deps)-1:], self)
	}
	return deps
}
