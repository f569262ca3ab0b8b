package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent/agenttest"
	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// The whole chain: the agent asks the relay through relayclient.NATSource when
// an MPTCP connection starts, opens a subflow through the granted port, and
// the connection carries data over both the default path and the relay.
// Lab "detours" with one relay: both paths have a 10 Mbit/s core link.
func TestMPTCPThroughRelay(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	l := labtest.UpDetours(ctx, t, fmt.Sprintf("tr%d", os.Getpid()%100000), 1)
	relayNS := l.NetnsName("detour1")
	relayIP := l.Addr("detour1")
	server := netip.AddrPortFrom(l.Addr("server"), 5201)
	if out, err := l.Command(ctx, "server", "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8").CombinedOutput(); err != nil {
		t.Fatalf("mptcp limits: %v %s", err, out)
	}

	k := newKeys(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "relay.yaml")
	cfg := fmt.Sprintf("listen: %s:%d\nprivate_key: %s\nmembers: [{name: client, public_key: %s}]\nallow_destinations: [%s/32]\nattribution_log: %s\n",
		relayIP, DefaultPort, k.relay, k.member.Public(), server.Addr(), filepath.Join(dir, "attribution.jsonl"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startRelay(t, relayNS, cfgPath)

	// The agent's configuration names the relay (docs/relay.md, `relays:`).
	acfg, err := agentd.ParseConfig([]byte(fmt.Sprintf("subflows: 1\nbackoff: 300ms\nrelays:\n  key: %s\n  servers:\n    - {name: detour1, address: '%s:%d', public_key: %s}\n",
		k.member, relayIP, DefaultPort, k.relay.Public())))
	if err != nil {
		t.Fatal(err)
	}
	acfg.Agent.NetNS = l.NetnsName("client")
	acfg.Agent.Socket = filepath.Join(dir, "agent.sock")
	rc := *acfg.Relays
	rc.Options.ListenPacket = relayconn.ListenIn(acfg.Agent.NetNS)
	src, err := relayclient.NewSource(rc)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	log := slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	defer agenttest.Start(ctx, t, acfg.Agent, log, src).Stop(t)

	// MPTCP sink on the server, counting what arrives.
	var got atomic.Int64
	var ln net.Listener
	if err := l.Do("server", func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(ctx, "tcp4", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { n, _ := io.Copy(io.Discard, c); got.Add(n); c.Close() })

	var c net.Conn
	if err := l.Do("client", func() (err error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp4", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	// The client's MPTCP connection is fully established (the event the
	// agent acts on) only once data flows: keep sending.
	var sent atomic.Int64
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		buf := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := c.Write(buf)
			sent.Add(int64(n))
			if err != nil && !os.IsTimeout(err) {
				return
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-writerDone
	}()

	// The detour subflow appears: its remote is the relay's granted port.
	var detourRemote netip.AddrPort
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "attribution.jsonl"))
			t.Logf("attribution log:\n%s\nsource: detours %v, err %v", b, src.Detours(server), src.Err(0, server))
		}
	}()
	waitFor(t, "a subflow through the relay", func() bool {
		conns, err := mptcppm.Dump(mptcppm.Options{NetNS: acfg.Agent.NetNS})
		if err != nil {
			return false
		}
		for _, mc := range conns {
			if mc.Local != local {
				continue
			}
			for _, s := range mc.Subflows {
				if s.Remote.Addr() == relayIP {
					detourRemote = s.Remote
					return true
				}
			}
		}
		return false
	})
	if ds := src.Detours(server); len(ds) != 1 || ds[0].Remote != detourRemote {
		t.Fatalf("source detours %v, subflow remote %v", ds, detourRemote)
	}

	// Send for 3 s more, then compare what the relay's mapping counted with
	// what the server received: both paths must carry a real share.
	time.Sleep(3 * time.Second)
	close(stop)
	<-writerDone
	c.Close()
	total := sent.Load()
	waitFor(t, "server to receive everything", func() bool { return got.Load() >= total })
	// The mapping's counter: live in the acct set, or in the attribution
	// log once the agent released the detour after the connection closed.
	var relayBytes int64
	waitFor(t, "the relay mapping's byte count", func() bool {
		out, err := nftList(t, relayNS, "list", "set", "ip", TableName, dataplane.AcctSetName)
		if err != nil {
			t.Fatal(out)
		}
		if i := strings.Index(out, "bytes "); i >= 0 {
			fmt.Sscan(out[i+len("bytes "):], &relayBytes)
		}
		for _, ev := range readAttribution(t, filepath.Join(dir, "attribution.jsonl")) {
			if ev.Bytes != nil && int64(*ev.Bytes) > relayBytes {
				relayBytes = int64(*ev.Bytes)
			}
		}
		return relayBytes > 0
	})
	t.Logf("sent %d bytes; the relay mapping counted %d bytes (%.0f%%, both directions)",
		total, relayBytes, 100*float64(relayBytes)/float64(total))
	if relayBytes < total/5 || relayBytes > total*9/10 {
		t.Fatalf("relay carried %d of %d bytes: not an aggregation of two paths", relayBytes, total)
	}
}
