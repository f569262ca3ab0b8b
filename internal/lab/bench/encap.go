package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/tunnel"
	"github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
)

// setupTCPEncap: plain TCP through the unencrypted VXLAN tunnel kind
// (relays with tunnel.kinds [wireguard, vxlan]), the server routed into it
// for the cell as tcp-tunnel does. As tcp-encap6 (IPv6) the relays have a
// vxlan subnet6 and the connection runs from the inner IPv6 address.
func setupTCPEncap(ctx context.Context, env *Env) (_ Session, err error) {
	rs, err := startRelays(ctx, env, natEncap)
	if err != nil {
		return nil, err
	}
	var clients []*tunnel.EncapClient
	var conns []*relayconn.Conn
	closeAll := func() error {
		var errs []error
		for _, c := range clients {
			errs = append(errs, c.Close())
		}
		for _, c := range conns {
			c.Close()
		}
		return errors.Join(append(errs, rs.close())...)
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	paths := map[netip.Addr]string{}
	for i, node := range env.Cell.Detours {
		conn, err := rs.conn(env, node)
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn)
		// The relay may still be starting; the request is retransmitted.
		octx, cancel := context.WithTimeout(ctx, 15*time.Second)
		c, err := tunnelctl.OpenEncap(octx, conn, tunnel.EncapClientConfig{
			Netns: env.Lab.NetnsPath(env.Roles.Client), Index: i, Logger: slog.New(slog.DiscardHandler),
		})
		cancel()
		if err != nil {
			if d := rs.daemon(node); d != nil {
				return nil, fmt.Errorf("vxlan tunnel from relay %s: %w (relay log: %s)", node, err, d.tail())
			}
			return nil, err
		}
		clients = append(clients, c)
		paths[c.Address()] = "vxlan:" + node
		if a6 := c.Address6(); a6.IsValid() {
			paths[a6] = "vxlan:" + node
		}
	}
	c := clients[0]
	src, gw := c.Address(), netip.Addr{}
	if env.IPv6 {
		if src, gw = c.Address6(), c.Gateway6(); !src.IsValid() {
			return nil, errors.New("the vxlan tunnel carries no IPv6: no inner IPv6 address was granted or configured")
		}
	}
	undo, err := routeVia(env, env.serverAddr().Addr(), c.Iface(), src, gw)
	if err != nil {
		return nil, err
	}
	return &transfer{env: env, dst: env.serverAddr(), paths: paths, daemons: rs.daemons,
		close: func() error { return errors.Join(undo(), closeAll()) }}, nil
}

// setupMPTCPEncap: the product path with the VXLAN kind: the agent asks
// each relay for one (`tunnels: true`, `tunnel_kind: vxlan`); NAT grants to
// the server are refused, so only tunnel subflows are added.
func setupMPTCPEncap(ctx context.Context, env *Env) (Session, error) {
	rs, err := startRelays(ctx, env, encapOnly)
	if err != nil {
		return nil, err
	}
	ag, err := startAgent(ctx, env, env.Cell.K(), nil, rs.agentSection(env, false)+"tunnels: true\ntunnel_kind: vxlan\n")
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
