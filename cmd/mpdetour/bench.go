package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/cli"
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
	fmt.Printf("goodput over t=%g-%gs %.2f Mbit/s (%d bytes)\n", r.Warmup, r.Duration, r.EqualGoodput, r.EqualBytes)
}
