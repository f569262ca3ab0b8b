package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// Test topology (namespaces named tw<role>-<pid>-<n>):
//
//	c1 ──198.18.1.0/24── relay ──203.0.113.0/24── server (203.0.113.10, 10.200.0.1 on lo)
//	c2 ──198.18.2.0/24──┘                          │
//	c1 ────────────────192.0.2.0/24 (direct)───────┘
//
// The relay's tunnel subnet is 100.80.0.0/16; its policy denies private
// ranges, so 10.200.0.1 on the server must stay unreachable through it.
var (
	serverAddr       = netip.MustParseAddr("203.0.113.10")
	relayUplink      = netip.MustParseAddr("203.0.113.1")
	deniedAddr       = netip.MustParseAddr("10.200.0.1")
	tunSubnet        = netip.MustParsePrefix("100.80.0.0/16")
	relayPort        = 51820
	testDestinations = Destinations{Restricted: []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("224.0.0.0/4"),
		netip.MustParsePrefix("100.64.0.0/10"),
	}}
)

type topo struct {
	c1, c2, relay, server string
}

func (tp topo) relayEndpoint(client int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("198.18.%d.1", client)), uint16(relayPort))
}

func nsRun(t testing.TB, ns string, args ...string) string {
	t.Helper()
	return netnstest.MustRun(t, append([]string{"ip", "netns", "exec", ns}, args...)...)
}

func newTopo(t *testing.T) topo {
	t.Helper()
	c1, c2 := netnstest.New(t, "twc1"), netnstest.New(t, "twc2")
	relay, server := netnstest.New(t, "twr"), netnstest.New(t, "tws")
	netnstest.LinkNamed(t, c1, "r0", "198.18.1.2/24", relay, "c1", "198.18.1.1/24")
	netnstest.LinkNamed(t, c2, "r0", "198.18.2.2/24", relay, "c2", "198.18.2.1/24")
	netnstest.LinkNamed(t, relay, "s0", "203.0.113.1/24", server, "r0", "203.0.113.10/24")
	netnstest.LinkNamed(t, c1, "s0", "192.0.2.2/24", server, "c1", "192.0.2.1/24")
	server.Addr(t, "lo", "10.200.0.1/32")
	relay.Route(t, "10.200.0.0/24", "203.0.113.10")
	// c1 reaches the server directly; only tunnel-sourced packets go to the relay.
	c1.Route(t, serverAddr.String()+"/32", "192.0.2.1")
	c1.Route(t, "10.200.0.0/24", "192.0.2.1")
	return topo{c1: c1.Name, c2: c2.Name, relay: relay.Name, server: server.Name}
}

// echoServer listens on addr:port in ns; each connection first gets the
// peer address it sees as one line, then everything it sends is discarded
// and the byte count written back on close of the write side.
func echoServer(t *testing.T, ns string, addr netip.Addr, mptcp bool) netip.AddrPort {
	t.Helper()
	var ln net.Listener
	err := netnstest.DoNamed(ns, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(mptcp)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp4", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) {
		defer c.Close()
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// dial connects from local (zero = kernel's choice) to remote inside ns.
func dial(t testing.TB, ns string, local netip.Addr, remote netip.AddrPort, mptcp bool, timeout time.Duration) (*net.TCPConn, error) {
	var c net.Conn
	err := netnstest.DoNamed(ns, func() error {
		d := net.Dialer{Timeout: timeout}
		d.SetMultipathTCP(mptcp)
		if local.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
		}
		var err error
		c, err = d.Dial("tcp4", remote.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// exchange dials, reads the address the server saw, sends n bytes and
// checks the server counted them.
func exchange(t testing.TB, ns string, local netip.Addr, remote netip.AddrPort, n int, timeout time.Duration) (seen string, err error) {
	c, err := dial(t, ns, local, remote, false, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	seen, err = r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read peer line: %w", err)
	}
	if _, err := c.Write(bytes.Repeat([]byte("x"), n)); err != nil {
		return "", err
	}
	c.CloseWrite()
	count, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read count: %w", err)
	}
	if strings.TrimSpace(count) != fmt.Sprint(n) {
		return "", fmt.Errorf("server counted %q bytes, sent %d", count, n)
	}
	return strings.TrimSpace(seen), nil
}

// retryExchange retries until it succeeds or the deadline passes.
func retryExchange(t testing.TB, ns string, local netip.Addr, remote netip.AddrPort, deadline time.Duration) (string, time.Duration, error) {
	start := time.Now()
	var err error
	for time.Since(start) < deadline {
		var seen string
		seen, err = exchange(t, ns, local, remote, 1<<16, 2*time.Second)
		if err == nil {
			return seen, time.Since(start), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", time.Since(start), err
}

func genKey(t testing.TB) wgtypes.Key {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// assertClean fails if ns still holds anything this package creates.
func assertClean(t testing.TB, ns string) {
	t.Helper()
	links := nsRun(t, ns, "ip", "-o", "link")
	if strings.Contains(links, IfacePrefix) {
		t.Errorf("%s: tunnel interface left:\n%s", ns, links)
	}
	rules := nsRun(t, ns, "ip", "rule")
	if strings.Contains(rules, fmt.Sprintf("lookup %d", TableBase)) {
		t.Errorf("%s: rule left:\n%s", ns, rules)
	}
	if out, _ := exec.Command("ip", "-n", ns, "route", "show", "table", "all").CombinedOutput(); bytes.Contains(out, []byte("table 52")) {
		t.Errorf("%s: tunnel routes left:\n%s", ns, out)
	}
	tables := nsRun(t, ns, "nft", "list", "tables")
	if strings.Contains(tables, TableName) {
		t.Errorf("%s: nftables table left:\n%s", ns, tables)
	}
}

func newServer(t *testing.T, tp topo, key wgtypes.Key, mut ...func(*ServerConfig)) *Server {
	t.Helper()
	cfg := ServerConfig{Netns: tp.relay, Subnet: tunSubnet, ListenPort: relayPort, PrivateKey: key,
		Destinations: testDestinations, MTU: 1380}
	for _, m := range mut {
		m(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t *testing.T, ns string, index int, key wgtypes.Key, a Allocation, mut ...func(*ClientConfig)) *Client {
	t.Helper()
	cfg := ClientConfig{Netns: ns, Relay: "r1", Index: index, PrivateKey: key, Allocation: a}
	for _, m := range mut {
		m(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
