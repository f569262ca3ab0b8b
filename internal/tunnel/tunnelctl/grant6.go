package tunnelctl

import (
	"context"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// askTunnel asks conn's relay for a tunnel with an IPv6 tunnel address as
// well (granted when the relay's tunnel section has subnet6; the client
// then carries IPv6 through the tunnel too, tunnel/client6.go). A relay
// older than that request answers malformed: then it is asked the IPv4
// way.
func askTunnel(ctx context.Context, conn *relayconn.Conn) (proto.TunnelGrant, error) {
	g, _, err := conn.TunnelIPv6(ctx)
	if proto.ReasonOf(err) == proto.ReasonMalformed {
		g, _, err = conn.Tunnel(ctx)
	}
	return g, err
}

// askEncap asks conn's relay for a VXLAN tunnel with an IPv6 inside as
// well (granted when the relay's vxlan section has subnet6). A relay older
// than that request answers malformed: then it is asked the IPv4 way.
func askEncap(ctx context.Context, conn encapAsker) (proto.EncapGrant, time.Duration, error) {
	g, lease, err := conn.EncapIPv6(ctx)
	if proto.ReasonOf(err) == proto.ReasonMalformed {
		g, lease, err = conn.Encap(ctx)
	}
	return g, lease, err
}

// encapAsker is the part of *relayconn.Conn askEncap uses (a fake relay in
// its test answers as an old one does).
type encapAsker interface {
	Encap(context.Context) (proto.EncapGrant, time.Duration, error)
	EncapIPv6(context.Context) (proto.EncapGrant, time.Duration, error)
}
