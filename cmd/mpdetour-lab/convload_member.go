package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/lab/convload"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// convertLoadMemberCommand is the load generator of "mpdetour-lab
// convert-load", which runs it in a lab node: a member taking converter
// tickets from a relay and opening conversions (idle hold, or a rate). Its results are JSON lines on stdout:
// {"event":"open",...} once the idle conversions are open (the hold then
// lasts until stdin closes or --hold elapses), {"event":"done",...} at the end.
func convertLoadMemberCommand() *cli.Command {
	var (
		relayAddr, relayKey, keyFile, dst string
		o                                 convload.Options
	)
	return &cli.Command{
		Name:    "convert-load-member",
		Summary: "internal (started by convert-load): open converter conversions, idle or at a rate, and report JSON lines",
		Hidden:  true,
		Usage:   "--relay HOST:PORT --relay-key KEY --key-file FILE --dst HOST:PORT (--idle N [--hold D] | --rate R --duration D)",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&relayAddr, "relay", "", "relay control address (UDP)")
			fs.StringVar(&relayKey, "relay-key", "", "relay public key")
			fs.StringVar(&keyFile, "key-file", "", "file holding the member's private key")
			fs.StringVar(&dst, "dst", "", "destination HOST:PORT (answers a byte with a byte)")
			fs.IntVar(&o.Idle, "idle", 0, "conversions to open and hold idle")
			fs.IntVar(&o.Concurrency, "concurrency", 64, "idle: conversions opened at once")
			fs.DurationVar(&o.Hold, "hold", 0, "idle: hold this long after all are open (0: until stdin closes)")
			fs.Float64Var(&o.Rate, "rate", 0, "new conversions per second (each a one-byte request/response)")
			fs.DurationVar(&o.Duration, "duration", 30*time.Second, "rate: how long")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("convert-load-member takes no arguments, got %q", args[0])
			}
			var err error
			if o.Relay, err = netip.ParseAddrPort(relayAddr); err != nil {
				return cli.Usagef("--relay: %v", err)
			}
			if o.Dst, err = netip.ParseAddrPort(dst); err != nil {
				return cli.Usagef("--dst: %v", err)
			}
			if o.RelayKey, err = proto.ParseKey(relayKey); err != nil {
				return cli.Usagef("--relay-key: %v", err)
			}
			b, err := os.ReadFile(keyFile)
			if err != nil {
				return err
			}
			if o.Key, err = proto.ParseKey(strings.TrimSpace(string(b))); err != nil {
				return fmt.Errorf("--key-file: %w", err)
			}
			if (o.Idle > 0) == (o.Rate > 0) {
				return cli.Usagef("give exactly one of --idle N and --rate R")
			}
			if o.Idle > 1<<20 || o.Rate > 1e6 || o.Concurrency < 1 || o.Concurrency > 10000 {
				return cli.Usagef("--idle (max 1048576), --rate (max 1e6) or --concurrency (1-10000) out of range")
			}
			if o.Rate > 0 && o.Duration <= 0 {
				return cli.Usagef("--duration must be positive")
			}
			// One descriptor per held conversion.
			if _, err := benchtool.RaiseNofile(uint64(o.Idle) + 4096); err != nil {
				return err
			}
			release := make(chan struct{})
			o.Release = release
			go func() {
				_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
				close(release)
			}()
			out := json.NewEncoder(os.Stdout)
			o.Opened = func(r convload.Result) {
				_ = out.Encode(struct {
					Event string `json:"event"`
					convload.Result
				}{"open", r})
			}
			res, err := convload.Run(ctx, o)
			if res != nil {
				_ = out.Encode(struct {
					Event string `json:"event"`
					*convload.Result
				}{"done", res})
			}
			return err
		},
	}
}
