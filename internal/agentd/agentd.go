// Package agentd is `mpdetour agent`, the daemon around the agent core
// (internal/agent): it reads the agent file (file.go: File is the YAML
// form, validated into Config), builds the detour sources from it (static
// detours, NAT grants from relays, optionally behind the path check,
// WireGuard or VXLAN tunnels, legacy v1 daemons), the converter's ticket
// router and the server role, hands the sources to the core
// (agent.RunLinux) and reloads on SIGHUP.
//
// What SIGHUP changes at once: the member key and certificate of the
// relays section (relays: key/key_file, certificate_file), rotated in place
// on every relay and then on its WireGuard tunnel (reload.go;
// docs/collective.md, "Key rotation"). Everything else in the file needs a
// restart; a SIGHUP never ends the agent, also not without relays.
package agentd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/legacyclient"
	"github.com/mpdetour/mpdetour/internal/pathcheck"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/serverrole"
	"github.com/mpdetour/mpdetour/internal/subflowcc"
	"github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
)

// Summary writes what `mpdetour agent --check` prints for a valid file.
func Summary(w io.Writer, path string, cfg Config) {
	relays := 0
	if cfg.Relays != nil {
		relays = len(cfg.Relays.Relays)
	}
	server := ""
	if cfg.Server != nil {
		server = fmt.Sprintf(", server role announcing %d addresses", len(cfg.Server.Announce))
	}
	a := cfg.Agent
	fmt.Fprintf(w, "%s: valid: policy %s, %d detour subflows per connection, %d static detours, %d relays%s, socket %s\n",
		path, a.Policy, a.Subflows, len(cfg.Detours), relays, server, a.Socket)
	if cfg.Relays != nil {
		for _, r := range cfg.Relays.Relays {
			fmt.Fprintf(w, "  relay %s at %s\n", r.Name, r.Addr)
		}
	}
	for _, l := range cfg.LegacyV1 {
		fmt.Fprintf(w, "  legacy v1 daemon %s at %s (unauthenticated), lease %s\n", l.Name, l.Addr, l.Lease)
	}
	lowat := "off"
	if cfg.SubflowLowat > 0 {
		lowat = fmt.Sprintf("%d bytes", cfg.SubflowLowat)
	}
	switch {
	case cfg.SubflowLowatDefault && cfg.SubflowLowat == 0:
		lowat += " (default without a client role)"
	case cfg.SubflowLowatDefault:
		lowat += " (default)"
	}

	if cfg.SubflowLowatScale == LowatScaleRTT {
		lowat += ", scaled to the subflows' RTTs (subflow_lowat_scale: rtt; the floor, up to the namespace's tcp_wmem maximum)"
	}
	fmt.Fprintf(w, "  subflow lowat %s\n", lowat)
	if cfg.SubflowPacing {
		fmt.Fprintf(w, "  subflow pacing on (TCP's own rate)\n")
	}
	if cfg.SubflowLowat > 0 || cfg.CwndClamp != nil || cfg.SubflowPacing {
		// Where the program's callbacks run: at the root, every
		// process's sockets (docs/agent.md "Cgroup").
		fmt.Fprintf(w, "  BPF sock_ops program attaches to %s\n", cgroupName(cfg.BPFCgroup))
	}
}

