package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// The lab's old command paths answer with one line naming the command to
// run instead, arguments and flags kept, and stay out of --help.
func TestMovedToLab(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lab", "up", "detours", "--name", "x"}, `mpdetour: "mpdetour lab" moved to the lab binary, mpdetour-lab (make build puts it beside mpdetour): run mpdetour-lab up detours --name x` + "\n"},
		{[]string{"lab"}, "run mpdetour-lab\n"},
		{[]string{"lab", "--help"}, "run mpdetour-lab --help\n"},
		{[]string{"collective", "simulate", "--relays", "3"}, "run mpdetour-lab collective simulate --relays 3\n"},
	} {
		var out, errb bytes.Buffer
		code := cli.Main(context.Background(), "mpdetour", commands(), c.args, &out, &errb)
		if code != 1 || !strings.HasSuffix(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 and one line ending %q", c.args, code, out.String(), errb.String(), c.want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"collective", "--help"}} {
		var out, errb bytes.Buffer
		cli.Main(context.Background(), "mpdetour", commands(), args, &out, &errb)
		if strings.Contains(out.String(), "simulate") || strings.Contains(out.String(), "\n  lab ") {
			t.Errorf("%q lists a moved command:\n%s", args, out.String())
		}
	}
}
