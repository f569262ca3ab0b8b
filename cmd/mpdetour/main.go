// Command mpdetour lets unmodified TCP applications use several Internet
// paths at once by adding Multipath TCP subflows through detour hosts.
//
// Each subcommand lives in its own file and registers itself with
// internal/cli from init.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mpdetour/mpdetour/internal/cli"
)

func main() {
	// Commands watch ctx so that Ctrl-C and SIGTERM roll back what they set up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, "mpdetour", os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
