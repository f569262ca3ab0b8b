package relayconn

import (
	"net"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// ListenIn returns an Options.ListenPacket that creates the UDP socket in
// network namespace ns (a name under /run/netns or a path; "" = the
// caller's own), so requests leave from the address the agent's
// connections use.
func ListenIn(ns string) func() (net.PacketConn, error) {
	return func() (net.PacketConn, error) {
		if ns == "" {
			return net.ListenUDP("udp4", nil)
		}
		var pc *net.UDPConn
		err := netnsx.Do(ns, func() (err error) {
			pc, err = net.ListenUDP("udp4", nil)
			return err
		})
		if err != nil {
			return nil, err
		}
		return pc, nil
	}
}
