package relay

import (
	"io"
	"net"
	"os/exec"
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

const (
	fxClient      = "10.0.1.1"
	fxRelay       = "10.0.1.2" // the relay's address on the client side
	fxRelayServer = "10.0.2.1"
	fxServer      = "10.0.2.2"
)

func newFixture(t testing.TB) *fixture {
	t.Helper()
	c, r, s := netnstest.New(t, "trc"), netnstest.New(t, "trr"), netnstest.New(t, "trs")
	netnstest.LinkNamed(t, c, "c0", fxClient+"/24", r, "r0", fxRelay+"/24")
	netnstest.LinkNamed(t, r, "r1", fxRelayServer+"/24", s, "s0", fxServer+"/24")
	c.Route(t, "0.0.0.0/0", fxRelay)
	if err := r.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatalf("ip_forward in %s: %v", r.Name, err)
	}
	return &fixture{Client: c.Name, Relay: r.Name, Server: s.Name}
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

// startSink listens on addr inside ns and discards what it receives.
func startSink(t testing.TB, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	in(t, ns, func() { ln, err = net.Listen("tcp4", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() }) // echo
	return ln
}

// dialFrom connects from inside ns.
func dialFrom(t testing.TB, ns, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	var err error
	in(t, ns, func() { c, err = net.DialTimeout("tcp4", addr, 2*time.Second) })
	return c, err
}

func echo(c net.Conn, n int) error {
	buf := make([]byte, n)
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err := io.ReadFull(c, buf)
	return err
}
