package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/attack/breaks"
	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// labSoakCommand is `mpdetour-lab soak`: churn against real relays and an
// agent in a lab of its own, checking that nothing leaks.
func labSoakCommand() *cli.Command {
	var (
		o         bench.SoakOptions
		out, name string
		bin       string
		attacks   string
	)
	return &cli.Command{
		Name:         "soak",
		Summary:      "churn for a while (echoed and checked connections, relay restarts, faults on a detour and the default path) and check nothing leaks or is lost",
		Usage:        "[--duration 5m] [--out DIR] [--restart-every D] [--flap-every D] [--flap-for D] [--conns N] [--long N] [--policy P] [--subflow-lowat BYTES] [--attacks CASES] [--attack-every D]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.DurationVar(&o.Duration, "duration", 5*time.Minute, "how long the churn lasts (the issue's soak: 1h)")
			fs.DurationVar(&o.RestartEvery, "restart-every", 0, "restart a relay (alternating; every third with SIGKILL) this often (default duration/12)")
			fs.DurationVar(&o.FlapEvery, "flap-every", 30*time.Second, "black-hole detour1's core link this often, and half a period later the default path")
			fs.DurationVar(&o.FlapFor, "flap-for", 5*time.Second, "... for this long (less than half of --flap-every)")
			fs.Float64Var(&o.ConnsPerSecond, "conns", 5, "short MPTCP connections opened (and closed) per second")
			fs.IntVar(&o.ConnBytes, "conn-bytes", 32<<10, "bytes each short connection sends")
			fs.IntVar(&o.Long, "long", 2, "long-lived connections sending ~2 Mbit/s each (0: none)")
			fs.DurationVar(&o.Sample, "sample", 10*time.Second, "sampling period")
			fs.StringVar(&out, "out", "", "write report.md and samples.json here")
			fs.StringVar(&o.Policy, "policy", "", "the agent's policy: static, adaptive, backup-first or guard (default: the agent's default)")
			fs.IntVar(&o.SubflowLowat, "subflow-lowat", agentd.DefaultSubflowLowat, fmt.Sprintf("the agent's subflow_lowat in bytes: each subflow's TCP_NOTSENT_LOWAT through its BPF program, attached to this runner's lab cgroup (docs/agent.md \"Per-subflow unsent limit\"); default %d, the agent's default; 0: off (the agent's default before the limit was turned on), else %d-%d", agentd.DefaultSubflowLowat, agentd.MinSubflowLowat, math.MaxInt32))
			fs.StringVar(&name, "name", "soak", "lab name (namespaces <name>-<node>)")
			fs.StringVar(&bin, "bin", "", binFlagUsage)
			fs.StringVar(&attacks, "attacks", "", "comma-separated attack-suite cases run in turn against the soak's own relays and agent while its traffic runs, each judged by the suite's criterion ("+strings.Join(breaks.InPlaceCases(), ", ")+", or all; docs/bench.md); none by default")
			fs.DurationVar(&o.AttackEvery, "attack-every", 30*time.Second, "start the next attack case this often (none later than 60s before the end; attacks wait for relay restarts and link faults and delay them)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("lab soak: unexpected argument %q", args[0])
			}
			if o.Duration < 30*time.Second {
				return cli.Usagef("lab soak: --duration %s is too short to compare start and end (at least 30s)", o.Duration)
			}
			var err error
			if o.Attacks, err = parseSoakAttacks(attacks, o.AttackEvery, o.Duration); err != nil {
				return err
			}
			if o.Policy != "" {
				if _, err := policy.ParseMode(o.Policy); err != nil {
					return cli.Usagef("lab soak: --policy: %v", err)
				}
			}
			if n := o.SubflowLowat; n != 0 && (n < agentd.MinSubflowLowat || n > math.MaxInt32) {
				return cli.Usagef("lab soak: --subflow-lowat %d is not 0 (off) or %d-%d bytes", n, agentd.MinSubflowLowat, math.MaxInt32)
			}
			exe, err := productBinary(bin)
			if err != nil {
				return err
			}
			o.Binary = exe
			if len(o.Attacks) > 0 {
				if o.Self, err = os.Executable(); err != nil {
					return err
				}
				o.PeerCommand = "attack-peer"
			}
			dir, err := os.MkdirTemp("", "mpdetour-soak-")
			if err != nil {
				return err
			}
			keep := false
			defer func() {
				if keep {
					fmt.Printf("daemon logs and configs kept in %s\n", dir)
				} else {
					os.RemoveAll(dir)
				}
			}()
			o.Dir = dir
			topo, err := topology.Builtin("detours")
			if err != nil {
				return err
			}
			if err := topo.Set("all.delay", "0"); err != nil {
				return err
			}
			l, err := lab.Up(ctx, topo, name)
			if err != nil {
				return err
			}
			defer func() {
				if err := l.Down(); err != nil {
					fmt.Fprintf(os.Stderr, "lab soak: taking the lab down: %v\n", err)
				}
			}()
			o.Lab, o.Progress = l, os.Stdout
			rep, err := bench.Soak(ctx, o)
			if err != nil {
				return fmt.Errorf("lab soak: %w", err)
			}
			if out != "" {
				if err := bench.WriteSoakReport(out, rep); err != nil {
					return err
				}
			}
			for _, c := range rep.Checks {
				res := "ok  "
				if !c.OK {
					res = "FAIL"
				}
				fmt.Printf("%s %s: %s\n", res, c.Name, c.Detail)
			}
			if err := bench.SoakError(rep); err != nil {
				keep = true
				return errors.New("lab soak: " + err.Error())
			}
			return nil
		},
	}
}

// parseSoakAttacks parses --attacks; the soak must be long enough for every
// case to run once (one per --attack-every, none later than
// bench.AttackLongest, the longest a case may take, before the end).
func parseSoakAttacks(list string, every, duration time.Duration) ([]string, error) {
	cases, err := breaks.ParseInPlace(list)
	if err != nil {
		return nil, cli.Usagef("lab soak: --attacks: %v", err)
	}
	if len(cases) == 0 {
		return nil, nil
	}
	if every < 5*time.Second {
		return nil, cli.Usagef("lab soak: --attack-every %s is too short (at least 5s)", every)
	}
	if min := time.Duration(len(cases))*every + bench.AttackLongest; duration < min {
		return nil, cli.Usagef("lab soak: --duration %s is too short for --attacks (every case once: at least %d x --attack-every + %s = %s)", duration, len(cases), bench.AttackLongest, min)
	}
	return cases, nil
}
