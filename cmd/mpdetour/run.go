package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/run"
)

// runCommand builds the run subcommand.
func runCommand() *cli.Command {
	// mpdetour run re-executes this binary for its supervisor; that helper
	// must not go through the command framework or signal handling of main.
	if run.Internal() {
		os.Exit(run.InternalMain())
	}
	var (
		check     bool
		mechanism string
		logPath   string
		convert   string
	)
	return &cli.Command{
		Name:    "run",
		Summary: "run a program with its TCP sockets turned into MPTCP sockets",
		Usage:   "[--mechanism auto|seccomp|preload] [--log FILE] [--convert SOCKET|off] [--] CMD [ARGS...] | --check",
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&check, "check", false, "report which mechanism this host supports and why, then exit")
			fs.StringVar(&mechanism, "mechanism", "auto", "auto, seccomp (covers static binaries) or preload (LD_PRELOAD libmptcpwrap, dynamic binaries only)")
			fs.StringVar(&logPath, "log", "", "append the seccomp supervisor's log to `FILE` (default: discarded)")
			fs.StringVar(&convert, "convert", "", "the agent's conversion `SOCKET`: connections to servers known not to speak MPTCP go through a converter (docs/convert.md); default "+convclient.DefaultSocket+" when it exists, off to disable")
		},
		Run: func(ctx context.Context, args []string) error {
			mech, err := run.ParseMechanism(mechanism)
			if err != nil {
				return cli.Usagef("%v", err)
			}
			if check {
				if len(args) > 0 {
					return cli.Usagef("--check takes no command")
				}
				r := run.Check()
				r.Format(os.Stdout)
				if r.Mechanism() == "" {
					return &cli.ExitError{Code: 1}
				}
				return nil
			}
			if len(args) == 0 {
				return cli.Usagef("missing command to run")
			}
			switch convert {
			case "off":
				convert = ""
			case "":
				if _, err := os.Stat(convclient.DefaultSocket); err == nil {
					convert = convclient.DefaultSocket
				}
			default:
				if _, err := os.Stat(convert); err != nil {
					fmt.Fprintf(os.Stderr, "mpdetour run: --convert %s: %v; connections are not converted\n", convert, err)
				}
			}
			convert = checkAgent(agent.DefaultSocket, convert)
			err = run.Exec(run.Options{Mechanism: mech, Argv: args, LogPath: logPath, Warn: os.Stderr, Convert: convert})
			var ee *run.ExitError
			if errors.As(err, &ee) {
				fmt.Fprintf(os.Stderr, "mpdetour run: %v\n", ee.Err)
				return &cli.ExitError{Code: ee.Code}
			}
			return err
		},
	}
}

// checkAgent warns once, before the program starts, when no agent answers
// on its status socket (the program's connections are MPTCP but get no
// detours) and when the agent's conversion socket refuses this user; it
// returns the conversion socket to use ("" when refused).
func checkAgent(status, convert string) string {
	c, err := net.DialTimeout("unix", status, time.Second)
	switch {
	case err == nil:
		c.Close()
	case errors.Is(err, os.ErrPermission):
		// Root's socket (mode 0600): someone serves it.
	default:
		fmt.Fprintf(os.Stderr, "mpdetour run: warning: no mpdetour agent answers on %s (%v): connections use MPTCP but get no detours; start it with: systemctl start mpdetour-agent (docs/run.md)\n", status, err)
	}
	if convert == "" {
		return ""
	}
	if _, err := os.Stat(convert); err != nil {
		return "" // said above
	}
	cc := convclient.NewClient(convert, time.Second)
	defer cc.Close()
	if err := cc.Hello(); err != nil {
		fmt.Fprintf(os.Stderr, "mpdetour run: warning: %v; connections are not converted\n", err)
		return ""
	}
	return convert
}
