// Command twbench runs one end of an mpdetour tunnel (internal/tunnel) in
// its own process, as `mpdetour relay` and `mpdetour agent` would, so that
// scripts/bench-tunnel*.sh can measure the embedded WireGuard's goodput and,
// from each process's CPU time, its cost. Start it under `ip netns exec`.
//
//	twbench relay -key PRIV -peer PUB [-subnet P] [-port N]
//	    prints "address <client prefix>", "key <relay public key>", "ready"
//	twbench client -key PRIV -address PREFIX -relay-key PUB -endpoint ADDR:PORT
//	    prints "ready" once the tunnel is configured
//
// Both run until SIGTERM and then remove what they created.
package main

import (
	"errors"
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
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "twbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 || (args[0] != "relay" && args[0] != "client") {
		return errors.New("usage: twbench relay|client [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	key := fs.String("key", "", "own private key (base64)")
	peer := fs.String("peer", "", "relay: the client's public key")
	subnet := fs.String("subnet", "100.80.0.0/16", "relay: tunnel subnet")
	port := fs.Int("port", 51820, "relay: WireGuard port")
	address := fs.String("address", "", "client: tunnel address (prefix)")
	relayKey := fs.String("relay-key", "", "client: relay public key")
	endpoint := fs.String("endpoint", "", "client: relay endpoint addr:port")
	backend := fs.String("backend", "", "kernel, embedded or empty for auto")
	mtu := fs.Int("mtu", 0, "tunnel MTU (0 = 1420)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	priv, err := wgtypes.ParseKey(*key)
	if err != nil {
		return fmt.Errorf("-key: %w", err)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var closer interface{ Close() error }
	switch args[0] {
	case "relay":
		pub, err := wgtypes.ParseKey(*peer)
		if err != nil {
			return fmt.Errorf("-peer: %w", err)
		}
		sn, err := netip.ParsePrefix(*subnet)
		if err != nil {
			return fmt.Errorf("-subnet: %w", err)
		}
		srv, err := tunnel.NewServer(tunnel.ServerConfig{Subnet: sn, ListenPort: *port, PrivateKey: priv, MTU: *mtu,
			Backend: tunnel.Backend(*backend), Logger: log})
		if err != nil {
			return err
		}
		closer = srv
		a, err := srv.AddPeer(pub)
		if err != nil {
			srv.Close()
			return err
		}
		fmt.Printf("address %s\nkey %s\nbackend %s\n", a, srv.PublicKey(), srv.Backend())
	case "client":
		a, err := netip.ParsePrefix(*address)
		if err != nil {
			return fmt.Errorf("-address: %w", err)
		}
		rk, err := wgtypes.ParseKey(*relayKey)
		if err != nil {
			return fmt.Errorf("-relay-key: %w", err)
		}
		ep, err := netip.ParseAddrPort(*endpoint)
		if err != nil {
			return fmt.Errorf("-endpoint: %w", err)
		}
		c, err := tunnel.NewClient(tunnel.ClientConfig{Relay: "bench", PrivateKey: priv,
			Allocation: tunnel.Allocation{Address: a, Endpoint: ep, RelayKey: rk, MTU: *mtu}, Backend: tunnel.Backend(*backend), Logger: log})
		if err != nil {
			return err
		}
		closer = c
		fmt.Printf("backend %s\n", c.Backend())
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return closer.Close()
}
