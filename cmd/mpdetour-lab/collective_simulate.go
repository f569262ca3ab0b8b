package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/rostersim"
	"github.com/mpdetour/mpdetour/internal/roster"
)

func collectiveSimulate() *cli.Command {
	var cfg rostersim.SimConfig
	var asJSON bool
	var out, name string
	var gcPercent int
	var memLimit int64
	var cpuProfile, memProfile string
	return &cli.Command{
		Name: "simulate",
		Summary: "run N relays of a collective in this process over memberlist (in-process network) and measure " +
			"roster convergence, gossip bandwidth per relay and how fast killed relays leave the roster (docs/results/roster)",
		Usage: "[--relays N] [--kill K] [--join-rate R] [--window D] [--time-scale K] [tuning flags] [--out DIR --name NAME] [--json]",
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&cfg.Relays, "relays", 1000, "relays to simulate")
			fs.IntVar(&cfg.Kill, "kill", 10, "relays killed (no leave message) after convergence; 0: none")
			fs.Float64Var(&cfg.JoinRate, "join-rate", 50, "relays started per simulated second (0: all at once, the worst case for gossip queues)")
			fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "time dilation K: every gossip interval and timeout, the join period, --settle and --window run K times slower; "+
				"durations are reported as measured and divided by K, rates as measured and multiplied by K (docs/results/roster)")
			fs.IntVar(&gcPercent, "gogc", 400, "GOGC for the simulation (N relays' state in one heap; memory is cheaper than GC CPU on 2 cores)")
			fs.Int64Var(&memLimit, "memlimit", 8<<30, "soft memory limit in bytes (the Go runtime's; GC runs more often near it: 1,000 relays hold ~2.5 GB live, GOGC 400 alone would let the heap grow to 5 times that)")
			fs.DurationVar(&cfg.Window, "window", 20*time.Second, "steady-state bandwidth measurement window (simulated time)")
			fs.DurationVar(&cfg.Settle, "settle", 15*time.Second, "wait after convergence before the steady-state window, simulated time (gossip queues drain)")
			fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "give up a phase after this long (wall clock)")
			fs.DurationVar(&cfg.ProbeInterval, "probe-interval", roster.DefaultProbeInterval, "memberlist probe interval (as relays use by default)")
			fs.DurationVar(&cfg.ProbeTimeout, "probe-timeout", roster.DefaultProbeTimeout, "memberlist probe timeout")
			fs.IntVar(&cfg.SuspicionMult, "suspicion-mult", roster.DefaultSuspicionMult, "memberlist suspicion multiplier")
			fs.IntVar(&cfg.SuspicionMaxTimeoutMult, "suspicion-max-mult", 0, "Lifeguard's cap on a suspicion's start, x the suspicion timeout (0: the relays' default)")
			fs.IntVar(&cfg.GossipNodes, "gossip-nodes", 0, "gossip fan-out: relays each gossip round goes to (0: the relays' default)")
			fs.DurationVar(&cfg.GossipInterval, "gossip-interval", 0, "gossip round interval, simulated time (0: the relays' default)")
			fs.DurationVar(&cfg.PushPullInterval, "push-pull-interval", 0, "state sync interval before memberlist's log2(N/32) scaling, simulated time (0: the relays' default)")
			fs.IntVar(&cfg.RetransmitMult, "retransmit-mult", 0, "retransmissions of a new message per relay, x ceil(log10(N+1)) (0: the relays' default)")
			fs.StringVar(&out, "out", "", "directory for the machine-readable summary sim-<N>-<name>.json (simulated time; docs/results/roster)")
			fs.StringVar(&name, "name", "run", "name of the run in the summary's file name")
			fs.BoolVar(&cfg.VerifyEach, "verify-each", false, "every relay verifies every entry itself (default: once per distinct entry, shared: the CPU of N relays is one process here)")
			fs.BoolVar(&asJSON, "json", false, "print the result as JSON")
			fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
			fs.StringVar(&memProfile, "memprofile", "", "write a heap profile to this file when the run ends (go tool pprof)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("collective simulate takes no arguments")
			}
			if !asJSON {
				cfg.Progress = os.Stderr
			}
			debug.SetGCPercent(gcPercent)
			if memLimit > 0 {
				debug.SetMemoryLimit(memLimit)
			}
			fmt.Fprintf(os.Stderr, "simulating %d relays on %d CPUs (GOMAXPROCS %d), time scale %g\n", cfg.Relays, runtime.NumCPU(), runtime.GOMAXPROCS(0), cfg.TimeScale)
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if memProfile != "" {
				// The heap of N relays exists while they run: rewritten
				// every 20 s, the file holds the last snapshot before the end.
				stop := make(chan struct{})
				defer close(stop)
				go func() {
					t := time.NewTicker(20 * time.Second)
					defer t.Stop()
					for {
						select {
						case <-stop:
							return
						case <-t.C:
						}
						if err := writeHeapProfile(memProfile); err != nil {
							fmt.Fprintf(os.Stderr, "heap profile: %v\n", err)
						}
					}
				}()
			}
			res, err := rostersim.Simulate(ctx, cfg)
			if res != nil && out != "" {
				p := fmt.Sprintf("%s/sim-%d-%s.json", out, cfg.Relays, name)
				if werr := res.Summary(name, cfg, err).WriteFile(p); werr != nil {
					return werr
				}
				fmt.Fprintf(os.Stderr, "summary: %s\n", p)
			}
			if res != nil && asJSON {
				if jerr := cli.PrintJSON(res); jerr != nil {
					return jerr
				}
			} else if res != nil {
				printSimResult(res)
			}
			return err
		},
	}
}

