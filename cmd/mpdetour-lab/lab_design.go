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

// rangeFlag is a Range as a flag value.
type rangeFlag struct{ r *design.Range }

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
		shard                 string
		capR, rttR, lossR, bR design.Range
	)
	def := design.DefaultSpace(2)
	capR, rttR, lossR, bR = def.Capacity, def.RTT, def.Loss, def.Buffer
	return &cli.Command{
		Name:         "design",
		Summary:      "evaluate over a WSP space-filling design of path conditions: Ben per point, report and plots",
		Usage:        "[--points N] [--seed S] [--paths 2|3] [--procedures tcp-path1,tcp-path2,mptcp] [--out DIR] [--resume]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&spec.Points, "points", 40, "number of design points")
			fs.IntVar(&spec.Trials, "trials", 1, "trials per point and procedure (Ben uses the mean single-path goodputs)")
			fs.Uint64Var(&seed, "seed", 1, "seed of the design (same seed, same points)")
			fs.IntVar(&paths, "paths", 2, "paths per point: the default path plus paths-1 NAT detours")
			fs.Var(rangeFlag{&capR}, "capacity", "capacity range per path, Mbit/s (MIN:MAX)")
			fs.Var(rangeFlag{&rttR}, "rtt", "RTT range per path, ms")
			fs.Var(rangeFlag{&lossR}, "loss", "loss range per path and direction, %")
			fs.Var(rangeFlag{&bR}, "buffer", "bottleneck buffer range per path, in BDPs")
			fs.Float64Var(&spec.LowBDP, "low-bdp", design.DefaultLowBDP, "a point is low-BDP when every path's BDP is at most this many bytes")
			fs.StringVar(&spec.Procedures, "procedures", "", "comma-separated: tcp-path1..tcp-pathN, mptcp (agent default policy), mptcp-static, mptcp-adaptive, converted (server without MPTCP, via the converter on r2) (default: every tcp-pathK and mptcp)")
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
			spec.Space = design.Space{Paths: paths, Capacity: capR, RTT: rttR, Loss: lossR, Buffer: bR}
			d, err := design.New(spec)
			if err != nil {
				return cli.Usagef("%v", err)
			}
			if dry {
				d.Describe(os.Stdout)
				return nil
			}
			for _, p := range d.Procedures {
				if pol, ok := strings.CutPrefix(p, design.MPTCPProcedure+"-"); ok {
					if err := design.AgentHasPolicy(pol); err != nil {
						return cli.Usagef("%v", err)
					}
				}
			}
			if bin, err = productBinary(bin); err != nil {
				return err
			}
			o := design.Options{Out: out, Resume: resume, LabName: name, Binary: bin, Progress: os.Stdout, Note: note}
			if shard != "" {
				if _, err := fmt.Sscanf(shard, "%d/%d", &o.Shard, &o.Shards); err != nil || o.Shards < 1 || o.Shard < 1 || o.Shard > o.Shards {
					return cli.Usagef("--shard %q: want K/N with 1 <= K <= N", shard)
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
