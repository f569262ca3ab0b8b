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

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/attack/breaks"
	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/bench/report"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/policy"
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
		agentFile  string
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
			fs.StringVar(&agentFile, "agent-config", "", "POLICY=FILE: YAML appended to the agent configuration of the procedures of that policy (e.g. guard=g15r.yaml with a guard: block, to measure the guard policy with other parameters beside the others); it may not set what the bench writes itself (socket, subflows, log_level, policy, probe_interval, selectors, detours, subflow_lowat); each of their trials records it in its params (agent_config=...)")
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
			polCfg, err := benchAgentConfig(agentFile, names)
			if err != nil {
				return err
			}
			d, err := bench.Run(ctx, bench.Options{
				Scenario: s, Out: out, Trials: trials, Duration: duration, Resume: resume,
				LabName: name, Binary: bin, Progress: os.Stdout, Note: note, Interleave: interleave,
				PolicyConfig: polCfg,
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
				if agentFile != "" {
					again += " --agent-config " + agentFile
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

// benchAgentConfig reads --agent-config POLICY=FILE ("" = none) into
// bench.Options.PolicyConfig and checks, before any lab is built, that
// this build's agent accepts the file beside what the bench writes itself
// for POLICY (a key the bench writes is "given twice": an error naming the
// line), and that some procedure of procs has that policy.
func benchAgentConfig(spec string, procs []string) (map[string]string, error) {
	if spec == "" {
		return nil, nil
	}
	pol, path, ok := strings.Cut(spec, "=")
	if !ok || pol == "" || path == "" {
		return nil, cli.Usagef("--agent-config %q: want POLICY=FILE, e.g. guard=g15r.yaml", spec)
	}
	if _, err := policy.ParseMode(pol); err != nil {
		return nil, cli.Usagef("--agent-config %q: %v", spec, err)
	}
	var with []string
	for _, p := range procs {
		if scenario.Policy(p) == pol {
			with = append(with, p)
		}
	}
	if len(with) == 0 {
		return nil, cli.Usagef("--agent-config %q: no procedure of this run has policy %s (procedures: %s)", spec, pol, strings.Join(procs, ", "))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, cli.Usagef("--agent-config: %v", err)
	}
	text := string(b)
	if strings.TrimSpace(text) == "" {
		return nil, cli.Usagef("--agent-config %s is empty", path)
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	// The file first, so that its errors name its own lines; the keys the
	// bench writes after it (a key the file repeats is "given twice").
	bench := "log_level: info\npolicy: " + pol + "\nprobe_interval: 100ms\nsubflow_lowat: 131072\n" +
		"selectors:\n  - {prefixes: [10.0.0.1/32], ports: [\"5201\"]}\ndetours:\n  - {kind: nat, relay: 10.0.0.2:7000, address: 10.0.0.2:40000, server: 10.0.0.1:5201}\n"
	if _, err := agentd.ParseFragment(text + bench); err != nil {
		return nil, cli.Usagef("--agent-config %s: %v (lines after %d are what the bench writes itself: log_level, policy, probe_interval, subflow_lowat, selectors, detours, socket, subflows)",
			path, err, strings.Count(text, "\n"))
	}
	return map[string]string{pol: text}, nil
}
