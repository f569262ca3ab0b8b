package relay

import (
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
)

// newTestServer builds a relay the way the daemon does (New), from fakes:
// a UDP control socket on loopback, the in-memory data plane, tun (nil:
// no tunnels) and log (nil: discarded). The event loop does not run: the
// test calls the handlers.
func newTestServer(t *testing.T, static Static, set *Reloadable, tun Tunnels, log *slog.Logger) (*Server, *dataplane.Fake) {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dp := dataplane.NewFake()
	s, err := New(static, set, Deps{PacketConn: conn, DataPlane: dp, Tunnels: tun, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.attr.Close() })
	return s, dp
}
