package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/legacyclient"
	"github.com/mpdetour/mpdetour/internal/pathcheck"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/serverrole"
	"github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
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
			cfg, err := agent.LoadConfig(config)
			if err != nil {
				return err
			}
			if check {
				relays := 0
				if cfg.Relays != nil {
					relays = len(cfg.Relays.Relays)
				}
				server := ""
				if cfg.Server != nil {
					server = fmt.Sprintf(", server role announcing %d addresses", len(cfg.Server.Announce))
				}
				fmt.Printf("%s: valid: policy %s, %d detour subflows per connection, %d static detours, %d relays%s, socket %s\n",
					config, cfg.Policy, cfg.Subflows, len(cfg.Detours), relays, server, cfg.Socket)
				if cfg.Relays != nil {
					for _, r := range cfg.Relays.Relays {
						fmt.Printf("  relay %s at %s\n", r.Name, r.Addr)
					}
				}
				for _, l := range cfg.LegacyV1 {
					fmt.Printf("  legacy v1 daemon %s at %s (unauthenticated), lease %s\n", l.Name, l.Addr, l.Lease)
				}
				return nil
			}
			// SIGHUP rotates the member key (rotateOnHangup). It is caught
			// from here on, so that a reload (systemd's ExecReload) never
			// ends the agent: not while it starts, not without relays.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			if netns != "" {
				cfg.NetNS = netns
			}
			if socket != "" {
				cfg.Socket = socket
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
			var sources []detour.Source
			var relays *relayclient.Source
			var tunnels []*tunnelctl.Source
			if len(cfg.LegacyV1) > 0 {
				// Unauthenticated v1 daemons, opt-in (docs/agent.md).
				src, err := legacyclient.New(legacyclient.Config{Relays: cfg.LegacyV1, Lease: cfg.LegacyLease,
					ListenPacket: relayclient.ListenIn(cfg.NetNS), Logger: log})
				if err != nil {
					return err
				}
				defer src.Close()
				sources = append(sources, src)
			}
			if cfg.Relays != nil {
				rc := *cfg.Relays
				rc.Options.ListenPacket = relayclient.ListenIn(cfg.NetNS)
				rc.Options.Logger = log
				// Each relay's state for status, metrics and the log:
				// from grants and renewals, pings of silent relays,
				// tunnel handshakes.
				var names []string
				for _, r := range rc.Relays {
					names = append(names, r.Name)
				}
				health := agent.NewRelayHealth(agent.RelayHealthConfig{Ping: cfg.RelayPing}, log, names...)
				rc.Observe = health.Observe
				src, err := relayclient.NewSource(rc)
				if err != nil {
					return err
				}
				defer src.Close()
				relays = src
				for _, c := range src.Conns() {
					health.SetPinger(c.Relay().Name, c)
				}
				defer watchRelays(ctx, health)()
				cfg.RelayStatus = health.Status
				if cfg.PathCheck {
					// NAT detours that strip MPTCP options are withheld.
					f := pathcheck.NewFilter(src, pathcheck.FilterConfig{Netns: cfg.NetNS, Log: log})
					defer f.Close()
					sources = append(sources, f)
				} else {
					sources = append(sources, src)
				}
				if cfg.Convert != nil {
					stop, err := startConverterRouter(ctx, &cfg, src.Conns(), log)
					if err != nil {
						return err
					}
					defer stop()
				}
				if cfg.Tunnels && cfg.TunnelKind == "vxlan" {
					// Unencrypted kernel encapsulation, opted into by tunnel_kind (docs/tunnel.md).
					esrcs, err := tunnelctl.StartAllEncap(cfg.NetNS, src.Conns(), log)
					if err != nil {
						return err
					}
					for _, t := range esrcs {
						defer t.Close()
						sources = append(sources, t)
					}
				} else if cfg.Tunnels {
					// Removes tunnels a crashed agent left, then one source per relay.
					tsrcs, err := tunnelctl.StartAll(cfg.NetNS, src.Conns(), rc.PrivateKey, log)
					if err != nil {
						return err
					}
					for _, t := range tsrcs {
						defer t.Close()
						sources = append(sources, t)
						health.SetTunnel(t.Conn().Relay().Name, tunnelHandshake(t))
					}
					tunnels = tsrcs
				}
			}
			if cfg.Server != nil {
				// Its event socket opens before the agent switches the
				// namespace to the userspace PM (docs/agent.md, Server role).
				stop, err := serverrole.Start(ctx, cfg.NetNS, *cfg.Server, log)
				if err != nil {
					return err
				}
				defer stop()
			}
			stop := rotateOnHangup(ctx, hup, config, relays, tunnels, log)
			defer stop()
			return agent.RunLinux(ctx, cfg, log, nil, sources...)
		},
	}
}

