package version

import (
	"runtime/debug"
	"testing"
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
