package netnstest

import (
	"io"
	"net"
	"testing"
	"time"
)

// Addresses of the line NewLine builds: client -- relay -- server, IPv4
// always, IPv6 beside it on the same links when asked for.
const (
	LineClient      = "10.0.1.1"
	LineRelay       = "10.0.1.2" // the relay's address on the client side
	LineRelayServer = "10.0.2.1"
	LineServer      = "10.0.2.2"

	LineClient6      = "fd00:1::1"
	LineRelay6       = "fd00:1::2"
	LineRelayServer6 = "fd00:2::1"
	LineServer6      = "fd00:2::2"
)

// Line is three namespaces in a row: client -- relay -- server. The client
// routes everything through the relay, which forwards; the server has no
// route back to the client, so a detour only works if the relay
// masquerades.
type Line struct {
	Client, Relay, Server *NS
}

// NewLine builds the line with namespaces named <prefix>c, <prefix>r and
// <prefix>s (New adds the pid and a counter). With ipv6, IPv6 is enabled
// in all three (sysctls), the IPv6 addresses stand beside the IPv4 ones,
// the client has an IPv6 default route and the relay forwards IPv6 too.
// t.Cleanup removes everything.
func NewLine(t testing.TB, prefix string, ipv6 bool) *Line {
	t.Helper()
	c, r, s := New(t, prefix+"c"), New(t, prefix+"r"), New(t, prefix+"s")
	if ipv6 {
		for _, ns := range []*NS{c, r, s} {
			for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
				if err := ns.Sysctl(k, "0"); err != nil {
					t.Fatalf("%s in %s: %v", k, ns.Name, err)
				}
			}
		}
	}
	LinkNamed(t, c, "c0", LineClient+"/24", r, "r0", LineRelay+"/24")
	LinkNamed(t, r, "r1", LineRelayServer+"/24", s, "s0", LineServer+"/24")
	c.Route(t, "0.0.0.0/0", LineRelay)
	forward := []string{"net/ipv4/ip_forward"}
	if ipv6 {
		c.Addr(t, "c0", LineClient6+"/64")
		r.Addr(t, "r0", LineRelay6+"/64")
		r.Addr(t, "r1", LineRelayServer6+"/64")
		s.Addr(t, "s0", LineServer6+"/64")
		c.Route(t, "::/0", LineRelay6)
		forward = append(forward, "net/ipv6/conf/all/forwarding")
	}
	for _, k := range forward {
		if err := r.Sysctl(k, "1"); err != nil {
			t.Fatalf("%s in %s: %v", k, r.Name, err)
		}
	}
	return &Line{Client: c, Relay: r, Server: s}
}

// EchoIn listens on network/addr (tcp4, tcp6) inside the namespace named
// ns and echoes what each connection sends; t.Cleanup closes the listener.
func EchoIn(t testing.TB, ns, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := DoNamed(ns, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	Serve(ln, func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() })
	return ln
}

// DialIn connects to addr over network from inside the namespace named ns
// with d (a 2-second timeout when d is nil) and returns the dial's result;
// failing to enter the namespace fails the test (it is no dial error).
func DialIn(t testing.TB, ns string, d *net.Dialer, network, addr string) (net.Conn, error) {
	t.Helper()
	if d == nil {
		d = &net.Dialer{Timeout: 2 * time.Second}
	}
	var c net.Conn
	var err error
	if nerr := DoNamed(ns, func() error { c, err = d.Dial(network, addr); return nil }); nerr != nil {
		t.Fatal(nerr)
	}
	return c, err
}

// RoundTrip writes n bytes to c and reads n bytes back (from an echo)
// within 3 seconds.
func RoundTrip(c net.Conn, n int) error {
	buf := make([]byte, n)
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err := io.ReadFull(c, buf)
	return err
}
