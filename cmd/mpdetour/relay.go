package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relay/tunnels"
	"github.com/mpdetour/mpdetour/internal/relayd"
)

// relayCommand builds the relay subcommand.
func relayCommand() *cli.Command {
	var (
		config         string
		verbose, check bool
	)
	return &cli.Command{
		Name:    "relay",
		Summary: "run a detour host: authenticated NAT detours on nftables and WireGuard tunnel detours (see docs/relay.md)",
		Usage:   "--config FILE [--check] | status [--json] | genkey | pubkey < PRIVATE",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&config, "config", "", "relay configuration file (YAML)")
			fs.BoolVar(&verbose, "v", false, "debug logging")
			fs.BoolVar(&check, "check", false, "validate the configuration file, print a summary and exit (0 = valid)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 && args[0] == "status" {
				return relayStatus(args[1:])
			}
			if len(args) > 0 {
				if len(args) > 1 || config != "" {
					return cli.Usagef("relay: %s takes no arguments or flags", args[0])
				}
				switch args[0] {
				case "genkey":
					k, err := proto.GenerateKey()
					if err != nil {
						return err
					}
					fmt.Println(k)
					return nil
				case "pubkey":
					line, err := bufio.NewReader(os.Stdin).ReadString('\n')
					if err != nil && line == "" {
						return fmt.Errorf("pubkey: reading a private key from stdin: %w", err)
					}
					k, err := proto.ParseKey(line)
					if err != nil {
						return fmt.Errorf("pubkey: %w", err)
					}
					fmt.Println(k.Public())
					return nil
				}
				return cli.Usagef("relay: unknown argument %q (want --config FILE, status, genkey or pubkey)", args[0])
			}
			if config == "" {
				return cli.Usagef("relay: --config FILE is required")
			}
			if check {
				s, err := relayd.LoadConfig(config)
				if err != nil {
					return err
				}
				if s.Tunnel != nil {
					if _, err := tunnels.ParseConfig(s.Tunnel); err != nil {
						return err
					}
				}
				fmt.Printf("%s: valid: listen %s, %d members, ports %d-%d, lease %s, tunnel section: %v\n",
					config, s.Listen, len(s.Members), s.PortLo, s.PortHi, s.Lease, s.Tunnel != nil)
				return nil
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			return relayd.Run(ctx, config, log, relayTunnels)
		},
	}
}

