package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/pathcheck"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// pathCheckCommand builds the path-check subcommand.
func pathCheckCommand() *cli.Command {
	var nats, tunnels listFlag
	var agentConfig, netns string
	var asJSON, join, noTTL, noDefault bool
	var maxTTL int
	var wait time.Duration
	return &cli.Command{
		Name:    "path-check",
		Summary: "tracebox-style probe: do MPTCP options survive the default path and each detour, and where are they stripped",
		Usage: "SERVER:PORT [--nat NAME=RELAY:PORT]... [--tunnel NAME=IFACE|ADDR]... [--agent-config FILE] [--join] [--json]\n\n" +
			"Sends TCP SYNs carrying MP_CAPABLE (and with --join MP_JOIN) with TTL 1, 2, ... through each\n" +
			"path, compares what every router quotes back in its ICMP time-exceeded error with what was\n" +
			"sent, and reads the server's SYN/ACK. Per path it prints the hops, which TCP fields and options\n" +
			"each changed, where the MPTCP option was lost, and a verdict: ok (the server answered\n" +
			"MP_CAPABLE), mptcp-stripped (a hop removed or changed it: subflows through that path fail, use\n" +
			"a tunnel detour there), no-mptcp (plain SYN/ACK, nothing to blame: the server lacks MPTCP),\n" +
			"closed (RST), unreachable, error. Paths: the default path to SERVER:PORT, each --nat detour\n" +
			"(probes go to the relay's granted address and port; the relay forwards them to the server),\n" +
			"each --tunnel (probes leave from the interface, or from the address, of a tunnel detour), and\n" +
			"with --agent-config a NAT detour granted by each relay of that agent config (as `doctor\n" +
			"--server` does; the grant lapses with its lease). Needs root (raw sockets). Exit status 1\n" +
			"when a path does not carry MPTCP.",
		Flags: func(fs *flag.FlagSet) {
			fs.Var(&nats, "nat", "a NAT detour: NAME=RELAY:PORT, the relay's address and the port it granted for SERVER:PORT (repeatable)")
			fs.Var(&tunnels, "tunnel", "a tunnel detour: NAME=IFACE (probes bound to the interface) or NAME=ADDR (its local address) (repeatable)")
			fs.StringVar(&agentConfig, "agent-config", "", "also ask every relay of this agent config for a NAT detour to SERVER:PORT and probe it")
			fs.StringVar(&netns, "netns", "", "probe from this network namespace (a name under /run/netns or a path)")
			fs.BoolVar(&join, "join", false, "also send MP_JOIN probes (random token: the server resets them, but the hops show whether MP_JOIN survives)")
			fs.BoolVar(&noTTL, "no-ttl", false, "one full-TTL probe per path: only the final answer, no per-hop view")
			fs.BoolVar(&noDefault, "no-default", false, "skip the default path")
			fs.IntVar(&maxTTL, "max-ttl", 16, "last TTL tried (1-64)")
			fs.DurationVar(&wait, "wait", time.Second, "how long to wait for each probe's answer")
			fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
		},
		Interspersed: true,
		Run: func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("path-check: want exactly one SERVER:PORT, got %d arguments", len(args))
			}
			server, err := netip.ParseAddrPort(args[0])
			if err != nil || !server.Addr().Is4() || server.Port() == 0 {
				if err == nil && server.Addr().Is6() {
					return cli.Usagef("path-check: %q is an IPv6 server: path-check probes IPv4 paths only (its probes are crafted IPv4 packets; IPv6 not built)", args[0])
				}
				return cli.Usagef("path-check: %q is not an IPv4 SERVER:PORT (numeric address, port 1-65535)", args[0])
			}
			if maxTTL < 1 || maxTTL > 64 {
				return cli.Usagef("path-check: --max-ttl %d out of range 1-64", maxTTL)
			}
			if wait < 10*time.Millisecond || wait > time.Minute {
				return cli.Usagef("path-check: --wait %s out of range 10ms-1m", wait)
			}
			opts := pathcheck.Options{Netns: netns, MaxTTL: maxTTL, NoTTL: noTTL, Wait: wait, Join: join}
			names := map[string]bool{}
			addPath := func(p pathcheck.Path) error {
				if names[p.Name] {
					return cli.Usagef("path-check: path name %q used twice", p.Name)
				}
				names[p.Name] = true
				opts.Paths = append(opts.Paths, p)
				return nil
			}
			if !noDefault {
				_ = addPath(pathcheck.Path{Name: "default", Kind: pathcheck.Default, Dst: server})
			}
			for _, n := range nats {
				name, addr, ok := strings.Cut(n, "=")
				ap, err := netip.ParseAddrPort(addr)
				if !ok || name == "" || err != nil || !ap.Addr().Is4() {
					return cli.Usagef("path-check: --nat %q is not NAME=RELAY:PORT (IPv4, numeric)", n)
				}
				if err := addPath(pathcheck.Path{Name: "nat:" + name, Kind: pathcheck.NAT, Dst: ap}); err != nil {
					return err
				}
			}
			for _, t := range tunnels {
				name, v, ok := strings.Cut(t, "=")
				if !ok || name == "" || v == "" {
					return cli.Usagef("path-check: --tunnel %q is not NAME=IFACE or NAME=ADDR", t)
				}
				p := pathcheck.Path{Name: "tunnel:" + name, Kind: pathcheck.Tunnel, Dst: server}
				if a, err := netip.ParseAddr(v); err == nil {
					if !a.Is4() {
						return cli.Usagef("path-check: --tunnel %q: IPv4 addresses only", t)
					}
					p.Src = a
				} else if len(v) > 15 || strings.ContainsAny(v, "/ ") {
					return cli.Usagef("path-check: --tunnel %q: %q is neither an IPv4 address nor an interface name", t, v)
				} else {
					p.Device = v
				}
				if err := addPath(p); err != nil {
					return err
				}
			}
			if agentConfig != "" {
				ps, err := grantedPaths(ctx, agentConfig, server)
				if err != nil {
					return err
				}
				for _, p := range ps {
					if err := addPath(p); err != nil {
						return err
					}
				}
			}
			if len(opts.Paths) == 0 {
				return cli.Usagef("path-check: no path to probe (--no-default without --nat, --tunnel or --agent-config)")
			}
			rep, err := pathcheck.Run(ctx, opts)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(rep); err != nil {
					return err
				}
			} else {
				printPathCheck(os.Stdout, rep)
			}
			var bad []string
			for _, p := range rep.Paths {
				if p.Verdict != pathcheck.OK {
					bad = append(bad, p.Path.Name+": "+p.Verdict)
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("path-check: MPTCP does not work on every path (%s)", strings.Join(bad, ", "))
			}
			return nil
		},
	}
}

