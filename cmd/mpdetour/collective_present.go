package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// collectivePresent presents the usage receipts a member's relay issued
// (fair_share.receipts_file) to the relays of the member's agent
// configuration, so they count its contribution (fair sharing,
// docs/collective.md). Run it from a timer, e.g. every receipt_every.
func collectivePresent() *cli.Command {
	var config, receipts, state string
	var timeout time.Duration
	return &cli.Command{
		Name:    "present",
		Summary: "present the usage receipts your relay issued to the relays of your agent configuration (earns credit there)",
		Usage:   "--config AGENT_CONFIG --receipts FILE [--state FILE]",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&config, "config", "", "the agent's configuration file (its relays: section: key, certificate, relays)")
			fs.StringVar(&receipts, "receipts", "", "the receipts file your relay writes (its fair_share.receipts_file)")
			fs.StringVar(&state, "state", "", "progress file: receipts presented per relay (default: RECEIPTS.presented)")
			fs.DurationVar(&timeout, "timeout", 2*time.Minute, "give up on a relay after this long")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 || config == "" || receipts == "" {
				return cli.Usagef("collective present needs --config AGENT_CONFIG and --receipts FILE, and no arguments")
			}
			if state == "" {
				state = receipts + ".presented"
			}
			cfg, err := agentd.LoadConfig(config)
			if err != nil {
				return err
			}
			if cfg.Relays == nil {
				return fmt.Errorf("%s has no relays: section", config)
			}
			rs, err := relayconn.ReadReceipts(receipts)
			if err != nil {
				return err
			}
			p, err := relayconn.LoadPresented(state)
			if err != nil {
				return err
			}
			sc := *cfg.Relays
			opt := sc.Options
			if opt.ListenPacket == nil {
				opt.ListenPacket = relayconn.ListenIn(cfg.Agent.NetNS)
			}
			var failed error
			for _, r := range sc.Relays {
				c, err := relayconn.Dial(r, sc.PrivateKey, opt)
				if err != nil {
					failed = errors.Join(failed, fmt.Errorf("relay %s: %w", r.Name, err))
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, timeout)
				res, err := relayconn.PresentAll(rctx, c, rs, p, time.Now())
				cancel()
				c.Close()
				fmt.Printf("relay %s: %d accepted, %d refused %v, %d already presented or expired", r.Name, res.Accepted, res.Refused, res.Reasons, res.Skipped)
				if res.Accepted > 0 {
					fmt.Printf("; credit there %+.1f units (MiB)", float64(res.Credit)/(1<<20))
				}
				fmt.Println()
				if err != nil {
					failed = errors.Join(failed, fmt.Errorf("relay %s: %w", r.Name, err))
				}
			}
			if err := p.Save(state); err != nil {
				failed = errors.Join(failed, fmt.Errorf("progress file: %w", err))
			}
			return failed
		},
	}
}