// rotateOnHangup: on SIGHUP the agent re-reads its configuration file's
// member key and certificate (relays: key/key_file, certificate_file) and,
// when they changed, rotates them in place on every relay
// (relayclient.Source.Rotate: each relay carries the old key's detours over
// to the new key) and then on that relay's WireGuard tunnel. Nothing else
// of the file is applied (docs/collective.md, "Key rotation").
//
// hup is already registered for SIGHUP (signal.Notify) by the caller.
// Without relays (nil) a SIGHUP is logged and changes nothing.
func rotateOnHangup(ctx context.Context, hup <-chan os.Signal, path string, relays *relayclient.Source, tunnels []*tunnelctl.Source, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			if relays == nil {
				log.Info("SIGHUP: no relays section, no member key to rotate (the agent reloads nothing else)")
				continue
			}
			if err := rotateMemberKey(ctx, path, relays, tunnels, log); err != nil {
				log.Error("SIGHUP: member key rotation", "err", err)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// rotateMemberKey applies the key and certificate of the configuration
// file at path.
func rotateMemberKey(ctx context.Context, path string, relays *relayclient.Source, tunnels []*tunnelctl.Source, log *slog.Logger) error {
	cfg, err := agent.LoadConfig(path)
	if err != nil {
		return fmt.Errorf("configuration not reloaded: %w", err)
	}
	if cfg.Relays == nil {
		return errors.New("the configuration has no relays section any more; keeping the running key")
	}
	followRelayKeys(cfg.Relays.Relays, relays.Conns(), log)
	key, cert := cfg.Relays.PrivateKey, cfg.Relays.Options.Certificate
	old := relays.Key()
	if key == old {
		relays.SetCertificate(cert)
		log.Info("SIGHUP: member key unchanged (certificate re-read; the agent reloads nothing else)", "key", key.Public().ID())
		return nil
	}
	log.Info("SIGHUP: rotating the member key on every relay (the agent reloads nothing else)", "old_key", old.Public().ID(), "new_key", key.Public().ID())
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	err = relays.Rotate(rctx, key, cert, func(c *relayclient.Conn, err error) {
		for _, t := range tunnels {
			if t.Conn() != c {
				continue
			}
			if c.SessionKey() != key.Public() || c.ConfirmedKey() != key.Public() {
				// The relay still knows us by the old key (say, it refused
				// the new certificate) or refused the rotation (say,
				// name-mismatch): its WireGuard peer keeps the old key.
				// The tunnel follows once the relay confirms a rotation
				// (tunnelctl.Source.follow).
				log.Warn("key rotation: tunnel keeps the old key until the relay confirms the rotation", "relay", c.Relay().Name, "err", err)
				continue
			}
			if terr := t.Rekey(key); terr != nil {
				log.Error("key rotation: tunnel", "relay", c.Relay().Name, "err", terr)
			}
		}
	})
	if err != nil {
		return err
	}
	log.Info("member key rotated: every relay carried the detours over", "new_key", key.Public().ID(), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// startConverterRouter keeps converter tickets in stock and answers
// "mpdetour run" on the conversion socket (docs/convert.md).
func startConverterRouter(ctx context.Context, cfg *agent.Config, conns []*relayclient.Conn, log *slog.Logger) (stop func(), err error) {
	var convs []convclient.Converter
	for _, c := range conns {
		name := c.Relay().Name
		if cfg.Convert.Relays == nil || slices.Contains(cfg.Convert.Relays, name) {
			convs = append(convs, convclient.Converter{Name: name, Source: c})
		}
	}
	r := convclient.New(cfg.Convert.Router, log.With("part", "convert"), convs...)
	l, err := convclient.Listen(cfg.Convert.Socket)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { r.Run(ctx); done <- struct{}{} }()
	go func() { _ = r.Serve(l, cfg.Convert.Users); done <- struct{}{} }()
	cfg.ConvertStatus = r.Status
	log.Info("serving conversions", "socket", cfg.Convert.Socket, "converters", len(convs))
	return func() {
		cancel()
		l.Close()
		<-done
		<-done
		_ = os.Remove(cfg.Convert.Socket)
	}, nil
}

// watchRelays runs health's pings and handshake checks until the returned
// stop is called.
func watchRelays(ctx context.Context, health *agent.RelayHealth) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		health.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// tunnelHandshake reads a WireGuard tunnel detour's last handshake.
func tunnelHandshake(t *tunnelctl.Source) agent.HandshakeFunc {
	return func() (time.Time, bool, error) {
		cl := t.Client()
		if cl == nil {
			return time.Time{}, false, nil
		}
		last, err := cl.LastHandshake()
		return last, true, err
	}
}
