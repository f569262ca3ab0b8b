// Command mpdetour-lab is mpdetour's evaluation lab: emulated networks in
// network namespaces (up, exec, check, down, list), the benchmarks and
// reports (bench, design, soak, convert-load) and the collective
// simulation (collective simulate). It is a second binary so that the
// product binary, mpdetour, carries none of it (cmd/mpdetour's deps_test.go
// checks that); the lab starts the product daemons (relay, agent, run,
// bench send) from the mpdetour binary beside it, or from --bin.
//
// Wiring is explicit as in cmd/mpdetour: main lists every command.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench"
)

// commands lists the commands in the order --help shows them.
func commands() []*cli.Command {
	return append(labCommands(),
		labBenchCommand(),
		labDesignCommand(),
		labSoakCommand(),
		labConvertLoadCommand(),
		&cli.Command{
			Name:    "collective",
			Summary: "a collective's relays simulated in this process: simulate",
			Sub:     []*cli.Command{collectiveSimulate()},
		},
		// Helpers the lab runs itself, hidden from --help.
		labDelaylineCommand(),
		convertLoadMemberCommand(),
		attackPeerCommand(),
	)
}

func main() {
	// A re-execution of this binary as a lab helper (namespace exec shim,
	// delay line) runs as that and never returns.
	lab.Reexec()
	// Commands watch ctx so that Ctrl-C and SIGTERM roll back what they set up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Program(ctx, &cli.Command{
		Name:    "mpdetour-lab",
		Summary: "mpdetour's evaluation lab: emulated networks in namespaces, benchmarks, soaks, simulations",
		Sub:     commands(),
	}, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	// The lab is down: a lab cgroup that processes kept busy when its
	// agent stopped can go now.
	if err := bench.RemoveLeftCgroup(10 * time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "mpdetour-lab: %v\n", err)
	}
	os.Exit(code)
}
