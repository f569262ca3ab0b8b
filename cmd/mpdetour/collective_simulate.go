package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/roster"
)

func collectiveSimulate() *cli.Command {
	var cfg roster.SimConfig
	var asJSON bool
	var gcPercent int
	return &cli.Command{
		Name: "simulate",
		Summary: "run N relays of a collective in this process over memberlist (in-process network) and measure " +
			"roster convergence, gossip bandwidth per relay and how fast killed relays leave the roster (docs/results/roster)",
		Usage: "[--relays N] [--kill K] [--join-rate R] [--window D] [--json]",
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&cfg.Relays, "relays", 1000, "relays to simulate")
			fs.IntVar(&cfg.Kill, "kill", 10, "relays killed (no leave message) after convergence; 0: none")
			fs.Float64Var(&cfg.JoinRate, "join-rate", 50, "relays started per second (0: all at once, the worst case for gossip queues)")
			fs.IntVar(&gcPercent, "gogc", 400, "GOGC for the simulation (N relays' state in one heap; memory is cheaper than GC CPU on 2 cores)")
			fs.DurationVar(&cfg.Window, "window", 20*time.Second, "steady-state bandwidth measurement window")
			fs.DurationVar(&cfg.Settle, "settle", 15*time.Second, "wait after convergence before the steady-state window (gossip queues drain)")
			fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "give up a phase after this long")
			fs.DurationVar(&cfg.ProbeInterval, "probe-interval", roster.DefaultProbeInterval, "memberlist probe interval (as relays use by default)")
			fs.DurationVar(&cfg.ProbeTimeout, "probe-timeout", roster.DefaultProbeTimeout, "memberlist probe timeout")
			fs.IntVar(&cfg.SuspicionMult, "suspicion-mult", roster.DefaultSuspicionMult, "memberlist suspicion multiplier")
			fs.BoolVar(&cfg.VerifyEach, "verify-each", false, "every relay verifies every entry itself (default: once per distinct entry, shared: the CPU of N relays is one process here)")
			fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("collective simulate takes no arguments")
			}
			if !asJSON {
				cfg.Progress = os.Stderr
			}
			debug.SetGCPercent(gcPercent)
			fmt.Fprintf(os.Stderr, "simulating %d relays on %d CPUs (GOMAXPROCS %d)\n", cfg.Relays, runtime.NumCPU(), runtime.GOMAXPROCS(0))
			res, err := roster.Simulate(ctx, cfg)
			if res != nil && asJSON {
				if jerr := printJSON(res); jerr != nil {
					return jerr
				}
			} else if res != nil {
				fmt.Printf("relays:                 %d\n", res.Relays)
				fmt.Printf("start (all joined):     %v\n", res.StartTime.Round(time.Millisecond))
				fmt.Printf("roster convergence:     %v after the last start\n", res.Convergence.Round(time.Millisecond))
				fmt.Printf("join cost per relay:    %.1f KiB sent until convergence\n", res.BytesPerRelay/1024)
				fmt.Printf("steady state per relay: %.0f B/s, %.1f datagrams/s sent (gossip, probes, state syncs)\n", res.SteadyBps, res.SteadyPps)
				if res.CRLSpread > 0 {
					fmt.Printf("revocation list:        given to one relay, applied by every relay after %v\n", res.CRLSpread.Round(time.Millisecond))
				}
				if res.Killed > 0 {
					fmt.Printf("killed relays:          %d: out of the first roster after %v, out of every roster after %v\n",
						res.Killed, res.KillDetectFirst.Round(time.Millisecond), res.KillDetection.Round(time.Millisecond))
					fmt.Printf("live relays missing:    %d rosters incomplete after the kill (false removals)\n", res.FalseRemovals)
				}
				fmt.Printf("datagrams dropped:      %d (full queues)\n", res.Dropped)
				fmt.Printf("verifications:          %d\n", res.Verified)
			}
			return err
		},
	}
}
