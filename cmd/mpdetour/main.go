// Command mpdetour lets unmodified TCP applications use several Internet
// paths at once by adding Multipath TCP subflows through detour hosts.
//
// Wiring is explicit: main lists every subcommand, and each subcommand's
// constructor (one file each) builds its daemon from its parts.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab"
)

// commands lists the top-level subcommands in the order --help shows them.
func commands() []*cli.Command {
	return []*cli.Command{
		agentCommand(),
		statusCommand(),
		runCommand(),
		relayCommand(),
		labCommand(),
		benchCommand(),
		collectiveCommand(),
		doctorCommand(),
		pathCheckCommand(),
		versionCommand(),
	}
}

func main() {
	// A re-execution of this binary as a lab helper (namespace exec shim,
	// delay line) runs as that and never returns.
	lab.Reexec()
	// Commands watch ctx so that Ctrl-C and SIGTERM roll back what they set up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, "mpdetour", commands(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
