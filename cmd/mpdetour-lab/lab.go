package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
)

// setFlags collects repeated --set KEY=VALUE flags in order.
type setFlags [][2]string

func (s *setFlags) String() string { return "" }

func (s *setFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*s = append(*s, [2]string{k, val})
	return nil
}

// loadTopology takes a built-in name or a file path.
func loadTopology(arg string) (*topology.Topology, error) {
	if _, err := os.Stat(arg); err == nil || strings.ContainsAny(arg, "/.") {
		return topology.LoadFile(arg)
	}
	return topology.Builtin(arg)
}

// labCommands builds the commands that manage labs: up, exec, check, down, list.
func labCommands() []*cli.Command {
	var (
		name string
		sets setFlags
	)
	up := &cli.Command{
		Name:         "up",
		Summary:      "build a lab from a topology file or built-in (brennan2017, detours, loadbalancer, line, collective)",
		Usage:        "TOPOLOGY [--name NAME] [--set KEY=VALUE ...]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&name, "name", "", "lab name (default: the topology's name)")
			fs.Var(&sets, "set", "override a parameter, e.g. profile=symmetric, L2.loss=1%, L2.delay=100ms, detours=3 (repeatable)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("lab up takes one TOPOLOGY (a file or one of: %s)", strings.Join(topology.Builtins(), ", "))
			}
			t, err := loadTopology(args[0])
			if err != nil {
				return err
			}
			for _, kv := range sets {
				if err := t.Set(kv[0], kv[1]); err != nil {
					return err
				}
			}
			if name == "" {
				name = t.Name
			}
			if err := topology.CheckLabName(name); err != nil {
				return cli.Usagef("%v", err)
			}
			start := time.Now()
			l, err := lab.Up(ctx, t, name)
			if err != nil {
				return err
			}
			fmt.Printf("lab %s up (%s, %d nodes, %d links) in %v\n", name, t.Source, len(t.Nodes), len(t.Links), time.Since(start).Round(time.Millisecond))
			printLab(l)
			return nil
		},
	}
	execCmd := &cli.Command{
		Name:    "exec",
		Summary: "run a command inside a lab node (exit status passed through)",
		Usage:   "NAME NODE -- CMD [ARG...]",
		Run: func(_ context.Context, args []string) error {
			if len(args) >= 3 && args[2] == "--" {
				args = append(args[:2:2], args[3:]...)
			}
			if len(args) < 3 {
				return cli.Usagef("lab exec needs NAME NODE -- CMD")
			}
			l, err := lab.Open(args[0])
			if err != nil {
				return err
			}
			if l.NetnsPath(args[1]) == "" {
				return cli.Usagef("lab %s has no node %q (nodes: %s)", args[0], args[1], strings.Join(l.Nodes(), ", "))
			}
			// Not tied to the command's context: Ctrl-C reaches the child
			// from the terminal, and we wait for it to exit.
			cmd := l.Command(context.Background(), args[1], args[2:]...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			err = cmd.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code := ee.ExitCode()
				if code < 0 {
					code = 128 + 9
				}
				return &cli.ExitError{Code: code}
			}
			return err
		},
	}
	var (
		jsonOut    bool
		saveJSON   string
		opts       lab.CheckOptions
		checkLinks string
		checkFam   string
	)
	check := &cli.Command{
		Name:         "check",
		Summary:      "measure every link (RTT, goodput, loss) against its spec; exit 1 if any is off",
		Usage:        "NAME [--json] [--save FILE] [--duration D] [--samples N] [--links L1,L2] [--sequential | --all-at-once] [--no-rate] [--family 4|6]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&jsonOut, "json", false, "print the report as JSON")
			fs.StringVar(&saveJSON, "save", "", "also write the JSON report to this file")
			fs.DurationVar(&opts.RateDuration, "duration", 4*time.Second, "length of each TCP goodput transfer (window starts at 1 s)")
			fs.IntVar(&opts.LossSamples, "samples", 2000, "UDP probes per direction for the loss estimate")
			fs.IntVar(&opts.Pings, "pings", 20, "echo requests per direction for the RTT")
			fs.Float64Var(&opts.Confidence, "confidence", 0.99, "confidence of the loss interval")
			fs.StringVar(&checkLinks, "links", "", "comma-separated links to check (default: all)")
			fs.BoolVar(&opts.Sequential, "sequential", false, "measure goodput one direction at a time (default: all links' a->b at once, then b->a)")
			fs.BoolVar(&opts.NoRate, "no-rate", false, "skip the goodput measurement")
			fs.BoolVar(&opts.AllAtOnce, "all-at-once", false, "load every direction of every link at once (full load; spec reduced by the reverse flow's ACKs)")
			fs.StringVar(&checkFam, "family", "", "address family to measure, 4 or 6 (default: 4 if the lab has IPv4; a dual lab is checked once per family)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("lab check takes one lab NAME")
			}
			if opts.Sequential && opts.AllAtOnce {
				return cli.Usagef("--sequential and --all-at-once exclude each other")
			}
			if checkLinks != "" {
				opts.Links = strings.Split(checkLinks, ",")
			}
			opts.Family = topology.Family(checkFam)
			l, err := lab.Open(args[0])
			if err != nil {
				return err
			}
			rep, err := l.Check(ctx, opts)
			if err != nil {
				return err
			}
			if saveJSON != "" {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err == nil {
					err = os.WriteFile(saveJSON, append(b, '\n'), 0o644)
				}
				if err != nil {
					return err
				}
			}
			if jsonOut {
				if err := cli.PrintJSON(rep); err != nil {
					return err
				}
			} else {
				printCheck(rep)
			}
			if !rep.OK {
				for _, f := range rep.Failures() {
					fmt.Fprintln(cli.Stderr, "lab check: FAIL", f)
				}
				return fmt.Errorf("lab %s: %d measurements off their spec", args[0], len(rep.Failures()))
			}
			return nil
		},
	}
	down := &cli.Command{
		Name:    "down",
		Summary: "remove a lab (idempotent; also after a crash of lab up)",
		Usage:   "NAME",
		Run: func(_ context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("lab down takes one lab NAME")
			}
			if err := topology.CheckLabName(args[0]); err != nil {
				return cli.Usagef("%v", err)
			}
			return lab.Down(args[0])
		},
	}
	list := &cli.Command{
		Name:    "list",
		Summary: "list labs",
		Run: func(_ context.Context, args []string) error {
			if len(args) != 0 {
				return cli.Usagef("lab list takes no arguments")
			}
			names, err := lab.List()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			for _, n := range names {
				l, err := lab.Open(n)
				if err != nil {
					fmt.Fprintf(w, "%s\t(%v)\n", n, err)
					continue
				}
				fmt.Fprintf(w, "%s\t%s\t%d nodes\n", n, l.Topology().Source, len(l.Nodes()))
			}
			return w.Flush()
		},
	}
	return []*cli.Command{up, execCmd, check, down, list}
}