// grantedPaths asks each relay of an agent config for a NAT detour to
// server. The grants are not released: a running agent of the same member
// shares them (one mapping per member and server); unused, they lapse.
func grantedPaths(ctx context.Context, file string, server netip.AddrPort) ([]pathcheck.Path, error) {
	cfg, err := agentd.LoadConfig(file)
	if err != nil {
		return nil, err
	}
	if cfg.Relays == nil {
		return nil, fmt.Errorf("path-check: %s has no relays section: no detour to ask for", file)
	}
	src := *cfg.Relays
	src.Options.ListenPacket = relayconn.ListenIn(cfg.Agent.NetNS)
	var ps []pathcheck.Path
	var errs []error
	for _, rel := range src.Relays {
		if rel.Addr.Addr().Unmap().Is4() != server.Addr().Is4() {
			// A relay grants only within its control session's family.
			fmt.Fprintf(os.Stderr, "path-check: relay %s skipped: %s relay, %s server (path-check probes IPv4 paths only)\n",
				rel.Name, policy.FamilyName(rel.Addr.Addr()), policy.FamilyName(server.Addr()))
			continue
		}
		c, err := relayconn.Dial(rel, src.PrivateKey, src.Options)
		if err != nil {
			errs = append(errs, fmt.Errorf("relay %s: %w", rel.Name, err))
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		d, _, err := c.Grant(gctx, server, 0)
		cancel()
		c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("relay %s: grant to %s: %w", rel.Name, server, err))
			continue
		}
		ps = append(ps, pathcheck.Path{Name: "nat:" + rel.Name, Kind: pathcheck.NAT, Dst: d})
	}
	if len(ps) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, e := range errs {
		fmt.Fprintln(os.Stderr, "path-check:", e)
	}
	return ps, nil
}

