package tunnel

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

func linkTxBytes(t *testing.T, ns, name string) uint64 {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	l, err := nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Statistics.TxBytes
}

// TestMPTCPTunnelSubflow: an MPTCP connection from c1 to the server gets a
// second subflow from the tunnel address (added here with the in-kernel
// path manager's subflow endpoint; the agent does it with SUBFLOW_CREATE)
// and both the direct path and the tunnel carry a real share of the data.
// Both paths are shaped to 100 Mbit/s so that the scheduler needs both.
func TestMPTCPTunnelSubflow(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft", "tc")
	tp := newTopo(t)
	srv := newServer(t, tp, genKey(t))
	k1 := genKey(t)
	a1, err := srv.Offer(k1.PublicKey(), tp.relayEndpoint(1).Addr())
	if err != nil {
		t.Fatal(err)
	}
	c1 := newClient(t, tp.c1, 0, k1, a1)
	for _, dev := range []string{"s0", "r0"} {
		nsRun(t, tp.c1, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "100mbit", "burst", "64kb", "latency", "20ms")
	}
	nsRun(t, tp.c1, "ip", "mptcp", "limits", "set", "subflows", "2")
	nsRun(t, tp.server, "ip", "mptcp", "limits", "set", "subflows", "2")
	nsRun(t, tp.c1, "ip", "mptcp", "endpoint", "add", c1.Address().String(), "dev", c1.Iface(), "subflow")

	echo := echoServer(t, tp.server, serverAddr, true)
	if _, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 10*time.Second); err != nil {
		t.Fatalf("tunnel not up: %v", err)
	}
	tun0, direct0 := peerTx(t, c1), linkTxBytes(t, tp.c1, "s0")
	const total = 24 << 20
	c, err := dial(t, tp.c1, netip.Addr{}, echo, true, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	r := bufio.NewReader(c)
	seen, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(seen, "192.0.2.2:") {
		t.Errorf("initial subflow from %q, want the direct path", seen)
	}
	start := time.Now()
	if _, err := c.Write(bytes.Repeat([]byte("m"), total)); err != nil {
		t.Fatal(err)
	}
	c.CloseWrite()
	count, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(count) != fmt.Sprint(total) {
		t.Fatalf("server counted %q, %v; want %d", count, err, total)
	}
	el := time.Since(start)
	viaTun, direct := peerTx(t, c1)-tun0, linkTxBytes(t, tp.c1, "s0")-direct0
	t.Logf("%d MB in %v (%.0f Mbit/s): direct %.1f MB, tunnel %.1f MB (incl. WireGuard overhead)",
		total>>20, el.Round(time.Millisecond), float64(total)*8/el.Seconds()/1e6, float64(direct)/1e6, float64(viaTun)/1e6)
	if viaTun < total/10 || direct < total/10 {
		t.Errorf("no aggregation: direct %d bytes, tunnel %d bytes of %d", direct, viaTun, total)
	}
	nsRun(t, tp.c1, "ip", "mptcp", "endpoint", "flush")
}

func peerTx(t *testing.T, c *Client) uint64 {
	t.Helper()
	st, err := c.Status()
	if err != nil || len(st.Peers) != 1 {
		t.Fatalf("status %v %v", st, err)
	}
	return uint64(st.Peers[0].TransmitBytes)
}
