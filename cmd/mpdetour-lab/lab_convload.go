package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
)

// labConvertLoadCommand is `mpdetour-lab convert-load`: many
// idle conversions held at once, or new conversions at a rate, against the
// real converter (a relay with `convert:`) in a lab of its own.
func labConvertLoadCommand() *cli.Command {
	var (
		o         bench.ConvertLoadOptions
		out, name string
		bin       string
	)
	return &cli.Command{
		Name:         "convert-load",
		Summary:      "load the converter: N idle conversions held at once, or R new conversions/s (topology line)",
		Usage:        "(--idle N [--hold D] | --rate R [--duration D]) [--member-rate R] [--out FILE] [--name LAB]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&o.Idle, "idle", 0, "conversions to open and hold idle (then each is checked with a request/response)")
			fs.IntVar(&o.Concurrency, "concurrency", 64, "idle: conversions opened at once")
			fs.DurationVar(&o.Hold, "hold", 10*time.Second, "idle: how long to hold them once all are open")
			fs.Float64Var(&o.Rate, "rate", 0, "new conversions per second, each a one-byte request/response")
			fs.DurationVar(&o.Duration, "duration", 30*time.Second, "rate: how long")
			fs.IntVar(&o.MaxConns, "max-conns", 0, "the converter's max_conns (default max(1024, idle+1024))")
			fs.Float64Var(&o.MemberRate, "member-rate", 0, "the relay's rate.per_member (control requests/s; default the relay's 50: up to 32 tickets each caps one member at 1,600 conversions/s)")
			fs.StringVar(&out, "out", "", "write the report (JSON) to this file")
			fs.StringVar(&name, "name", "cvload", "lab name (namespaces <name>-<node>)")
			fs.StringVar(&bin, "bin", "", binFlagUsage)
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("lab convert-load: unexpected argument %q", args[0])
			}
			if (o.Idle > 0) == (o.Rate > 0) {
				return cli.Usagef("lab convert-load: give exactly one of --idle N and --rate R")
			}
			if o.Idle > 100000 || o.Rate > 100000 || o.Concurrency < 1 || o.Concurrency > 10000 {
				return cli.Usagef("lab convert-load: --idle (max 100000), --rate (max 100000) or --concurrency (1-10000) out of range")
			}
			if o.Rate > 0 && (o.Duration < time.Second || o.Duration > time.Hour) {
				return cli.Usagef("lab convert-load: --duration %s out of range 1s-1h", o.Duration)
			}
			exe, err := productBinary(bin)
			if err != nil {
				return err
			}
			// The load generator is this binary's convert-load-member.
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("finding the mpdetour-lab binary: %w", err)
			}
			o.Binary, o.LabBinary = exe, self
			dir, err := os.MkdirTemp("", "mpdetour-convload-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			o.Dir, o.Progress = dir, os.Stdout
			topo, err := topology.Builtin("line")
			if err != nil {
				return err
			}
			l, err := lab.Up(ctx, topo, name)
			if err != nil {
				return err
			}
			defer func() {
				if err := l.Down(); err != nil {
					fmt.Fprintf(os.Stderr, "lab convert-load: taking the lab down: %v\n", err)
				}
			}()
			o.Lab = l
			rep, err := bench.ConvertLoad(ctx, o)
			if rep != nil {
				b, jerr := json.MarshalIndent(rep, "", "  ")
				if jerr != nil {
					return jerr
				}
				if out != "" {
					if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
						return err
					}
					if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
						return err
					}
				}
				fmt.Println(string(b))
			}
			if err != nil {
				return fmt.Errorf("lab convert-load: %w", err)
			}
			return nil
		},
	}
}