// writeHeapProfile writes the heap profile (in use and allocated) to path,
// through a temporary file so that the previous snapshot stays whole.
func writeHeapProfile(path string) error {
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	runtime.GC() // up-to-date in-use figures
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// printSimResult prints what the simulation measured; with time dilation
// each duration as measured and divided by the scale (simulated), each
// rate per wall-clock second and per simulated second.
func printSimResult(res *rostersim.SimResult) {
	k := res.TimeScale
	dur := func(d time.Duration) string {
		if k <= 1 {
			return d.Round(time.Millisecond).String()
		}
		return fmt.Sprintf("%v (measured %v / time scale %g)", res.Sim(d).Round(time.Millisecond), d.Round(time.Millisecond), k)
	}
	fmt.Printf("relays:                 %d\n", res.Relays)
	if k > 1 {
		fmt.Printf("time scale:             %g (durations below: simulated = measured / %g; rates: simulated = measured x %g)\n", k, k, k)
	}
	fmt.Printf("start (all joined):     %s\n", dur(res.StartTime))
	if res.Convergence > 0 {
		fmt.Printf("roster convergence:     %s after the last start\n", dur(res.Convergence))
	} else {
		fmt.Printf("roster convergence:     not reached: %d rosters incomplete, %.3f %% of the entries known\n", res.Incomplete, 100*res.Known)
	}
	for _, m := range []struct {
		q  int
		at time.Duration
	}{{50, res.Complete50}, {90, res.Complete90}, {99, res.Complete99}} {
		if m.at > 0 {
			fmt.Printf("%2d %% of rosters:        complete %s after the last start\n", m.q, dur(m.at))
		}
	}
	fmt.Printf("join cost per relay:    %.1f KiB sent until convergence\n", res.BytesPerRelay/1024)
	if k > 1 {
		fmt.Printf("steady state per relay: %.0f B/s, %.1f datagrams/s sent per simulated second (measured %.0f B/s, %.1f datagrams/s per wall-clock second)\n",
			res.SimRate(res.SteadyBps), res.SimRate(res.SteadyPps), res.SteadyBps, res.SteadyPps)
	} else {
		fmt.Printf("steady state per relay: %.0f B/s, %.1f datagrams/s sent (gossip, probes, state syncs)\n", res.SteadyBps, res.SteadyPps)
	}
	if res.CRLSpread > 0 {
		fmt.Printf("revocation list:        given to one relay, applied by every relay after %s\n", dur(res.CRLSpread))
	}
	if res.Killed > 0 && res.KillDetection > 0 {
		fmt.Printf("killed relays:          %d: out of the first roster after %s, out of every roster after %s\n",
			res.Killed, dur(res.KillDetectFirst), dur(res.KillDetection))
		fmt.Printf("live relays missing:    %d rosters incomplete after the kill (false removals)\n", res.FalseRemovals)
	}
	if res.JoinOneAll > 0 || res.JoinOne999 > 0 {
		fmt.Printf("one relay joined:       in 99.9 %% of the rosters after %s, in all after %s (0: not within the timeout)\n", dur(res.JoinOne999), dur(res.JoinOneAll))
	}
	fmt.Printf("live heap per relay:    %.0f KiB (after a GC in steady state, the simulated network included)\n", res.HeapPerRelay/1024)
	fmt.Printf("datagrams dropped:      %d (full queues)\n", res.Dropped)
	fmt.Printf("verifications:          %d\n", res.Verified)
}
