package tunnelctl

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/agenttest"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// TestAgentTunnelSubflow: the agent (userspace path manager) gets a tunnel
// TunnelSource (tunnelctl.NewSource, as the agent wires it) as a detour.Source and adds a subflow from the tunnel address to the
// server with SUBFLOW_CREATE; that subflow carries data through WireGuard.
func TestAgentTunnelSubflow(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft")
	line := newLine(t)
	// Leftovers of a crashed agent, removed by StartAll.
	netnstest.MustRun(t, "ip", "-n", line.cl, "rule", "add", "from", "100.88.7.7", "lookup", "52007", "priority", "5200")
	// The relay may still be starting: the TunnelSource retries until it answers.
	srcs, err := StartAll(line.cl, []*relayconn.Conn{line.dial(line.member)}, line.member, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := srcs[0]
	defer src.Close()
	if out := netnstest.MustRun(t, "ip", "-n", line.cl, "rule"); strings.Contains(out, "52007") {
		t.Errorf("stale rule survived StartAll:\n%s", out)
	}
	up := time.Now().Add(20 * time.Second)
	for src.Client() == nil && time.Now().Before(up) {
		time.Sleep(100 * time.Millisecond)
	}
	client := src.Client()
	if client == nil {
		t.Fatal("tunnel source never came up")
	}
	netnstest.MustRun(t, "ip", "-n", line.sv, "mptcp", "limits", "set", "subflows", "2")

	var ln net.Listener
	if err := netnstest.DoNamed(line.sv, func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp4", "203.0.113.10:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })

	cfg := agent.DefaultOptions()
	cfg.Subflows, cfg.Backoff = 1, 300*time.Millisecond
	cfg.NetNS = line.cl
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	defer agenttest.Start(context.Background(), t, cfg, log, src).Stop(t)
	tx0 := peerTx(t, client)

	var c net.Conn
	if err := netnstest.DoNamed(line.cl, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp4", "203.0.113.10:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(buf); err != nil && !os.IsTimeout(err) {
				return
			}
		}
	}()

	want := fmt.Sprintf("tunnel:%s", "r1")
	var last string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		st, err := agent.FetchStatus(cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range st.Connections {
			for _, sf := range cs.Subflows {
				last = fmt.Sprintf("%+v", cs.Subflows)
				if sf.Path == want && strings.HasPrefix(sf.Local, client.Address().String()+":") && sf.BytesSent > 1<<20 {
					// WireGuard counts a packet after it encrypted and sent
					// it: the TCP counter runs ahead by what still sits in
					// the TUN queue. Wait for it (the writer keeps writing).
					tx := peerTx(t, client) - tx0
					for wait := time.Now().Add(5 * time.Second); tx < 1<<20 && time.Now().Before(wait); tx = peerTx(t, client) - tx0 {
						time.Sleep(50 * time.Millisecond)
					}
					if tx < 1<<20 {
						t.Fatalf("agent reports %d bytes on the tunnel subflow, WireGuard sent only %d", sf.BytesSent, tx)
					}
					t.Logf("tunnel subflow %s -> %s: %d bytes sent", sf.Local, sf.Remote, sf.BytesSent)
					return
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no %s subflow from %s carrying data; last subflows: %s", want, client.Address(), last)
}

func peerTx(t *testing.T, c *tunnel.Client) int64 {
	t.Helper()
	st, err := c.Status()
	if err != nil || len(st.Peers) != 1 {
		t.Fatalf("tunnel status: %v, %v", st, err)
	}
	return st.Peers[0].TransmitBytes
}