// relayStatus prints the state of the relay running in this network
// namespace, as `wg show` does for WireGuard: members, their sessions and
// mappings with live byte counts, and the tunnel peers.
func relayStatus(args []string) error {
	fs := flag.NewFlagSet("relay status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	if err := fs.Parse(args); err != nil {
		return cli.Usagef("relay status: %v", err)
	}
	if fs.NArg() > 0 {
		return cli.Usagef("relay status: unexpected argument %q", fs.Arg(0))
	}
	st, err := relay.QueryStatus(5 * time.Second)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(st)
	}
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return st.Now.Sub(t).Round(time.Second).String() + " ago"
	}
	listen := st.Listen
	if st.Listen6 != "" {
		listen += " and " + st.Listen6
	}
	fmt.Printf("relay %s (pid %d), up %s, ports %s, %d mappings\n", listen, st.PID,
		st.Now.Sub(st.Started).Round(time.Second), st.Ports, st.Mappings)
	if !st.CounterOK {
		fmt.Println("  (byte counters could not be read from the kernel: bytes show 0)")
	}
	for _, m := range st.Members {
		id := ""
		if m.Key != "" {
			id = " (key " + m.Key[:8] + ")"
		}
		if !m.CertifiedUntil.IsZero() {
			id += ", certified until " + m.CertifiedUntil.Format(time.RFC3339)
		}
		fmt.Printf("\nmember %s%s\n", m.Name, id)
		if m.Key != "" {
			fmt.Printf("  sessions: %d, last handshake: %s", m.Sessions, ago(m.LastHandshake))
			if m.LastAddress != "" {
				fmt.Printf(" from %s", m.LastAddress)
			}
			fmt.Println()
		}
		fmt.Printf("  mappings: %d, bytes: %s\n", len(m.Mappings), humanBytes(m.Bytes))
		for _, mp := range m.Mappings {
			fmt.Printf("    %s -> %s  %s  expires in %s\n", mp.Client, mp.Server, humanBytes(mp.Bytes),
				mp.Expires.Sub(st.Now).Round(time.Second))
		}
		if l := m.Ledger; l != nil {
			fmt.Printf("  ledger: relayed %s, earned %s (%d receipts), credit %s\n", humanBytes(l.Consumed), humanBytes(l.Earned), l.Receipts, creditText(l.CreditUnits))
		}
	}
	if f := st.Fair; f != nil {
		capacity := "no capacity limit"
		if f.Capacity > 0 {
			capacity = fmt.Sprintf("capacity %d mappings (%d in use)", f.Capacity, f.Active)
		}
		ledger := "in memory only"
		if f.LedgerFile != "" {
			ledger = f.LedgerFile + ", saved " + ago(f.LedgerSaved)
		}
		fmt.Printf("\nfair sharing: %s; credit unit %s, start credit %s; ledger %s; receipts issued: %d\n",
			capacity, humanBytes(uint64(f.UnitBytes)), humanBytes(uint64(f.StartCredit)), ledger, f.IssuedSeq)
		for _, o := range f.Others {
			fmt.Printf("  former member %s (key %s): relayed %s, earned %s, credit %s\n", o.Name, o.Key[:8],
				humanBytes(o.Ledger.Consumed), humanBytes(o.Ledger.Earned), creditText(o.Ledger.CreditUnits))
		}
	}
	if c := st.Converter; c != nil {
		fmt.Printf("\nconverter %s, %d tickets outstanding\n", c.Listen, c.Tickets)
	}
	printRoster(st.Roster, ago)
	if t := st.Tunnel; t != nil {
		fmt.Printf("\ntunnel %s (UDP %d), %d peers\n", t.Device, t.ListenPort, len(t.Peers))
		for _, p := range t.Peers {
			name := p.Member
			if name == "" {
				name = "(not a member)"
			}
			fmt.Printf("  peer %s (key %s) %s  endpoint %s  latest handshake: %s  rx %s  tx %s\n", name, p.Key[:8],
				strings.Join(p.Addresses, ","), p.Endpoint, ago(p.LastHandshake), humanBytes(uint64(p.RxBytes)), humanBytes(uint64(p.TxBytes)))
		}
	}
	return nil
}

func humanBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// creditText shows a credit in units (MiB, collective.CreditUnit).
func creditText(units float64) string {
	return fmt.Sprintf("%+.1f units (MiB)", units)
}

// printRoster is the roster part of `relay status` (collective gossip).
func printRoster(r *relay.RosterStatus, ago func(time.Time) string) {
	if r == nil {
		return
	}
	fmt.Printf("\nroster (gossip %s): %d relays verified, %d gossip members\n", r.Gossip, len(r.Relays), r.Members)
	for _, e := range r.Relays {
		self := ""
		if e.Self {
			self = " (this relay)"
		}
		addrs := make([]string, len(e.Addrs))
		for i, a := range e.Addrs {
			addrs[i] = a.String()
		}
		region := e.Region
		if region == "" {
			region = "-"
		}
		fmt.Printf("  %s%s key %s  %s  region %s  %s  load %d/%d  signed %s\n", e.Name, self, e.Key[:8],
			strings.Join(addrs, ","), region, e.Kinds, e.Load, e.Capacity, ago(e.Issued))
	}
	if len(r.Refused) > 0 {
		var rs []string
		for k, v := range r.Refused {
			rs = append(rs, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(rs)
		fmt.Printf("  refused entries: %s\n", strings.Join(rs, ", "))
	}
	fmt.Printf("  revocation list: seq %d, %d serials (shared over gossip)\n", r.CRLSeq, r.CRLSerials)
	if len(r.CRLRefused) > 0 {
		var rs []string
		for k, v := range r.CRLRefused {
			rs = append(rs, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(rs)
		fmt.Printf("  revocation lists refused from gossip: %s\n", strings.Join(rs, ", "))
	}
}
