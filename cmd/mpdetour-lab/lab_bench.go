package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/attack/breaks"
	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/bench/report"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// labBenchCommand is `mpdetour-lab bench`.
func labBenchCommand() *cli.Command {
	var (
		trials     int
		out, name  string
		bin, note  string
		resume     bool
		reportOnly bool
		duration   time.Duration
		procs      string
		interleave bool
		cases      string
		builds     string
	)
	return &cli.Command{
		Name:         "bench",
		Summary:      "run a benchmark scenario in the lab: goodput per procedure, report and plots",
		Usage:        "SCENARIO [--trials N] [--out DIR] [--resume] | attacks --cases LIST [--builds LABEL=PATH,...]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&trials, "trials", 0, "trials per cell (default: the scenario's)")
			fs.StringVar(&out, "out", "", "result directory (default bench-results/SCENARIO)")
			fs.BoolVar(&resume, "resume", false, "continue the run in --out, skipping finished cells and trials")
			fs.DurationVar(&duration, "duration", 0, "transfer duration per trial (default: the scenario's)")
			fs.StringVar(&name, "name", "bench", "lab name (namespaces are NAME-NODE)")
			fs.StringVar(&bin, "bin", "", binFlagUsage)
			fs.StringVar(&note, "note", "", "note printed at the top of the report")
			fs.BoolVar(&reportOnly, "report", false, "only regenerate JSON, CSV, report and plots from --out")
			fs.BoolVar(&interleave, "interleave", false, "run trials in rounds (trial 1 of every cell, then trial 2, ...): a run stopped early stays balanced")
			fs.StringVar(&cases, "cases", "", "attacks only: run the suite's product cases instead of the scenario (spoofed-junk, forged-gossip, convert-socket, rotation-quota, revoked-conversion, subflow-churn, subflow-churn-mixed; \"all\"): each starts the product binary in a lab of its own, attacks it and passes or fails against the issue's target")
			fs.StringVar(&builds, "builds", "", "with --cases: product binaries to attack, LABEL=PATH,... (e.g. before=/tmp/old/mpdetour,after=./mpdetour), interleaved; the last is the one under test (default: --bin)")
			fs.StringVar(&procs, "procedures", "", "comma-separated procedures replacing the scenario's, e.g. tcp,tcp-tunnel,tcp-openvpn")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("want one SCENARIO (a file or one of: %s)", strings.Join(scenario.Builtins(), ", "))
			}
			if trials < 0 {
				return cli.Usagef("--trials must be >= 1")
			}
			if duration < 0 {
				return cli.Usagef("--duration must be positive")
			}
			if cases != "" || builds != "" {
				if args[0] != "attacks" || cases == "" {
					return cli.Usagef("--cases and --builds go with the attacks scenario: bench attacks --cases LIST")
				}
				if trials == 0 {
					trials = 1
				}
				list := strings.Split(cases, ",")
				if cases == "all" {
					list = breaks.Cases()
				}
				var bs []attackBuild
				if builds != "" {
					var err error
					if bs, err = parseBuilds(builds); err != nil {
						return cli.Usagef("%v", err)
					}
				} else {
					p, err := productBinary(bin)
					if err != nil {
						return err
					}
					bs = []attackBuild{{"this", p}}
				}
				if out == "" {
					out = filepath.Join("bench-results", "attack-cases")
				}
				if name == "bench" {
					name = "atkc" // not the scenario benchmarks' labs
				}
				return runAttackCases(ctx, list, bs, trials, out, name, os.Stdout)
			}
			s, err := scenario.Load(args[0])
			if err != nil {
				return err
			}
			if procs != "" {
				if err := s.SetProcedures(strings.Split(procs, ",")); err != nil {
					return cli.Usagef("%v", err)
				}
			}
			if out == "" {
				out = filepath.Join("bench-results", s.Name)
			}
			if reportOnly {
				recs, err := results.Load(filepath.Join(out, results.TrialsFile))
				if err != nil {
					return err
				}
				d, err := bench.Write(out, s, recs, note)
				if err != nil {
					return err
				}
				printBenchSummary(d)
				return nil
			}
			var names []string
			for _, c := range s.Cells() {
				names = append(names, c.Procedure)
			}
			for _, m := range scenario.EqualArms(names) {
				fmt.Fprintln(os.Stderr, "note: "+m)
			}
			binGiven := bin != ""
			if bin, err = productBinary(bin); err != nil {
				return err
			}
			d, err := bench.Run(ctx, bench.Options{
				Scenario: s, Out: out, Trials: trials, Duration: duration, Resume: resume,
				LabName: name, Binary: bin, Progress: os.Stdout, Note: note, Interleave: interleave,
			})
			if d != nil {
				fmt.Printf("results: %s (report.md, results.json, results.csv, plots)\n", out)
				printBenchSummary(d)
			}
			if errors.Is(err, context.Canceled) {
				again := fmt.Sprintf("mpdetour-lab bench %s --out %s --resume", args[0], out)
				if name != "bench" {
					again += " --name " + name
				}
				if procs != "" {
					again += " --procedures " + procs
				}
				if trials > 0 {
					again += fmt.Sprintf(" --trials %d", trials)
				}
				if duration > 0 {
					again += " --duration " + duration.String()
				}
				if interleave {
					again += " --interleave"
				}
				if binGiven {
					again += " --bin " + bin
				}
				return fmt.Errorf("interrupted; the lab is down; continue with: %s", again)
			}
			return err
		},
	}
}

func printBenchSummary(d *report.Data) {
	fmt.Print(d.Table())
	for _, g := range d.Gains() {
		fmt.Println(g)
	}
}
