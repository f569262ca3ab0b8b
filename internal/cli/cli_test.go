package cli

import (
	"bytes"
	"context"
	"flag"
	"reflect"
	"strings"
	"testing"
)

func testRoot(got *[]string, n *int) []*Command {
	return []*Command{{
		Name: "lab", Summary: "lab things",
		Sub: []*Command{{
			Name: "up", Summary: "bring a lab up", Interspersed: true,
			Flags: func(fs *flag.FlagSet) { fs.IntVar(n, "n", 0, "a number") },
			Run: func(ctx context.Context, args []string) error {
				*got = args
				if len(args) == 0 {
					return Usagef("up needs a TOPOLOGY")
				}
				return nil
			},
		}},
	}}
}

func TestDispatch(t *testing.T) {
	var got []string
	var n int
	root := testRoot(&got, &n)

	cases := []struct {
		args     []string
		code     int
		wantArgs []string
		wantN    int
		stderr   string
	}{
		{[]string{"lab", "up", "topo", "-n", "3", "--", "-x"}, 0, []string{"topo", "-x"}, 3, ""},
		{[]string{"lab", "up", "-n=4", "a", "b"}, 0, []string{"a", "b"}, 4, ""},
		{[]string{"lab", "down"}, 2, nil, 0, `unknown command "down"`},
		{[]string{"nope"}, 2, nil, 0, `unknown command "nope"`},
		{[]string{"lab", "up", "--bogus"}, 2, nil, 0, "flag provided but not defined: -bogus"},
		{[]string{"lab", "up"}, 2, nil, 0, "up needs a TOPOLOGY"},
		{[]string{"lab"}, 2, nil, 0, "missing command"},
		{[]string{"--help"}, 0, nil, 0, ""},
		{[]string{"lab", "up", "--help"}, 0, nil, 0, ""},
	}
	for _, c := range cases {
		got, n = nil, 0
		var out, errb bytes.Buffer
		code := Main(context.Background(), "mpdetour", root, c.args, &out, &errb)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", c.args, code, c.code, errb.String())
		}
		if c.code == 0 && c.wantArgs != nil && (!reflect.DeepEqual(got, c.wantArgs) || n != c.wantN) {
			t.Errorf("%v: args %q n=%d, want %q n=%d", c.args, got, n, c.wantArgs, c.wantN)
		}
		if !strings.Contains(errb.String(), c.stderr) {
			t.Errorf("%v: stderr %q lacks %q", c.args, errb.String(), c.stderr)
		}
	}
}

func TestHelpListsCommandsAndFlags(t *testing.T) {
	var got []string
	var n int
	root := testRoot(&got, &n)
	var out bytes.Buffer
	Main(context.Background(), "mpdetour", root, []string{"--help"}, &out, &out)
	if !strings.Contains(out.String(), "lab        lab things") {
		t.Errorf("root help lacks the lab line:\n%s", out.String())
	}
	out.Reset()
	Main(context.Background(), "mpdetour", root, []string{"lab", "up", "-h"}, &out, &out)
	if !strings.Contains(out.String(), "bring a lab up") || !strings.Contains(out.String(), "-n int") {
		t.Errorf("command help lacks summary or flags:\n%s", out.String())
	}
}

// A Hidden command runs but is not listed; a RawArgs command gets every
// argument, flags and --help included; Program names the program and its
// summary.
func TestHiddenRawArgsProgram(t *testing.T) {
	var got []string
	root := &Command{Name: "prog-lab", Summary: "the lab program", Sub: []*Command{
		{Name: "shown", Summary: "a shown command", Run: func(context.Context, []string) error { return nil }},
		{Name: "old", Summary: "moved", Hidden: true, RawArgs: true, Run: func(_ context.Context, args []string) error {
			got = args
			return nil
		}},
	}}
	var out, errb bytes.Buffer
	if code := Program(context.Background(), root, []string{"--help"}, &out, &errb); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	if !strings.Contains(out.String(), "prog-lab: the lab program.") || !strings.Contains(out.String(), "shown") || strings.Contains(out.String(), "old") {
		t.Errorf("help:\n%s", out.String())
	}
	want := []string{"up", "--name", "x", "--help", "--", "-y"}
	if code := Program(context.Background(), root, append([]string{"old"}, want...), &out, &errb); code != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("raw args: exit %d, got %q, want %q (stderr %q)", code, got, want, errb.String())
	}
}
