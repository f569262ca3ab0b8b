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
		Usage: "SERVER:PORT [SERVER6:PORT] [--nat NAME=RELAY:PORT]... [--tunnel NAME=IFACE|ADDR]... [--agent-config FILE] [--join] [--json]\n\n" +
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
			"--server` does; the grant lapses with its lease). Both families: IPv4 paths get IPv4\n" +
			"probes, IPv6 paths IPv6 probes; give the server's address of each family to probe both\n" +
			"(`path-check 192.0.2.10:443 '[2001:db8::10]:443'`: a default path per family, tunnels per\n" +
			"family, each relay asked for the server of its own family), IPv6 as [ADDR]:PORT. The report\n" +
			"ends with one line per family. Needs root (raw sockets). Exit status 1 when a path does not\n" +
			"carry MPTCP.",
		Flags: func(fs *flag.FlagSet) {
			fs.Var(&nats, "nat", "a NAT detour: NAME=RELAY:PORT, the relay's address (IPv4 or [IPv6]) and the port it granted for the server (repeatable)")
			fs.Var(&tunnels, "tunnel", "a tunnel detour: NAME=IFACE (probes bound to the interface, toward each server given) or NAME=ADDR (its local address, IPv4 or IPv6: toward the server of that family) (repeatable)")
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
			servers, err := pathCheckServers(args)
			if err != nil {
				return err
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
				for _, server := range servers {
					_ = addPath(pathcheck.Path{Name: "default" + familySuffix(servers, server), Kind: pathcheck.Default, Dst: server})
				}
			}
			for _, n := range nats {
				name, addr, ok := strings.Cut(n, "=")
				ap, err := netip.ParseAddrPort(addr)
				if !ok || name == "" || err != nil {
					return cli.Usagef("path-check: --nat %q is not NAME=RELAY:PORT (numeric; IPv6 as NAME=[ADDR]:PORT)", n)
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
				if a, err := netip.ParseAddr(v); err == nil {
					server, ok := serverOfFamily(servers, a)
					if !ok {
						return cli.Usagef("path-check: --tunnel %q: an %s tunnel address, but no %s SERVER:PORT given", t, policy.FamilyName(a), policy.FamilyName(a))
					}
					if err := addPath(pathcheck.Path{Name: "tunnel:" + name, Kind: pathcheck.Tunnel, Dst: server, Src: a}); err != nil {
						return err
					}
					continue
				}
				if len(v) > 15 || strings.ContainsAny(v, "/ ") {
					return cli.Usagef("path-check: --tunnel %q: %q is neither an address nor an interface name", t, v)
				}
				for _, server := range servers {
					if err := addPath(pathcheck.Path{Name: "tunnel:" + name + familySuffix(servers, server), Kind: pathcheck.Tunnel, Dst: server, Device: v}); err != nil {
						return err
					}
				}
			}
			if agentConfig != "" {
				ps, err := grantedPaths(ctx, agentConfig, servers)
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

// pathCheckServers reads the SERVER:PORT arguments: one or two, at most
// one per family (the server's IPv4 and IPv6 addresses).
func pathCheckServers(args []string) ([]netip.AddrPort, error) {
	if len(args) < 1 || len(args) > 2 {
		return nil, cli.Usagef("path-check: want SERVER:PORT (and optionally the server's address of the other family), got %d arguments", len(args))
	}
	var servers []netip.AddrPort
	for _, a := range args {
		ap, err := netip.ParseAddrPort(a)
		switch {
		case err != nil || ap.Port() == 0:
			return nil, cli.Usagef("path-check: %q is not SERVER:PORT (numeric address, IPv6 as [ADDR]:PORT, port 1-65535)", a)
		case ap.Addr().Is4In6():
			return nil, cli.Usagef("path-check: %q is an IPv4-mapped IPv6 address: give the IPv4 address %v", a, ap.Addr().Unmap())
		case ap.Addr().Zone() != "" || ap.Addr().IsLinkLocalUnicast():
			return nil, cli.Usagef("path-check: %q is link-local: no path through routers to probe", a)
		}
		if len(servers) == 1 && servers[0].Addr().Is4() == ap.Addr().Is4() {
			return nil, cli.Usagef("path-check: %s and %s are both %s: give at most one server address per family", servers[0], ap, policy.FamilyName(ap.Addr()))
		}
		servers = append(servers, ap)
	}
	return servers, nil
}

// familySuffix tells apart the paths of two servers (one per family);
// with one server, paths keep their plain names.
func familySuffix(servers []netip.AddrPort, s netip.AddrPort) string {
	if len(servers) < 2 {
		return ""
	}
	if s.Addr().Is4() {
		return "-v4"
	}
	return "-v6"
}

// serverOfFamily returns the server given of a's family.
func serverOfFamily(servers []netip.AddrPort, a netip.Addr) (netip.AddrPort, bool) {
	for _, s := range servers {
		if s.Addr().Is4() == a.Unmap().Is4() {
			return s, true
		}
	}
	return netip.AddrPort{}, false
}

// grantedPaths asks each relay of an agent config for a NAT detour to the
// server of the relay's family (a relay grants only within its control
// session's family). The grants are not released: a running agent of the
// same member shares them (one mapping per member and server); unused,
// they lapse.
func grantedPaths(ctx context.Context, file string, servers []netip.AddrPort) ([]pathcheck.Path, error) {
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
		server, ok := serverOfFamily(servers, rel.Addr.Addr())
		if !ok {
			// A relay grants only within its control session's family.
			fam := policy.FamilyName(rel.Addr.Addr())
			fmt.Fprintf(os.Stderr, "path-check: relay %s skipped: an %s relay grants only toward %s servers; give the server's %s address too\n",
				rel.Name, fam, fam, fam)
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
// probed (a path's family is its destination's) and their verdicts.
func printFamilySummary(w io.Writer, rep *pathcheck.Report) {
	fmt.Fprintln(w)
	for _, v6 := range []bool{false, true} {
		verdicts := map[string]int{}
		n := 0
		for _, p := range rep.Paths {
			if p.Path.Dst.Addr().Is6() == v6 {
				verdicts[p.Verdict]++
				n++
			}
		}
		fam := map[bool]string{false: "IPv4", true: "IPv6"}[v6]
		if n == 0 {
			fmt.Fprintf(w, "%s: no path probed (give the server's %s address, an %s --nat relay or --tunnel address)\n", fam, fam, fam)
			continue
		}
		var parts []string
		for _, v := range []string{pathcheck.OK, pathcheck.Stripped, pathcheck.NoMPTCP, pathcheck.Closed, pathcheck.Unreachable, pathcheck.Failed} {
			if verdicts[v] > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", verdicts[v], v))
			}
		}
		fmt.Fprintf(w, "%s: %d paths probed (%s)\n", fam, n, strings.Join(parts, ", "))
	}
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
