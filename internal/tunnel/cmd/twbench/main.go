// Command twbench brings up one mpdetour tunnel (relay-side Server in one
// namespace, Client in another) inside a single process and keeps it up
// until SIGTERM, so scripts/bench-tunnel.sh can measure the embedded
// WireGuard's goodput and, from this process's CPU time, its cost. It
// prints "addr <client tunnel address>" and "ready" once the tunnel is up.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/tunnel"
)

func main() {
	relayNS := flag.String("relay-ns", "", "namespace of the relay side")
	clientNS := flag.String("client-ns", "", "namespace of the client side")
	relayAddr := flag.String("relay-addr", "", "relay address the client reaches (WireGuard endpoint)")
	subnet := flag.String("subnet", "100.80.0.0/16", "tunnel subnet")
	port := flag.Int("port", 51820, "relay WireGuard port")
	backend := flag.String("backend", "", "kernel, embedded or empty for auto")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the tunnel's lifetime to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "twbench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "twbench:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if err := run(*relayNS, *clientNS, *relayAddr, *subnet, *port, tunnel.Backend(*backend)); err != nil {
		fmt.Fprintln(os.Stderr, "twbench:", err)
		os.Exit(1)
	}
}

func run(relayNS, clientNS, relayAddr, subnet string, port int, backend tunnel.Backend) error {
	if relayNS == "" || clientNS == "" {
		return fmt.Errorf("-relay-ns and -client-ns are required")
	}
	ra, err := netip.ParseAddr(relayAddr)
	if err != nil {
		return fmt.Errorf("-relay-addr: %w", err)
	}
	sn, err := netip.ParsePrefix(subnet)
	if err != nil {
		return fmt.Errorf("-subnet: %w", err)
	}
	rk, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return err
	}
	ck, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Netns: relayNS, Subnet: sn, ListenPort: port,
		PrivateKey: rk, Backend: backend, Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	a, err := srv.Offer(ck.PublicKey(), ra)
	if err != nil {
		return err
	}
	c, err := tunnel.NewClient(tunnel.ClientConfig{Netns: clientNS, Relay: "bench", PrivateKey: ck,
		Allocation: a, Backend: backend, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("addr %s\nbackend %s\nready\n", c.Address(), c.Backend())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}
