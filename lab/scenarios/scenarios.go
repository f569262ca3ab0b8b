// Package scenarios holds the built-in benchmark scenarios of
// `mpdetour-lab bench` (format: docs/bench.md). They are plain files so
// that they double as examples for writing new ones.
package scenarios

import "embed"

// FS holds every *.yaml scenario in this directory.
//
//go:embed *.yaml
var FS embed.FS
