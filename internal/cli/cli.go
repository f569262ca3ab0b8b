// Package cli is the small command framework behind the mpdetour and
// mpdetour-lab binaries: each main hands Main (or Program) its list of
// subcommands, each parses its own flags with the standard flag package,
// and reports usage errors with exit status 2 so that scripts can tell "you
// called it wrong" from "it failed".
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// ExitUsage is the exit status for unknown commands, unknown flags and
// malformed arguments, as with most Unix tools.
const ExitUsage = 2

// Command is one subcommand (or one sub-subcommand of a group).
type Command struct {
	Name    string
	Summary string // one line, shown in the parent's help
	// Usage is the argument synopsis after the command path, e.g. "TOPOLOGY [--name NAME]".
	Usage string
	// Flags declares the command's flags on fs. It may be nil.
	Flags func(fs *flag.FlagSet)
	// Run executes the command with the arguments left after flag parsing.
	// Exactly one of Run and Sub is set.
	Run func(ctx context.Context, args []string) error
	// Sub lists the sub-subcommands of a group such as "lab".
	Sub []*Command
	// Interspersed allows flags after positional arguments (e.g. "lab up brennan2017 --set x=y").
	// Arguments after "--" are never treated as flags.
	Interspersed bool
	// Hidden leaves the command out of its parent's help (internal helpers,
	// pointers to commands that moved).
	Hidden bool
	// RawArgs hands Run every argument unparsed, flags and --help included
	// (Flags is then unused).
	RawArgs bool
}

// UsageError marks an error caused by how the command was called.
type UsageError struct {
	Msg  string
	Path []string // the command path, filled in by the dispatcher
}

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a UsageError; commands return it for bad positional arguments.
func Usagef(format string, a ...any) error { return &UsageError{Msg: fmt.Sprintf(format, a...)} }

// Main runs the program named prog, whose subcommands are cmds (in help
// order), with args and returns the exit status.
func Main(ctx context.Context, prog string, cmds []*Command, args []string, stdout, stderr io.Writer) int {
	return Program(ctx, &Command{Name: prog, Summary: "multipath TCP through detour hosts", Sub: cmds}, args, stdout, stderr)
}

// Program runs the program root (root.Name is the program's name,
// root.Summary the first line of its help, root.Sub its commands) with args
// and returns the exit status.
func Program(ctx context.Context, root *Command, args []string, stdout, stderr io.Writer) int {
	prog := root.Name
	err := dispatch(ctx, root, []string{prog}, args, stdout)
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "%s: %s\n", prog, ue.Msg)
		path := ue.Path
		if len(path) == 0 {
			path = []string{prog}
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", strings.Join(path, " "))
		return ExitUsage
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return 1
}

// ExitError lets a command choose its exit status without printing anything
// more (used by "run" to pass a child's status through).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

func withPath(err error, path []string) error {
	var ue *UsageError
	if errors.As(err, &ue) && len(ue.Path) == 0 {
		ue.Path = append([]string(nil), path...)
	}
	return err
}

func dispatch(ctx context.Context, c *Command, path, args []string, out io.Writer) error {
	if c.Sub != nil {
		if len(args) == 0 {
			printHelp(out, c, path)
			return withPath(Usagef("missing command"), path)
		}
		switch args[0] {
		case "-h", "--help", "-help", "help":
			printHelp(out, c, path)
			return nil
		}
		if strings.HasPrefix(args[0], "-") {
			return withPath(Usagef("unknown flag %s", args[0]), path)
		}
		for _, s := range c.Sub {
			if s.Name == args[0] {
				return dispatch(ctx, s, append(path, s.Name), args[1:], out)
			}
		}
		return withPath(Usagef("unknown command %q", args[0]), path)
	}
	if c.RawArgs {
		return withPath(c.Run(ctx, args), path)
	}
	fs := flag.NewFlagSet(strings.Join(path, " "), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.Flags != nil {
		c.Flags(fs)
	}
	rest, err := parseFlags(fs, args, c.Interspersed)
	if errors.Is(err, flag.ErrHelp) {
		printCommandHelp(out, c, path, fs)
		return flag.ErrHelp
	}
	if err != nil {
		return withPath(Usagef("%v", err), path)
	}
	return withPath(c.Run(ctx, rest), path)
}

// parseFlags parses flags; with interspersed it also accepts flags after
// positional arguments. Everything after the first "--" is positional.
func parseFlags(fs *flag.FlagSet, args []string, interspersed bool) ([]string, error) {
	if !interspersed {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return fs.Args(), nil
	}
	var after []string
	for i, a := range args {
		if a == "--" {
			args, after = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return append(pos, after...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func printHelp(out io.Writer, c *Command, path []string) {
	fmt.Fprintf(out, "Usage: %s <command> [flags] [args]\n\n", strings.Join(path, " "))
	if len(path) == 1 {
		fmt.Fprintf(out, "%s: %s.\n\n", path[0], c.Summary)
	} else if c.Summary != "" {
		fmt.Fprintf(out, "%s.\n\n", c.Summary)
	}
	fmt.Fprintln(out, "Commands:")
	for _, s := range c.Sub {
		if !s.Hidden {
			fmt.Fprintf(out, "  %-10s %s\n", s.Name, s.Summary)
		}
	}
	fmt.Fprintf(out, "\nRun '%s <command> --help' for a command's flags.\n", strings.Join(path, " "))
}

func printCommandHelp(out io.Writer, c *Command, path []string, fs *flag.FlagSet) {
	fmt.Fprintf(out, "Usage: %s", strings.Join(path, " "))
	if c.Usage != "" {
		fmt.Fprintf(out, " %s", c.Usage)
	}
	fmt.Fprintf(out, "\n\n%s.\n", c.Summary)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(out, "\nFlags:")
		fs.SetOutput(out)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

// PrintJSON writes v to stdout as indented JSON, the form every --json flag prints.
func PrintJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Stderr is where commands write diagnostics; tests may replace it.
var Stderr io.Writer = os.Stderr
