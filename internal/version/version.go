// Package version reports the build's version, set at link time by the Makefile.
package version

import "runtime/debug"

// Version is overridden with -ldflags "-X github.com/mpdetour/mpdetour/internal/version.Version=...".
var Version = "dev"

// String returns the version with the VCS revision when the build recorded one.
func String() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 && v == "dev" {
				v += "+" + s.Value[:12]
			}
		}
		v += " (" + bi.GoVersion + ")"
	}
	return v
}
