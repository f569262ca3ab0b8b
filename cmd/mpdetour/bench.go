package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// benchCommand builds the bench subcommand.
func benchCommand() *cli.Command {
	var (
		recvPort  int
		recvMPTCP bool
		recvBind  string

		sendDur    time.Duration
		sendWarm   time.Duration
		sendMPTCP  bool
		sendJSON   bool
		sendDown   bool
		sendCC     string
		sendNetnsP string

		latCount int
		latPause time.Duration
		latJSON  bool
	)
	return &cli.Command{
		Name:    "bench",
		Summary: "measure goodput (reference method) with per-subflow statistics",
		Sub: []*cli.Command{
			latencyCommand(&latCount, &latPause, &latJSON),
			convertLoadCommand(),
			{
				Name:    "recv",
				Summary: "receive bulk transfers and report goodput to each sender (serves clients until killed)",
				Usage:   "--port P [--mptcp] [--bind ADDR]",
				Flags: func(fs *flag.FlagSet) {
					fs.IntVar(&recvPort, "port", 5201, "TCP port to listen on")
					fs.BoolVar(&recvMPTCP, "mptcp", false, "listen with MPTCP (plain TCP clients are still served)")
					fs.StringVar(&recvBind, "bind", "", "local address to listen on (default all)")
				},
				Run: func(ctx context.Context, args []string) error {
					if len(args) > 0 {
						return cli.Usagef("recv takes no arguments, got %q", args[0])
					}
					if recvPort < 1 || recvPort > 65535 {
						return cli.Usagef("--port %d out of range 1-65535", recvPort)
					}
					log := slog.New(slog.NewTextHandler(cli.Stderr, nil))
					s, err := benchtool.Listen(benchtool.ServeOptions{
						Addr: joinHostPort(recvBind, recvPort), MPTCP: recvMPTCP, Log: log,
					})
					if err != nil {
						return err
					}
					log.Info("listening", "addr", s.Addr().String(), "mptcp", s.MPTCP())
					return s.Serve(ctx)
				},
			},
			{
				Name:         "send",
				Summary:      "send a bulk transfer to a bench receiver and print its goodput",
				Usage:        "HOST:PORT [--duration 10s] [--mptcp] [--download] [--json] [--cc cubic]",
				Interspersed: true,
				Flags: func(fs *flag.FlagSet) {
					fs.DurationVar(&sendDur, "duration", 10*time.Second, "how long to send")
					fs.DurationVar(&sendWarm, "warmup", benchtool.DefaultWarmup, "start of the goodput window (reference method: 1s)")
					fs.BoolVar(&sendMPTCP, "mptcp", false, "use MPTCP (fallback to TCP is reported)")
					fs.BoolVar(&sendJSON, "json", false, "print the full result as JSON")
					fs.BoolVar(&sendDown, "download", false, "the receiver sends for --duration and this side counts (goodput, stalls, bytes per subflow received)")
					fs.StringVar(&sendCC, "cc", benchtool.DefaultCC, "congestion control for the socket")
					fs.StringVar(&sendNetnsP, "netns", "", "network namespace path to send from (e.g. /run/netns/X)")
				},
				Run: func(ctx context.Context, args []string) error {
					if len(args) != 1 {
						return cli.Usagef("send needs exactly one HOST:PORT")
					}
					if sendDur <= sendWarm {
						return cli.Usagef("--duration %v must be longer than --warmup %v", sendDur, sendWarm)
					}
					r, err := benchtool.Send(ctx, benchtool.SendOptions{
						Addr: args[0], Duration: sendDur, Warmup: sendWarm,
						MPTCP: sendMPTCP, CC: sendCC, Netns: sendNetnsP, Download: sendDown,
					})
					if err != nil {
						return err
					}
					if sendJSON {
						return printJSON(r)
					}
					printResult(r)
					return nil
				},
			},
		},
	}
}

// latencyCommand measures setup latency (connect() to first byte) against
// the lab's latency responder.
func latencyCommand(count *int, pause *time.Duration, asJSON *bool) *cli.Command {
	return &cli.Command{
		Name:         "latency",
		Summary:      "measure connect() to first byte against a latency responder (plain TCP sockets, as an unmodified program)",
		Usage:        "HOST:PORT [--count N] [--pause D] [--json]",
		Interspersed: true,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(count, "count", 5, "connections, one after the other")
			fs.DurationVar(pause, "pause", 50*time.Millisecond, "pause between connections")
			fs.BoolVar(asJSON, "json", false, "print the times in ms as a JSON array")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("latency needs exactly one HOST:PORT")
			}
			if *count < 1 || *count > 10000 {
				return cli.Usagef("--count %d out of range 1-10000", *count)
			}
			ds, err := benchtool.Latency(ctx, args[0], *count, *pause)
			if err != nil {
				return err
			}
			ms := make([]float64, len(ds))
			for i, d := range ds {
				ms[i] = float64(d.Microseconds()) / 1000
			}
			if *asJSON {
				return printJSON(ms)
			}
			for _, v := range ms {
				fmt.Printf("%.3f ms\n", v)
			}
			return nil
		},
	}
}

func joinHostPort(host string, port int) string {
	if host == "" {
		return fmt.Sprintf(":%d", port)
	}
	return fmt.Sprintf("[%s]:%d", host, port)
}

func printResult(r *benchtool.Result) {
	proto := "TCP"
	if r.MPTCP {
		proto = "MPTCP"
	} else if r.Fallback {
		proto = "TCP (MPTCP requested, fell back)"
	}
	fmt.Printf("%s to %s, congestion control %s\n", proto, r.Addr, r.CongestionControl)
	for _, s := range r.Samples {
		fmt.Printf("  %5.1f-%5.1f s  %10d bytes  %8.2f Mbit/s\n", s.Start, s.Start+s.Seconds, s.Bytes, s.Mbps)
	}
	for _, s := range r.Subflows {
		fmt.Printf("  subflow %d %v -> %v: %d bytes acked (%d in window), rtt %.1f ms (min %.1f), %d retransmits\n",
			s.ID, s.Local, s.Remote, s.BytesAcked, s.WindowBytesAcked, s.RTT, s.MinRTT, s.Retransmits)
	}
	fmt.Printf("goodput %.2f Mbit/s (%d bytes from t=%gs over %.3f s)\n", r.Goodput, r.WindowBytes, r.Warmup, r.WindowSeconds)
}

// convertLoadCommand is the load generator of "lab convert-load" (issue
// 14): a member taking converter tickets from a relay and opening
// conversions (idle hold, or a rate). Its results are JSON lines on stdout:
// {"event":"open",...} once the idle conversions are open (the hold then
// lasts until stdin closes or --hold elapses), {"event":"done",...} at the end.
func convertLoadCommand() *cli.Command {
	var (
		relayAddr, relayKey, keyFile, dst string
		o                                 benchtool.ConvertLoadOptions
	)
	return &cli.Command{
		Name:    "convert-load",
		Summary: "internal (lab convert-load): open converter conversions, idle or at a rate, and report JSON lines",
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
				return cli.Usagef("convert-load takes no arguments, got %q", args[0])
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
			o.Opened = func(r benchtool.ConvertLoadResult) {
				_ = out.Encode(struct {
					Event string `json:"event"`
					benchtool.ConvertLoadResult
				}{"open", r})
			}
			res, err := benchtool.ConvertLoad(ctx, o)
			if res != nil {
				_ = out.Encode(struct {
					Event string `json:"event"`
					*benchtool.ConvertLoadResult
				}{"done", res})
			}
			return err
		},
	}
}
