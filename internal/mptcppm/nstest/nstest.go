// Package nstest builds small network-namespace topologies for the
// integration tests of mptcppm and agent: namespaces, veth links, and
// running code or commands inside them. Everything it creates is removed in
// t.Cleanup, also when the test fails.
package nstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
)

var counter atomic.Int32

// NS is one network namespace named <prefix><pid>-<n><role>.
type NS struct {
	Name string
	t    testing.TB
}

// New creates a namespace with loopback up.
func New(t testing.TB, prefix, role string) *NS {
	t.Helper()
	name := fmt.Sprintf("%s%d-%d%s", prefix, os.Getpid(), counter.Add(1), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	n := &NS{Name: name, t: t}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	n.Run("ip", "link", "set", "lo", "up")
	return n
}

// Run runs argv inside the namespace and fails the test on error.
func (n *NS) Run(argv ...string) string {
	n.t.Helper()
	out, err := n.Try(argv...)
	if err != nil {
		n.t.Fatalf("%s: %s: %v: %s", n.Name, strings.Join(argv, " "), err, out)
	}
	return out
}

// Try runs argv inside the namespace and returns its combined output.
func (n *NS) Try(argv ...string) (string, error) {
	args := append([]string{"netns", "exec", n.Name}, argv...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	return string(out), err
}

// Do runs fn on a thread switched into the namespace (sockets created in
// fn belong to it).
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is left locked when the goroutine ends so that Go
		// discards it instead of reusing a thread in the wrong namespace.
		runtime.LockOSThread()
		h, err := netns.GetFromName(n.Name)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a listener inside the namespace.
func (n *NS) Listen(lc net.ListenConfig, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) {
		l, err = lc.Listen(n.t.Context(), network, addr)
		return err
	})
	return l, err
}

// Dial connects from inside the namespace.
func (n *NS) Dial(d *net.Dialer, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		c, err = d.Dial(network, addr)
		return err
	})
	return c, err
}

// Link connects a and b with a veth pair and gives each end an address
// (CIDR form, e.g. "10.0.1.1/24"). It returns the interface names.
func Link(t testing.TB, a *NS, aAddr string, b *NS, bAddr string) (string, string) {
	t.Helper()
	i := counter.Add(1)
	an, bn := fmt.Sprintf("ta%da", i), fmt.Sprintf("ta%db", i)
	a.Run("ip", "link", "add", an, "type", "veth", "peer", "name", bn, "netns", b.Name)
	a.Run("ip", "addr", "add", aAddr, "dev", an)
	b.Run("ip", "addr", "add", bAddr, "dev", bn)
	a.Run("ip", "link", "set", an, "up")
	b.Run("ip", "link", "set", bn, "up")
	return an, bn
}
