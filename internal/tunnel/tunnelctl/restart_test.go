package tunnelctl

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// TestRelayRestartReadmits: `mpdetour relay` is killed and restarted. At
// start it re-admits the saved keys of its current members (the tunnel
// state_file), so a client's next WireGuard handshake succeeds; the client's
// watchdog sees its traffic get nothing back (its old session is gone),
// asks again over the control channel, gets the same address and the
// tunnel carries traffic again. A member removed from
// the config before the restart asks too and is refused: no tunnel.
func TestRelayRestartReadmits(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	line := newLine(t)
	second, _ := proto.GenerateKey()
	line.restart(line.member, second) // two members
	c1 := openTunnel(t, line, line.member)
	c2 := openTunnelIndex(t, line, second, 1)
	addr := c1.Address()

	var ln net.Listener
	if err := netnstest.DoNamed(line.sv, func() (err error) { ln, err = net.Listen("tcp4", "203.0.113.10:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				c.Close()
				return
			}
			fmt.Fprintln(c, "ok")
		}
	})
	// ping sends a line from local and waits for the answer.
	ping := func(local netip.Addr, timeout time.Duration) error {
		var c net.Conn
		if err := netnstest.DoNamed(line.cl, func() (err error) {
			d := net.Dialer{Timeout: timeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
			c, err = d.Dial("tcp4", ln.Addr().String())
			return err
		}); err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		fmt.Fprintln(c, "hello")
		_, err := bufio.NewReader(c).ReadString('\n')
		return err
	}
	for _, c := range []*tunnel.Client{c1, c2} {
		if err := retry(10*time.Second, func() error { return ping(c.Address(), 2*time.Second) }); err != nil {
			t.Fatalf("before restart, %s: %v", c.Address(), err)
		}
	}
	// Connections in use across the restart: their traffic is what the
	// watchdogs see go unanswered.
	keep := func(local netip.Addr) (stop func()) {
		var c net.Conn
		if err := netnstest.DoNamed(line.cl, func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
			c, err = d.Dial("tcp4", ln.Addr().String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(200 * time.Millisecond):
				}
				c.SetWriteDeadline(time.Now().Add(time.Second))
				fmt.Fprintln(c, strings.Repeat("x", 1000))
			}
		}()
		return func() { close(done); c.Close() }
	}
	stop1, stop2 := keep(c1.Address()), keep(c2.Address())
	defer stop1()
	defer stop2()

	restarted := time.Now()
	line.restart(line.member) // the second member is removed
	// At start the relay re-admits the saved peers of current members
	// (tunnel state_file), before anyone asks: the removed one stays out.
	var peers []string
	if err := retry(10*time.Second, func() error {
		var st *relay.Status
		err := netnstest.DoNamed(line.rl, func() (err error) { st, err = relay.QueryStatus(time.Second); return err })
		if err != nil {
			return err
		}
		if st.Tunnel == nil {
			return fmt.Errorf("no tunnel in the relay status")
		}
		peers = peers[:0]
		for _, p := range st.Tunnel.Peers {
			peers = append(peers, p.Key)
		}
		return nil
	}); err != nil {
		t.Fatalf("relay status after the restart: %v", err)
	}
	if len(peers) != 1 || peers[0] != line.member.Public().String() {
		t.Fatalf("peers right after the restart: %v, want only the remaining member %s", peers, line.member.Public())
	}
	if err := retry(40*time.Second, func() error { return ping(addr, 2*time.Second) }); err != nil {
		t.Fatalf("tunnel not back after the relay restart: %v", err)
	}
	t.Logf("tunnel back %v after the relay restarted (watchdog re-request over the control channel)",
		time.Since(restarted).Round(100*time.Millisecond))
	if c1.Address() != addr {
		t.Errorf("address changed from %s to %s", addr, c1.Address())
	}
	if err := ping(c2.Address(), 3*time.Second); err == nil {
		t.Error("a member removed from the relay config still has a tunnel after the restart")
	}
}

func retry(d time.Duration, fn func() error) error {
	end := time.Now().Add(d)
	for {
		err := fn()
		if err == nil || time.Now().After(end) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func openTunnelIndex(t *testing.T, ln *line, priv proto.Key, index int) *tunnel.Client {
	t.Helper()
	src := NewSource(ln.dial(priv), tunnel.ClientConfig{Netns: ln.cl, Index: index, PrivateKey: wgtypes.Key(priv)}, nil)
	t.Cleanup(func() { src.Close() })
	end := time.Now().Add(20 * time.Second)
	for src.Client() == nil && time.Now().Before(end) {
		time.Sleep(100 * time.Millisecond)
	}
	if src.Client() == nil {
		t.Fatalf("no tunnel for index %d", index)
	}
	return src.Client()
}
