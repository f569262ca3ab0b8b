// Package version reports which build of mpdetour is running: the version
// given at link time (the Makefile and the packages pass `git describe`),
// else what the Go toolchain recorded in the binary's build information
// (`go install ...@v1.2.3` records the module version; `go build` and `go
// install` in a git checkout record the commit and whether the tree had
// uncommitted changes), so that every binary says which source it came from.
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is overridden with
// -ldflags "-X github.com/mpdetour/mpdetour/internal/version.Version=...";
// empty (or "dev") means: take it from the build information.
var Version = ""

// Info is what the binary knows about its build.
type Info struct {
	// Version: the link-time version, else the module version the
	// toolchain recorded, else "devel-<commit>[+dirty]", else "dev".
	Version string `json:"version"`
	// Revision is the full commit hash (empty when not recorded: built
	// outside a git checkout or with -buildvcs=false).
	Revision string `json:"revision,omitempty"`
	// Time is the commit time (RFC 3339) when recorded.
	Time string `json:"time,omitempty"`
	// Modified: the working tree had uncommitted changes at build time.
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

// Get returns the running binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return fromBuild(Version, bi)
}

// fromBuild resolves Info from a link-time version and the build info (nil
// when the binary has none).
func fromBuild(linked string, bi *debug.BuildInfo) Info {
	in := Info{Go: runtime.Version()}
	main := ""
	if bi != nil {
		if bi.GoVersion != "" {
			in.Go = bi.GoVersion
		}
		main = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.time":
				in.Time = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	switch {
	case linked != "" && linked != "dev":
		in.Version = linked
	case main != "" && main != "(devel)":
		in.Version = main
	case in.Revision != "":
		in.Version = "devel-" + short(in.Revision)
		if in.Modified {
			in.Version += "+dirty"
		}
	default:
		in.Version = "dev"
	}
	return in
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

// String is one line: the version, and the commit (with "modified" when the
// tree was dirty) when the version does not already name it, and the Go
// release: "v1.4.0 (go1.26.8)", "devel-94f18af1a2b3+dirty (go1.26.8)",
// "94f18af-dirty (commit 94f18af1a2b3, modified, go1.26.8)".
func (in Info) String() string {
	var extra []string
	if in.Revision != "" && !strings.Contains(in.Version, short(in.Revision)) && !strings.Contains(in.Version, in.Revision[:min(7, len(in.Revision))]) {
		extra = append(extra, "commit "+short(in.Revision))
	}
	if in.Revision != "" && len(extra) > 0 && in.Modified {
		extra = append(extra, "modified")
	}
	extra = append(extra, in.Go)
	return in.Version + " (" + strings.Join(extra, ", ") + ")"
}

// String is Get().String(): what `mpdetour version` prints and every bench
// record stores.
func String() string { return Get().String() }
