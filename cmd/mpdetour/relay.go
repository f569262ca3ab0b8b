package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
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
		Usage:   "--config FILE [--check] | genkey | pubkey < PRIVATE",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&config, "config", "", "relay configuration file (YAML)")
			fs.BoolVar(&verbose, "v", false, "debug logging")
			fs.BoolVar(&check, "check", false, "validate the configuration file, print a summary and exit (0 = valid)")
		},
		Run: func(ctx context.Context, args []string) error {
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
				return cli.Usagef("relay: unknown argument %q (want --config FILE, genkey or pubkey)", args[0])
			}
			if config == "" {
				return cli.Usagef("relay: --config FILE is required")
			}
			if check {
				s, err := relay.LoadConfig(config)
				if err != nil {
					return err
				}
				if s.Tunnel != nil {
					if _, _, err := tunnelctl.ParseConfig(s.Tunnel); err != nil {
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
			return relay.Run(ctx, config, log, relayTunnels)
		},
	}
}
