package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/pathcheck"
)

// The text report ends with one line per family; an IPv6 server is refused
// with the reason.
func TestPathCheckFamilies(t *testing.T) {
	rep := &pathcheck.Report{Paths: []pathcheck.PathResult{{Path: pathcheck.Path{Name: "default"}, Verdict: pathcheck.OK},
		{Path: pathcheck.Path{Name: "nat:a"}, Verdict: pathcheck.Stripped}}}
	var b bytes.Buffer
	printPathCheck(&b, rep)
	for _, want := range []string{"IPv4: 2 paths probed (1 ok, 1 mptcp-stripped)", "IPv6: not probed"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	err := pathCheckCommand().Run(context.Background(), []string{"[fd00::2]:443"})
	if err == nil || !strings.Contains(err.Error(), "IPv6 server: path-check probes IPv4 paths only") {
		t.Errorf("IPv6 server: %v", err)
	}
}