// Run is `mpdetour agent --config path` with cfg, the file as validated
// (and overridden by the command line): it builds the sources, runs the
// core until ctx ends and closes everything it opened. path is re-read on
// SIGHUP (the package comment says what changes).
func Run(ctx context.Context, path string, cfg Config) error {
	// SIGHUP is caught from here on, so that a reload (systemd's
	// ExecReload) never ends the agent: not while it starts, not without
	// relays.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.Agent.LogLevel}))
	opts := cfg.Agent
	// First: what follows removes what a crashed agent left (tunnels,
	// routes, clamps, sysctls), which must never be a running agent's.
	unlock, err := agent.Lock(opts)
	if err != nil {
		return err
	}
	defer unlock()
	sources := []detour.Source{static.New(cfg.Detours)}
	var relays *relayclient.NATSource
	var tunnels []*tunnelctl.TunnelSource
	if len(cfg.LegacyV1) > 0 {
		// Unauthenticated v1 daemons, opt-in (docs/agent.md).
		src, err := legacyclient.New(legacyclient.Config{Relays: cfg.LegacyV1, Lease: cfg.LegacyLease,
			ListenPacket: relayconn.ListenIn(opts.NetNS), Logger: log})
		if err != nil {
			return err
		}
		defer src.Close()
		sources = append(sources, src)
	}
	if cfg.Relays != nil {
		rc := *cfg.Relays
		rc.Options.ListenPacket = relayconn.ListenIn(opts.NetNS)
		rc.Options.Logger = log
		// Each relay's state for status, metrics and the log: from grants
		// and renewals, pings of silent relays, tunnel handshakes.
		var names []string
		for _, r := range rc.Relays {
			names = append(names, r.Name)
		}
		health := NewRelayHealth(RelayHealthConfig{Ping: cfg.RelayPing}, log, names...)
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
		opts.RelayStatus = health.Status
		if cfg.PathCheck {
			// NAT detours that strip MPTCP options are withheld.
			f := pathcheck.NewFilter(src, pathcheck.FilterConfig{Netns: opts.NetNS, Log: log})
			defer f.Close()
			sources = append(sources, f)
		} else {
			sources = append(sources, src)
		}
		if cfg.Convert != nil {
			stop, status, err := startConverterRouter(ctx, *cfg.Convert, src.Conns(), log)
			if err != nil {
				return err
			}
			defer stop()
			opts.ConvertStatus = status
		}
		if cfg.Tunnels && cfg.TunnelKind == "vxlan" {
			// Unencrypted kernel encapsulation, opted into by tunnel_kind (docs/tunnel.md).
			esrcs, err := tunnelctl.StartAllEncap(opts.NetNS, src.Conns(), log)
			if err != nil {
				return err
			}
			for _, t := range esrcs {
				defer t.Close()
				sources = append(sources, t)
			}
		} else if cfg.Tunnels {
			// Removes tunnels a crashed agent left, then one source per relay.
			tsrcs, err := tunnelctl.StartAll(opts.NetNS, src.Conns(), rc.PrivateKey, log)
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
		// Its event socket opens before the agent switches the namespace
		// to the userspace PM (docs/agent.md, Server role).
		stop, err := serverrole.Start(ctx, opts.NetNS, *cfg.Server, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if cfg.CwndClamp != nil || cfg.SubflowLowat > 0 || cfg.SubflowPacing {
		// One program for both mechanisms, detached at exit.
		// Only cwnd_clamp asks for RTT callbacks on every TCP socket of
		// the cgroup (its limits reach sockets that connected before
		// them); the lowat alone needs them on MPTCP subflows only.
		o := bpfclamp.Options{EverySocket: cfg.CwndClamp != nil}
		prog := openBPF(cfg.BPFCgroup, func(cg string) (clampMap, error) { return attachClamp(cg, opts.NetNS, o) })
		defer func() {
			if err := prog.close(); err != nil {
				log.Warn("BPF program", "err", err)
			}
		}()
		if cfg.CwndClamp != nil {
			cl := startClamps(*cfg.CwndClamp, sources, log, prog)
			opts.OnMeasured, opts.CwndClamp = cl.measured, cl.status
		}
		if cfg.SubflowLowat > 0 {
			var ceil uint32
			if cfg.SubflowLowatScale == LowatScaleRTT {
				ceil = lowatCeil(opts.NetNS, cfg.SubflowLowat, readWmem, log)
			}
			lw := startLowat(cfg.SubflowLowat, ceil, cfg.SubflowLowatDefault, prog, log)
			opts.OnSubflows, opts.SubflowLowat = lw.subflows, lw.status
			// Every probe round also looks for the kernel's refusal.
			if clamps := opts.OnMeasured; clamps != nil {
				opts.OnMeasured = func(ms []policy.Measurement) { clamps(ms); lw.measured(ms) }
			} else {
				opts.OnMeasured = lw.measured
			}
		}
		if cfg.SubflowPacing {
			wirePacing(&opts, prog, log)
		}
	}
	if cfg.SubflowCongestion != "" {
		// Routes with congctl toward detour destinations, removed at exit.
		cc := subflowcc.Open(opts.NetNS, cfg.SubflowCongestion, log)
		defer func() {
			if err := cc.Close(); err != nil {
				log.Warn("subflow congestion control routes not removed", "err", err)
			}
		}()
		opts.SubflowCC = cc
	}
	stop := reloadOnHangup(ctx, hup, path, relays, tunnels, log)
	defer stop()
	return agent.RunLinux(ctx, opts, log, nil, sources...)
}

// startConverterRouter keeps converter tickets in stock and answers
// "mpdetour run" on the conversion socket (docs/convert.md); status is the
// router's view for the agent's status.
func startConverterRouter(ctx context.Context, cs convclient.Settings, conns []*relayconn.Conn, log *slog.Logger) (stop func(), status func() any, err error) {
	var convs []convclient.Converter
	for _, c := range conns {
		name := c.Relay().Name
		// convert.relays may name an entry with both families (its two
		// sessions are both converters) or one of its sessions.
		if cs.Relays == nil || slices.Contains(cs.Relays, name) || slices.Contains(cs.Relays, c.Relay().Entry) {
			convs = append(convs, convclient.Converter{Name: name, Source: c})
		}
	}
	r := convclient.New(cs.Router, log.With("part", "convert"), convs...)
	l, err := convclient.Listen(cs.Socket)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { r.Run(ctx); done <- struct{}{} }()
	go func() { _ = r.Serve(l, cs.Users); done <- struct{}{} }()
	log.Info("serving conversions", "socket", cs.Socket, "converters", len(convs))
	return func() {
		cancel()
		l.Close()
		<-done
		<-done
		_ = os.Remove(cs.Socket)
	}, func() any { return r.Status() }, nil
}

// watchRelays runs health's pings and handshake checks until the returned
// stop is called.
func watchRelays(ctx context.Context, health *RelayHealth) (stop func()) {
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
func tunnelHandshake(t *tunnelctl.TunnelSource) HandshakeFunc {
	return func() (time.Time, bool, error) {
		cl := t.Client()
		if cl == nil {
			return time.Time{}, false, nil
		}
		last, err := cl.LastHandshake()
		return last, true, err
	}
}
