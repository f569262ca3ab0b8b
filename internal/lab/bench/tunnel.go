package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/tunnel"
	"github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
)

func setupTCPTunnel(ctx context.Context, env *Env) (Session, error) {
	ts, err := openTunnels(ctx, env)
	if err != nil {
		return nil, err
	}
	// Plain TCP has no say in its source address: route the server
	// into the tunnel for this cell, as the OpenVPN baseline did.
	c := ts.clients[0]
	src := c.Address()
	if env.IPv6 {
		if src = c.Address6(); !src.IsValid() {
			ts.close()
			return nil, errors.New("the tunnel carries no IPv6: no IPv6 tunnel address was granted or configured")
		}
	}
	undo, err := routeVia(env, env.serverAddr().Addr(), c.Iface(), src, netip.Addr{})
	if err != nil {
		ts.close()
		return nil, err
	}
	return &transfer{env: env, dst: env.serverAddr(), paths: ts.paths, daemons: ts.rs.daemons,
		close: func() error { return errors.Join(undo(), ts.close()) }}, nil
}

func setupMPTCPTunnel(ctx context.Context, env *Env) (Session, error) {
	// The product path: the agent asks each relay for a tunnel
	// (`tunnels: true`) and brings it up itself. The relays refuse NAT
	// grants to the server here, so only tunnel subflows are added.
	rs, err := startRelays(ctx, env, tunnelOnly)
	if err != nil {
		return nil, err
	}
	extra := "tunnels: true\n" + scenario.AgentExtra(env.Cell.Procedure)
	ag, err := startAgent(ctx, env, env.Cell.K(), nil, rs.agentSection(env, false)+extra)
	if err != nil {
		rs.close()
		return nil, err
	}
	t := &transfer{env: env, dst: env.serverAddr(), mptcp: true, wantSubflows: 1 + min(env.Cell.K(), len(env.Cell.Detours)),
		paths: rs.paths, prefixes: rs.prefixes, daemons: append([]*daemon{ag}, rs.daemons...),
		close: func() error { return errors.Join(ag.stop(), rs.close()) }}
	if err := t.warmUp(ctx, 20*time.Second); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// tunnels are WireGuard tunnel detours from the client node, one per
// detour node of the cell, each obtained from that node's relay.
type tunnels struct {
	rs      *relays
	clients []*tunnel.Client
	conns   []*relayconn.Conn // control channels the tunnels refresh through
	paths   map[netip.Addr]string
}

func openTunnels(ctx context.Context, env *Env) (_ *tunnels, err error) {
	rs, err := startRelays(ctx, env, natTunnel)
	if err != nil {
		return nil, err
	}
	ts := &tunnels{rs: rs, paths: map[netip.Addr]string{}}
	defer func() {
		if err != nil {
			ts.close()
		}
	}()
	for i, node := range env.Cell.Detours {
		conn, err := rs.conn(env, node)
		if err != nil {
			return nil, err
		}
		// The relay may still be starting; the request is retransmitted.
		octx, cancel := context.WithTimeout(ctx, 15*time.Second)
		c, err := tunnelctl.Open(octx, conn, tunnel.ClientConfig{
			Netns:      env.Lab.NetnsPath(env.Roles.Client),
			Index:      i,
			PrivateKey: wgtypes.Key(rs.member),
			Logger:     slog.New(slog.DiscardHandler),
		})
		cancel()
		if err != nil {
			conn.Close()
			if d := rs.daemon(node); d != nil {
				return nil, fmt.Errorf("tunnel from relay %s: %w (relay log: %s)", node, err, d.tail())
			}
			return nil, err
		}
		ts.clients = append(ts.clients, c)
		ts.paths[c.Address()] = "tunnel:" + node
		if a6 := c.Address6(); a6.IsValid() {
			ts.paths[a6] = "tunnel:" + node
		}
		ts.conns = append(ts.conns, conn)
		if err := waitHandshake(ctx, c); err != nil {
			return nil, fmt.Errorf("tunnel to %s: %w", node, err)
		}
	}
	return ts, nil
}

// waitHandshake pings through the tunnel's first handshake: a subflow
// created before it would wait out TCP's SYN retransmission timer.
func waitHandshake(ctx context.Context, c *tunnel.Client) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if t, err := c.LastHandshake(); err == nil && !t.IsZero() {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("no WireGuard handshake within 10 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (ts *tunnels) close() error {
	var errs []error
	for _, c := range ts.clients {
		errs = append(errs, c.Close())
	}
	ts.clients = nil
	for _, c := range ts.conns {
		c.Close()
	}
	ts.conns = nil
	return errors.Join(append(errs, ts.rs.close())...)
}

// routeVia adds dst/32 (an IPv6 dst: /128) via iface with source src in the client node's
// main table and returns the undo.
//
// gw (optional) is the next hop on iface: an Ethernet-like tunnel (VXLAN)
// needs it for IPv6, whose connect() does not look the route up again
// with the chosen source (so the tunnel table's rule never applies, and a
// route without gateway resolves the server itself on the tunnel device).
func routeVia(env *Env, dst netip.Addr, iface string, src, gw netip.Addr) (func() error, error) {
	ns, err := netns.GetFromPath(env.Lab.NetnsPath(env.Roles.Client))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	link, err := h.LinkByName(iface)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("tunnel interface %s: %w", iface, err)
	}
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(dst.BitLen(), dst.BitLen())},
		Src:       src.AsSlice(),
	}
	if gw.IsValid() {
		r.Gw, r.Flags = gw.AsSlice(), int(netlink.FLAG_ONLINK)
	}
	if err := h.RouteAdd(r); err != nil {
		h.Close()
		return nil, fmt.Errorf("route %s via %s: %w", dst, iface, err)
	}
	return func() error {
		defer h.Close()
		return h.RouteDel(r)
	}, nil
}
