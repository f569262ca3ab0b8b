// Package relayd is `mpdetour relay`, the daemon around the relay core
// (internal/relay): it reads the configuration file (file.go: File is the
// YAML form, validated into relay.Config), opens the parts the core runs on (the namespace lock, the control and legacy sockets, the
// nftables data plane, tunnel detours) in a safe order, builds the core
// and serves it, and reloads the file on SIGHUP.
//
// What SIGHUP changes at once: members, keys (relay key rotation),
// destinations, quotas, rate limits, leases, the collective's authority and
// crl_file, fair-share capacity and receipts, the attribution log. What
// needs a restart (the running value stays, with a warning in the log):
// listen, legacy_v1, fast_path, state_file, metrics, the tunnel and convert
// sections, fair_share.ledger_file, and collective.gossip unless the relay
// key changes (docs/relay.md, "Exit").
package relayd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
)

// Run is `mpdetour relay --config path`: it serves until ctx ends
// (SIGTERM/SIGINT), then removes everything it installed. SIGHUP reloads
// the file without dropping mappings; a file that does not validate is
// ignored with an error in the log. tunnels builds tunnel detours from the
// file's `tunnel:` section (nil: a file with one is refused).
func Run(ctx context.Context, path string, log *slog.Logger, tunnels relay.TunnelFactory) error {
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil && strings.TrimSpace(string(b)) != "1" {
		log.Warn("net.ipv4.ip_forward is off in this namespace: mappings will not forward")
	}
	if cfg.Listen6.IsValid() {
		if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/forwarding"); err == nil && strings.TrimSpace(string(b)) != "1" {
			log.Warn("net.ipv6.conf.all.forwarding is off in this namespace: IPv6 mappings will not forward")
		}
	}
	srv, err := Start(cfg, log, tunnels)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				ns, err := LoadConfig(path)
				if err != nil {
					log.Error("reload refused, keeping the running configuration", "err", err)
					continue
				}
				srv.Reload(ns)
			}
		}
	}()
	return srv.Serve(ctx)
}

// Start opens the relay's parts for cfg and builds the relay: the
// namespace lock first (a second relay must not replace the first one's
// table), then the tunnel detours, the sockets and the data plane (which
// removes a table an earlier run left). On error everything opened is
// closed again. The caller runs Serve, which closes them.
func Start(cfg *relay.Config, log *slog.Logger, tunnels relay.TunnelFactory) (_ *relay.Server, err error) {
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	d := relay.Deps{Log: log}
	if d.Status, err = relay.Lock(); err != nil {
		return nil, err
	}
	closers = append(closers, func() { d.Status.Close() })
	if d.Tunnels, err = relay.NewTunnels(tunnels, cfg.Tunnel, cfg.PrivateKey,
		destination.Policy{Allow: cfg.Allow, Deny: cfg.Deny, DenyPorts: cfg.DenyPorts}, log); err != nil {
		return nil, err
	}
	if d.Tunnels != nil {
		closers = append(closers, func() { _ = d.Tunnels.Close() })
	}
	if d.PacketConn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(cfg.Listen)); err != nil {
		return nil, fmt.Errorf("listen %v: %w", cfg.Listen, err)
	}
	closers = append(closers, func() { d.PacketConn.Close() })
	if cfg.Listen6.IsValid() {
		// "udp6": an IPv6-only socket (IPV6_V6ONLY), beside the IPv4 one.
		if d.PacketConn6, err = net.ListenUDP("udp6", net.UDPAddrFromAddrPort(cfg.Listen6)); err != nil {
			return nil, fmt.Errorf("listen6 %v: %w", cfg.Listen6, err)
		}
		closers = append(closers, func() { d.PacketConn6.Close() })
	}
	if cfg.ReceiveBuffer > 0 {
		for _, c := range []*net.UDPConn{d.PacketConn, d.PacketConn6} {
			if c == nil {
				continue
			}
			got, err := setReceiveBuffer(c, cfg.ReceiveBuffer)
			if err != nil {
				return nil, fmt.Errorf("control socket %v: %w", c.LocalAddr(), err)
			}
			if got < cfg.ReceiveBuffer {
				// SO_RCVBUF without CAP_NET_ADMIN: net.core.rmem_max caps it.
				log.Warn("control socket: receive buffer smaller than receive_buffer (no CAP_NET_ADMIN? net.core.rmem_max caps it)",
					"socket", c.LocalAddr(), "receive_buffer", cfg.ReceiveBuffer, "kernel_bytes", got)
			} else {
				log.Debug("control socket receive buffer", "socket", c.LocalAddr(), "receive_buffer", cfg.ReceiveBuffer, "kernel_bytes", got)
			}
		}
	}
	if cfg.Legacy {
		if d.Legacy, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(cfg.LegacyListen)); err != nil {
			return nil, fmt.Errorf("legacy v1 listen %v: %w", cfg.LegacyListen, err)
		}
		closers = append(closers, func() { d.Legacy.Close() })
	}
	if d.DataPlane, err = dataplane.NewNFT(dataplane.Options{FastPath: cfg.FastPath, Log: log}); err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = d.DataPlane.Close() })
	return relay.New(cfg.Static, &cfg.Reloadable, d)
}
