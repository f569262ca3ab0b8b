package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/design"
)

// rangeFlag is a Range as a flag value; set records that it was given.
type rangeFlag struct {
	r    *design.Range
	set  map[string]bool
	name string
}

func (f rangeFlag) String() string {
	if f.r == nil {
		return ""
	}
	return f.r.String()
}

func (f rangeFlag) Set(s string) error {
	r, err := design.ParseRange(s)
	if err != nil {
		return err
	}
	*f.r = r
	f.set[f.name] = true
	return nil
}

// labDesignCommand is `mpdetour-lab design`.
func labDesignCommand() *cli.Command {
	var (
		spec                  design.Spec
		paths                 int
		seed                  uint64
		out, name, bin, note  string
		resume, report, dry   bool
		sequential            bool
		shard, spaceName      string
		only                  string
		limit                 int
		budget                time.Duration
		capR, rttR, lossR, bR design.Range
	)
	set := map[string]bool{}
	return &cli.Command{
		Name:         "design",
		Summary:      "evaluate over a WSP space-filling design of path conditions: Ben per point, report and plots",
		Usage:        "[--points N] [--seed S] [--paths 2|3] [--space default|realworld] [--trials 3] [--procedures tcp-path1,tcp-path2,mptcp-1sf,mptcp] [--out DIR] [--resume] [--budget 16m]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&spec.Points, "points", 40, "number of design points")
			fs.IntVar(&spec.Trials, "trials", 3, "trials per point and procedure, interleaved in rounds on one lab build per point (Ben and its bootstrap interval use the means)")
			fs.Uint64Var(&seed, "seed", 1, "seed of the design (same seed, same points)")
			fs.IntVar(&paths, "paths", 2, "paths per point: the default path plus paths-1 NAT detours")
			fs.StringVar(&spaceName, "space", "default", "named space the ranges start from: default (capacity 1:100, RTT 10:400, loss 0:2, buffer 0.1:2, all uniform) or realworld (capacity 2:100:log, RTT 10:300:log, loss 0.001:2:log, buffer 0.1:2; docs/design.md); --capacity etc. override one dimension")
			fs.Var(rangeFlag{&capR, set, "capacity"}, "capacity", "capacity range per path, Mbit/s (MIN:MAX, or MIN:MAX:log for log-uniform)")
			fs.Var(rangeFlag{&rttR, set, "rtt"}, "rtt", "RTT range per path, ms (MIN:MAX[:log])")
			fs.Var(rangeFlag{&lossR, set, "loss"}, "loss", "loss range per path and direction, % (MIN:MAX[:log])")
			fs.Var(rangeFlag{&bR, set, "buffer"}, "buffer", "bottleneck buffer range per path, in BDPs (MIN:MAX[:log])")
			fs.Float64Var(&spec.LowBDP, "low-bdp", design.DefaultLowBDP, "a point is low-BDP when every path's BDP is at most this many bytes")
			fs.StringVar(&spec.Procedures, "procedures", "", "comma-separated: tcp-path1..tcp-pathN (plain TCP per path), mptcp-1sf (MPTCP over the modelled best path alone, no agent; mptcp-1sf-pathK over path K), mptcp (the agent's default policy), mptcp-POLICY (any policy the agent accepts: mptcp-static, mptcp-adaptive, ...), mptcp[-POLICY]+MECH[+MECH] (the same with agent mechanisms on: +buffers = buffer_sizing: true (the agent's default), +nobuffers = buffer_sizing: false, +staleN = stale_loss_cnt: N (1-255, kernel default 4), +ALGO = subflow_congestion: {detour: ALGO} (detour subflows run ALGO, e.g. +bbr; one the kernel offers), +starveN = guard: {starve: N/100} and +starveoff = guard: {starve: 1} (mptcp-guard only: the shed rule with another starvation threshold, or without it), +shareN = guard: {share: N/100} (mptcp-guard only: another share below which a slower subflow is shed; combines with +starve..., e.g. mptcp-guard+share15+starveoff), +rttoff = guard: {rtt: 0} (mptcp-guard only: the shed rule without its RTT condition), +outageoff = guard: {outage: 0} (mptcp-guard only: the shed rule judging subflows in an outage too), +lowat = subflow_lowat: 131072 (every subflow keeps at most 128 KiB unsent: the agent's default, written out, so mptcp-static has it too; +lowatN: N KiB), +lowatrtt = the same with subflow_lowat_scale: rtt (scaled to the subflows' RTTs, 128 KiB the floor), +nolowat = subflow_lowat: 0 (the agent without it, its default before the limit was turned on: mptcp-static+nolowat beside mptcp-static measures the limit), +pace = subflow_pacing: true (every subflow paces itself at TCP's own rate), +probeN = probe_interval: N ms (10-10000; +lowatrtt also sets 100ms where static's default is 1s); e.g. mptcp-static+buffers beside mptcp-static), converted (server without MPTCP, via the converter on r2; its own run) (default: every tcp-pathK and mptcp)")
			fs.DurationVar(&spec.Duration, "duration", 10*time.Second, "transfer duration")
			fs.DurationVar(&spec.Warmup, "warmup", time.Second, "goodput counts from here")
			fs.StringVar(&spec.CC, "cc", "cubic", "congestion control")
			fs.StringVar(&out, "out", "", "result directory (default bench-results/design)")
			fs.BoolVar(&resume, "resume", false, "continue the design in --out")
			fs.BoolVar(&report, "report", false, "only regenerate results and report from --out")
			fs.BoolVar(&dry, "dry-run", false, "print the design's points and lab parameters, run nothing")
			fs.StringVar(&name, "name", "design", "lab name (namespaces are NAME-NODE)")
			fs.StringVar(&bin, "bin", "", binFlagUsage)
			fs.StringVar(&note, "note", "", "note printed at the top of the report")
			fs.StringVar(&shard, "shard", "", "K/N: run only every N-th point starting at the K-th (runs/NAME.shardK), so N processes with different --name can share a design")
			fs.StringVar(&only, "only", "", "comma-separated point IDs (p010,p025,...): run only these points of the design (paired runner)")
			fs.IntVar(&limit, "limit", 0, "stop after this many points (0: no limit); --resume continues")
			fs.DurationVar(&budget, "budget", 0, "start no new point after this much wall clock (e.g. 16m, for measurement chunks; 0: no limit); --resume continues")
			fs.StringVar(&spec.Order, "order", "", "order of the procedures within a point's rounds (paired runner): balanced (a Williams square, shuffled from --seed and the point: no procedure always follows the same one) or rotate (the list rotated per round, as runs before the A/A check of docs/results/design/aa); default: what the run in --out recorded, else balanced")
			fs.BoolVar(&sequential, "sequential", false, "the old layout: one bench run per policy, each rebuilding every point's lab (to extend designs made before the paired runner)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("design takes no arguments, got %q", args[0])
			}
			if out == "" {
				out = "bench-results/design"
			}
			if report {
				d, err := design.Load(out)
				if err != nil {
					return err
				}
				rep, err := design.WriteReport(out, d, note)
				if err != nil {
					return err
				}
				fmt.Printf("results: %s (report.md, results.json, results.csv, plots)\n", out)
				rep.Summary(os.Stdout)
				return nil
			}
			spec.Seed = seed
			mk, ok := design.Spaces[spaceName]
			if !ok {
				return cli.Usagef("--space %q: want default or realworld", spaceName)
			}
			sp := mk(paths)
			if set["capacity"] {
				sp.Capacity = capR
			}
			if set["rtt"] {
				sp.RTT = rttR
			}
			if set["loss"] {
				sp.Loss = lossR
			}
			if set["buffer"] {
				sp.Buffer = bR
			}
			spec.Space = sp
			spec.Sequential = sequential
			if sequential && spec.Order != "" {
				return cli.Usagef("--order orders the procedures within a point's rounds of the paired runner; --sequential runs one bench per policy, which has no such order")
			}
			d, err := design.New(spec)
			if err != nil {
				return cli.Usagef("%v", err)
			}
			if dry {
				d.Describe(os.Stdout)
				return nil
			}
			if limit < 0 || budget < 0 {
				return cli.Usagef("--limit and --budget must not be negative")
			}
			if bin, err = productBinary(bin); err != nil {
				return err
			}
			o := design.Options{Out: out, Resume: resume, LabName: name, Binary: bin, Progress: os.Stdout, Note: note, Limit: limit, Budget: budget}
			if shard != "" {
				if _, err := fmt.Sscanf(shard, "%d/%d", &o.Shard, &o.Shards); err != nil || o.Shards < 1 || o.Shard < 1 || o.Shard > o.Shards {
					return cli.Usagef("--shard %q: want K/N with 1 <= K <= N", shard)
				}
			}
			if only != "" {
				o.Only = map[string]bool{}
				ids := map[string]bool{}
				for _, pt := range d.Points {
					ids[pt.ID] = true
				}
				for _, id := range strings.Split(only, ",") {
					if id = strings.TrimSpace(id); !ids[id] {
						return cli.Usagef("--only: %q is not a point of this design (p001..p%03d)", id, len(d.Points))
					}
					o.Only[id] = true
				}
			}
			rep, err := design.Run(ctx, d, o)
			if rep != nil {
				fmt.Printf("results: %s (report.md, results.json, results.csv, plots)\n", out)
				rep.Summary(os.Stdout)
			}
			if errors.Is(err, context.Canceled) {
				return fmt.Errorf("interrupted; the lab is down; continue with the same flags and --resume")
			}
			return err
		},
	}
}
