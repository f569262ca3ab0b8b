package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

func TestFromBuild(t *testing.T) {
	vcs := func(rev string, modified bool, main string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/mpdetour/mpdetour", Version: main}}
		if rev != "" {
			m := "false"
			if modified {
				m = "true"
			}
			bi.Settings = []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: "2026-11-26T17:00:00Z"}, {Key: "vcs.modified", Value: m}}
		}
		return bi
	}
	const rev = "94f18af1a2b3c4d5e6f708192a3b4c5d6e7f8091"
	for _, tc := range []struct {
		name, linked string
		bi           *debug.BuildInfo
		want         string
		modified     bool
	}{
		{"go build, clean tree", "", vcs(rev, false, "(devel)"), "devel-94f18af1a2b3 (go1.26.8)", false},
		{"go build, dirty tree", "", vcs(rev, true, "(devel)"), "devel-94f18af1a2b3+dirty (go1.26.8)", true},
		{"go build, toolchain pseudo-version", "", vcs(rev, true, "v0.0.0-20261126170000-94f18af1a2b3+dirty"), "v0.0.0-20261126170000-94f18af1a2b3+dirty (go1.26.8)", true},
		{"go install @tag", "", vcs("", false, "v1.4.0"), "v1.4.0 (go1.26.8)", false},
		{"make build (git describe)", "94f18af-dirty", vcs(rev, true, "(devel)"), "94f18af-dirty (go1.26.8)", true},
		{"release ldflags + vcs", "v1.4.0", vcs(rev, true, "(devel)"), "v1.4.0 (commit 94f18af1a2b3, modified, go1.26.8)", true},
		{"ldflags dev is unset", "dev", vcs(rev, false, "(devel)"), "devel-94f18af1a2b3 (go1.26.8)", false},
		{"nothing recorded (-buildvcs=false, go test)", "", vcs("", false, "(devel)"), "dev (go1.26.8)", false},
		{"no build info", "", nil, "dev (" + Get().Go + ")", false},
	} {
		in := fromBuild(tc.linked, tc.bi)
		if got := in.String(); got != tc.want || in.Modified != tc.modified {
			t.Errorf("%s: %q modified=%v, want %q modified=%v", tc.name, got, in.Modified, tc.want, tc.modified)
		}
	}
}

// A plain `go build` in a git checkout is stamped: the package is copied
// into a fresh repository (a module of the same path, so the import is the
// real one), a two-line main built with the toolchain's default VCS
// stamping, and what it prints compared with the commit.
func TestGoBuildIsStamped(t *testing.T) {
	testenv.Tools(t, "git")
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir := t.TempDir()
	run := func(env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		// The toolchain's default (-buildvcs=auto), whatever GOFLAGS the
		// machine sets; git identity for the commit.
		cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=-buildvcs=auto", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.org",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.org"}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go .*$`).Find(gomod)
	src, _ := os.ReadFile("version.go")
	files := map[string]string{
		"go.mod":                      "module github.com/mpdetour/mpdetour\n\n" + string(goLine) + "\n",
		"internal/version/version.go": string(src),
		"cmd/stamp/main.go":           "package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/mpdetour/mpdetour/internal/version\"\n)\n\nfunc main() { fmt.Println(version.String()) }\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(nil, "git", "init", "-q")
	run(nil, "git", "add", "-A")
	run(nil, "git", "commit", "-qm", "stamp")
	rev := run(nil, "git", "rev-parse", "HEAD")[:12]
	bin := filepath.Join(dir, "stamp")
	run(nil, "go", "build", "-o", bin, "./cmd/stamp")
	if v := run(nil, bin); !strings.Contains(v, rev) || strings.Contains(v, "dirty") || strings.HasPrefix(v, "dev ") {
		t.Errorf("go build of a clean tree: %q, want the commit %s without dirty", v, rev)
	}
	os.WriteFile(filepath.Join(dir, "cmd/stamp/extra.go"), []byte("package main\n"), 0o644)
	run(nil, "go", "build", "-o", bin, "./cmd/stamp")
	if v := run(nil, bin); !strings.Contains(v, rev) || !strings.Contains(v, "dirty") {
		t.Errorf("go build of a modified tree: %q, want the commit %s and dirty", v, rev)
	}
	run(nil, "go", "build", "-ldflags", "-X github.com/mpdetour/mpdetour/internal/version.Version=v9.9.9", "-o", bin, "./cmd/stamp")
	if v := run(nil, bin); !strings.HasPrefix(v, "v9.9.9 (commit "+rev+", modified, go") {
		t.Errorf("link-time version: %q, want v9.9.9 with the commit %s, modified", v, rev)
	}
}