func printLab(l *lab.Lab) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tNAMESPACE\tADDRESSES")
	for _, n := range l.Nodes() {
		var addrs []string
		for _, i := range l.Ifaces(n) {
			addrs = append(addrs, i.Name+"="+i.Addr.String())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", n, l.NetnsName(n), strings.Join(addrs, " "))
	}
	w.Flush()
	w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nLINK\tA\tB\tRATE a>b/b>a\tDELAY a>b/b>a\tLOSS a>b/b>a\tQUEUE\tEMULATION")
	emu := l.Emulation()
	for i, k := range l.Topology().Links {
		var how []string
		for _, s := range []string{emu[i].Rate, emu[i].Delay, emu[i].Loss} {
			if s != "" && !containsS(how, s) {
				how = append(how, s)
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%v/%v\t%v/%v\t%v/%v\t%d/%d\t%s\n", k.Name, k.A.Node, k.B.Node,
			k.AB.Rate, k.BA.Rate, k.AB.Delay, k.BA.Delay, k.AB.Loss, k.BA.Loss, k.AB.QueueLimit(), k.BA.QueueLimit(), strings.Join(how, "+"))
	}
	w.Flush()
}

func containsS(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func printCheck(r *lab.CheckReport) {
	if r.Family == topology.Family6 {
		fmt.Println("family: IPv6")
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "LINK\tDIRECTION\tRTT spec\tRTT median\t\tRATE spec\tRATE (UDP)\t\tGOODPUT spec\tGOODPUT (TCP)\t\tLOSS spec\tLOSS (n=%d, %.0f%% interval)\t\n", r.Samples, r.Confidence*100)
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAIL"
	}
	for _, d := range r.Directions {
		gs, g := "-", "-"
		if d.GoodputSpec > 0 {
			gs = fmt.Sprintf("%.2f", d.GoodputSpec)
			g = fmt.Sprintf("%.2f", d.Goodput)
			if d.GoodputErr != "" {
				g = "error"
			}
		}
		rs, rm := "-", "-"
		if d.RateSpec > 0 {
			rs, rm = fmt.Sprintf("%.2f", d.RateSpec), fmt.Sprintf("%.2f", d.RateMeasured)
		}
		fmt.Fprintf(w, "%s\t%s->%s\t%.2fms\t%.2fms\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f%%\t%.2f%% [%.2f, %.2f]\t%s\n",
			d.Link, d.From, d.To,
			ms(d.RTTSpec), ms(d.RTTMedian), mark(d.RTTOK),
			rs, rm, mark(d.RateOK),
			gs, g, mark(d.GoodputOK),
			d.LossSpec*100, float64(d.Lost)/float64(max(d.Sent, 1))*100, d.LossLo*100, d.LossHi*100, mark(d.LossOK))
	}
	w.Flush()
	if r.LoadAvg > float64(r.CPUs) {
		fmt.Printf("note: load average %.1f on %d CPUs: goodput shortfalls may be the traffic endpoints starving, not the links\n", r.LoadAvg, r.CPUs)
	}
	if r.DelayLineCPU > 0 {
		fmt.Printf("delay line CPU during the goodput phase: %.2f cores\n", r.DelayLineCPU)
	}
	if r.OK {
		fmt.Println("lab check: all links within spec (RTT max(1ms,3%), rate 3%, goodput 3% of rate×1448/1514, loss in interval)")
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
