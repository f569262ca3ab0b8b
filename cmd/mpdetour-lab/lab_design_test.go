package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// Flag combinations the design runner cannot honour are usage errors
// naming the problem, before any lab is built (--order was ignored with
// --sequential).
func TestDesignFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sequential", "--order", "balanced", "--dry-run"}, "--sequential runs one bench per policy"},
		{[]string{"--space", "nope", "--dry-run"}, `--space "nope"`},
	} {
		cmd := labDesignCommand()
		fs := flag.NewFlagSet("design", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cmd.Flags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		err := cmd.Run(context.Background(), fs.Args())
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}
