package benchtool

import (
	"context"
	"net"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// listenIn opens a TCP listener (MPTCP if mptcp) on addr inside netns
// ("" = this namespace): the receiver, the latency responder and the flow
// sink all listen this way.
func listenIn(addr, netns string, mptcp bool) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(mptcp)
	var ln net.Listener
	err := netnsx.Do(netns, func() error {
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", addr)
		return err
	})
	return ln, err
}
