package relay

import (
	"net"
	"os/exec"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// fixture is a three-namespace line: client -- relay -- server. The server
// has no route back to the client, so a detour only works if the relay
// masquerades.
type fixture struct {
	Client, Relay, Server string // namespace names
}

// The line's addresses (netnstest.NewLine): IPv4, and IPv6 beside it in
// newFixture6.
const (
	fxClient      = netnstest.LineClient
	fxRelay       = netnstest.LineRelay // the relay's address on the client side
	fxRelayServer = netnstest.LineRelayServer
	fxServer      = netnstest.LineServer

	fx6Client      = netnstest.LineClient6
	fx6Relay       = netnstest.LineRelay6
	fx6RelayServer = netnstest.LineRelayServer6
	fx6Server      = netnstest.LineServer6
)

func newFixture(t testing.TB) *fixture { return lineFixture(netnstest.NewLine(t, "tr", false)) }

// newFixture6 is newFixture with IPv6 beside IPv4 on the same links.
func newFixture6(t testing.TB) *fixture { return lineFixture(netnstest.NewLine(t, "tr6", true)) }

func lineFixture(l *netnstest.Line) *fixture {
	return &fixture{Client: l.Client.Name, Relay: l.Relay.Name, Server: l.Server.Name}
}

// in runs fn on a thread inside namespace ns. Sockets created in fn stay
// in ns after it returns.
func in(t testing.TB, ns string, fn func()) {
	t.Helper()
	if err := netnstest.DoNamed(ns, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// nftList runs the nft CLI with what inside namespace ns and returns its
// combined output (an error if, for example, the table does not exist).
func nftList(t testing.TB, ns string, what ...string) (string, error) {
	t.Helper()
	args := append([]string{"netns", "exec", ns, "nft"}, what...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	return string(out), err
}

// startSink runs an echo server on addr (IPv4) inside ns.
func startSink(t testing.TB, ns, addr string) net.Listener {
	t.Helper()
	return netnstest.EchoIn(t, ns, "tcp4", addr)
}

// listenIn runs an echo server on network/addr (tcp4, tcp6) inside ns.
func listenIn(t testing.TB, ns, network, addr string) {
	t.Helper()
	netnstest.EchoIn(t, ns, network, addr)
}

// dialFrom connects from inside ns over IPv4.
func dialFrom(t testing.TB, ns, addr string) (net.Conn, error) {
	t.Helper()
	return netnstest.DialIn(t, ns, nil, "tcp4", addr)
}

// dialIn connects from inside ns over network (tcp4, tcp6).
func dialIn(t testing.TB, ns, network, addr string) (net.Conn, error) {
	t.Helper()
	return netnstest.DialIn(t, ns, nil, network, addr)
}

func echo(c net.Conn, n int) error { return netnstest.RoundTrip(c, n) }
