package main

import (
	"context"
	"flag"
	"os"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/cli"
)

// agentCommand builds the agent subcommand.
func agentCommand() *cli.Command {
	var config, netns, socket string
	var check bool
	return &cli.Command{
		Name:    "agent",
		Summary: "add detour subflows to MPTCP connections (userspace path manager); with server: in the config, announce detours to clients (ADD_ADDR, C flag)",
		Usage:   "--config FILE [--netns NS] [--socket PATH] [--check]",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&config, "config", "", "agent configuration (YAML, see docs/agent.md)")
			fs.StringVar(&netns, "netns", "", "manage this network namespace instead of the config's or our own")
			fs.StringVar(&socket, "socket", "", "status socket (overrides the config)")
			fs.BoolVar(&check, "check", false, "validate the configuration file, print a summary and exit (0 = valid)")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("agent takes no arguments")
			}
			if config == "" {
				return cli.Usagef("agent needs --config FILE")
			}
			cfg, err := agentd.LoadConfig(config)
			if err != nil {
				return err
			}
			if check {
				agentd.Summary(os.Stdout, config, cfg)
				return nil
			}
			if netns != "" {
				cfg.Agent.NetNS = netns
			}
			if socket != "" {
				cfg.Agent.Socket = socket
			}
			return agentd.Run(ctx, config, cfg)
		},
	}
}
