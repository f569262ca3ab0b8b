// Command mpdetour lets unmodified TCP applications use several Internet
// paths at once by adding Multipath TCP subflows through detour hosts.
//
// Wiring is explicit: main lists every subcommand, and each subcommand's
// constructor (one file each) builds its daemon from its parts.
//
// This binary holds the product only. The evaluation lab (emulated
// networks, benchmarks, soaks, simulations, attack suite) is the second
// binary, cmd/mpdetour-lab, which starts this one in its lab nodes;
// deps_test.go keeps the lab's packages out of this binary.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// commands lists the top-level subcommands in the order --help shows them.
func commands() []*cli.Command {
	return []*cli.Command{
		agentCommand(),
		statusCommand(),
		runCommand(),
		relayCommand(),
		benchCommand(),
		collectiveCommand(),
		doctorCommand(),
		pathCheckCommand(),
		versionCommand(),
		movedToLab("lab", "mpdetour lab", "mpdetour-lab"),
	}
}

func main() {
	// Commands watch ctx so that Ctrl-C and SIGTERM roll back what they set up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, "mpdetour", commands(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
