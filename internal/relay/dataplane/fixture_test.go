package dataplane

import (
	"os/exec"
	"strings"
	"testing"
	"time"

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

// logWriter sends log lines to the test's log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(8 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