// printFamilySummary prints one line per address family: the paths
// probed and their verdicts; IPv6 paths are not probed (the probes are
// crafted IPv4 packets; an IPv6 prober is not built).
func printFamilySummary(w io.Writer, rep *pathcheck.Report) {
	verdicts := map[string]int{}
	n := 0
	for _, p := range rep.Paths {
		verdicts[p.Verdict]++
		n++
	}
	var parts []string
	for _, v := range []string{pathcheck.OK, pathcheck.Stripped, pathcheck.NoMPTCP, pathcheck.Closed, pathcheck.Unreachable, pathcheck.Failed} {
		if verdicts[v] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", verdicts[v], v))
		}
	}
	fmt.Fprintf(w, "\nIPv4: %d paths probed (%s)\n", n, strings.Join(parts, ", "))
	fmt.Fprintf(w, "IPv6: not probed (path-check crafts IPv4 probes only; an IPv6 detour's subflows show in `mpdetour status`)\n")
}

func printPathCheck(w io.Writer, rep *pathcheck.Report) {
	defer printFamilySummary(w, rep)
	for i, p := range rep.Paths {
		if i > 0 {
			fmt.Fprintln(w)
		}
		via := ""
		switch {
		case p.Path.Device != "":
			via = " dev " + p.Path.Device
		case p.Path.Kind == pathcheck.Tunnel && p.Path.Src.IsValid():
			via = " from " + p.Path.Src.String()
		}
		fmt.Fprintf(w, "path %s (%s): %s -> %s%s\n", p.Path.Name, p.Path.Kind, p.Path.Src, p.Path.Dst, via)
		for _, pr := range p.Probes {
			fmt.Fprintf(w, "  probe %s\n", pr.Probe)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			for _, h := range pr.Hops {
				if !h.From.IsValid() {
					fmt.Fprintf(tw, "    %d\t*\t\t\t\n", h.TTL)
					continue
				}
				var ch []string
				for _, c := range h.Changes {
					ch = append(ch, fmt.Sprintf("%s %s -> %s", c.Field, c.Sent, c.Seen))
				}
				changed := "unchanged"
				if len(ch) > 0 {
					changed = strings.Join(ch, "; ")
				}
				fmt.Fprintf(tw, "    %d\t%s\t%.1f ms\tmptcp %s\t%s\n", h.TTL, h.From, h.RTTms, h.MPTCP, changed)
			}
			tw.Flush()
			if f := pr.Final; f != nil {
				mp := f.MPTCP
				if mp == "" {
					mp = "no MPTCP option"
				}
				fmt.Fprintf(w, "    end %s %s in %.1f ms: %s [%s]\n", f.From, f.Flags, f.RTTms, mp, strings.Join(f.Options, " "))
			} else {
				fmt.Fprintf(w, "    end: no answer\n")
			}
		}
		fmt.Fprintf(w, "  verdict: %s: %s\n", p.Verdict, p.Detail)
		if p.Verdict == pathcheck.Stripped && p.Path.Kind == pathcheck.NAT {
			fmt.Fprintf(w, "  -> subflows through this NAT detour fail (MP_JOIN stripped) or the connection falls back to TCP; use a tunnel detour from this relay (agent: tunnels: true, docs/agent.md)\n")
		}
	}
}
