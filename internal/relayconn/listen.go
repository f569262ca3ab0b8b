package relayconn

import (
	"net"
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// ListenIn returns an Options.ListenPacket that creates the UDP socket in
// network namespace ns (a name under /run/netns or a path; "" = the
// caller's own), so requests leave from the address the agent's
// connections use.
//
// The socket is a dual-stack one ("udp"), so that one function serves
// relays of either family (replies are matched with Unmap).
func ListenIn(ns string) func() (net.PacketConn, error) {
	return func() (net.PacketConn, error) {
		if ns == "" {
			return net.ListenUDP("udp", nil)
		}
		var pc *net.UDPConn
		err := netnsx.Do(ns, func() (err error) {
			pc, err = net.ListenUDP("udp", nil)
			return err
		})
		if err != nil {
			return nil, err
		}
		return pc, nil
	}
}

// udpFor is the UDP network for a relay at a.
func udpFor(a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return "udp6"
	}
	return "udp4"
}
