package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/attack/breaks"
)

// attackBuild is one product binary the product cases run against.
type attackBuild struct{ label, path string }

// parseBuilds parses --builds: LABEL=PATH,... (a label once).
func parseBuilds(s string) ([]attackBuild, error) {
	var bs []attackBuild
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		label, path, ok := strings.Cut(f, "=")
		if !ok || label == "" || path == "" {
			return nil, fmt.Errorf("--builds: %q is not LABEL=PATH", f)
		}
		if seen[label] {
			return nil, fmt.Errorf("--builds: label %q given twice", label)
		}
		seen[label] = true
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("--builds: %s: %w", label, err)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("--builds: %s: %s is not an executable file", label, path)
		}
		bs = append(bs, attackBuild{label, path})
	}
	return bs, nil
}

// runAttackCases runs the attack suite's product cases (issue 28) against
// every build, interleaved (trial 1 of every case and build, then trial 2,
// ...), writing results.jsonl and a table to out. It fails when a case
// fails against the last build (the one under test) or cannot run there.
func runAttackCases(ctx context.Context, cases []string, builds []attackBuild, trials int, out, name string, w io.Writer) error {
	known := map[string]bool{}
	for _, c := range breaks.Cases() {
		known[c] = true
	}
	for _, c := range cases {
		if !known[c] {
			return cli.Usagef("--cases: unknown case %q (known: %s)", c, strings.Join(breaks.Cases(), ", "))
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(out, "results.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	type row struct {
		build string
		r     breaks.Result
	}
	var rows []row
	for t := 1; t <= trials; t++ {
		for _, c := range cases {
			for _, b := range builds {
				if err := ctx.Err(); err != nil {
					return err
				}
				dir, err := os.MkdirTemp("", "attack-case-")
				if err != nil {
					return err
				}
				r := breaks.Run(ctx, c, breaks.Options{Binary: b.path, Dir: dir, LabName: name, Self: self, PeerCommand: "attack-peer"})
				os.RemoveAll(dir)
				rec := struct {
					Build string `json:"build"`
					Trial int    `json:"trial"`
					breaks.Result
				}{b.label, t, r}
				line, _ := json.Marshal(rec)
				f.Write(append(line, '\n'))
				rows = append(rows, row{b.label, r})
				fmt.Fprintf(w, "trial %d %s %s: %s\n", t, c, b.label, verdict(r))
			}
		}
	}
	fmt.Fprintf(w, "\n| case (break) | build | %s | value | target | result | seconds | what happened |\n|---|---|---|---|---|---|---|---|\n", "metric")
	var failed []string
	last := builds[len(builds)-1].label
	for _, x := range rows {
		fmt.Fprintf(w, "| %s (%d) | %s | %s | %g | %s | %s | %.1f | %s |\n", x.r.Case, x.r.Break, x.build, x.r.Metric, x.r.Value, x.r.Target, verdict(x.r), x.r.Seconds, detailOrError(x.r))
		if x.build == last && (!x.r.Pass || x.r.Error != "") {
			failed = append(failed, x.r.Case)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("attack cases failing against %s: %s", last, strings.Join(failed, ", "))
	}
	return nil
}

func verdict(r breaks.Result) string {
	switch {
	case r.Error != "":
		return "could not run"
	case r.Pass:
		return "pass"
	}
	return "FAIL"
}

func detailOrError(r breaks.Result) string {
	if r.Error != "" {
		return r.Error
	}
	return r.Detail
}

// attackPeerCommand is the other local user's side of the convert-socket
// case, which runs it as uid 65534.
func attackPeerCommand() *cli.Command {
	var sock, dst, relay string
	return &cli.Command{
		Name:    "attack-peer",
		Summary: "internal (started by bench attacks --cases convert-socket as another user): ask the agent's conversion socket and print the answers as JSON",
		Hidden:  true,
		Usage:   "--socket PATH --dst HOST:PORT --relay NAME",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&sock, "socket", "", "the agent's conversion socket")
			fs.StringVar(&dst, "dst", "", "the destination to lie about")
			fs.StringVar(&relay, "relay", "", "the converter's relay to report as failed")
		},
		Run: func(ctx context.Context, args []string) error {
			if sock == "" || dst == "" || relay == "" {
				return cli.Usagef("attack-peer: --socket, --dst and --relay are required")
			}
			return breaks.Peer(sock, dst, relay, os.Stdout)
		},
	}
}
