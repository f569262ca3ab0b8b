// Package relay is the detour host daemon: it authenticates members over the
// control protocol (internal/proto), applies policy, quotas and rate limits,
// and grants NAT mappings (client address, detour port) -> (server, port)
// as elements of nftables maps in one table it owns (see nft.go), with
// leases, per-mapping counters and an attribution log.
//
// Tunnel detours plug in through the TunnelFactory the caller passes.
package relay

import (
	"context"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// TableName is the nftables table the relay owns (internal/relay/dataplane).
const TableName = dataplane.TableName

// Run is `mpdetour relay`: it serves until ctx ends (SIGTERM/SIGINT), then
// removes everything it installed. SIGHUP reloads the configuration file
// without dropping mappings; a file that does not validate is ignored with an
// error in the log.
func Run(ctx context.Context, path string, log *slog.Logger, tunnels TunnelFactory) error {
	set, err := LoadConfig(path)
	if err != nil {
		return err
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil && strings.TrimSpace(string(b)) != "1" {
		log.Warn("net.ipv4.ip_forward is off in this namespace: mappings will not forward")
	}
	srv, err := NewServer(set, log, tunnels)
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
