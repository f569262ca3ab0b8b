package relay

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// conntrackTable is /proc/net/nf_conntrack of namespace ns.
func conntrackTable(t testing.TB, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/nf_conntrack").CombinedOutput()
	if err != nil {
		t.Fatalf("conntrack table of %s: %v\n%s", ns, err, out)
	}
	return string(out)
}

// withinHeaders says whether counted bytes are the payload plus at most
// 10% of headers (IP+TCP, 52 bytes per packet with timestamps; conntrack
// and nft count GRO-merged packets with one header, so usually less).
func withinHeaders(counted, payload uint64) bool {
	return counted >= payload && counted <= payload+payload/10
}

// TestRelayFastPathAttribution: the relay with fast_path: true grants a
// detour, TCP goes through it, and the release line attributes the bytes
// sent (within headers).
func TestRelayFastPathAttribution(t *testing.T) {
	f, _, cfgPath, p, c := relayLine(t, "fast_path: true\n")
	ctx := context.Background()
	d, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fast path log line", func() bool { return strings.Contains(p.stderr.String(), "fast path") })
	conn, err := dialFrom(t, f.Client, d.String())
	if err != nil {
		t.Fatal(err)
	}
	const n = 250000
	for i := 0; i < 5; i++ {
		if err := echo(conn, n/5); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(p.stderr.String(), "flowtable installed") {
		if tab := conntrackTable(t, f.Relay); !strings.Contains(tab, "[OFFLOAD]") {
			t.Fatalf("detour connection not offloaded:\n%s", tab)
		}
	}
	conn.(*net.TCPConn).Close()
	if err := c.Release(ctx, d.Port()); err != nil {
		t.Fatal(err)
	}
	attrPath := filepath.Join(filepath.Dir(cfgPath), "attribution.jsonl")
	var got uint64
	waitFor(t, "release line with bytes", func() bool {
		for _, ev := range readAttribution(t, attrPath) {
			if ev.Event == "release" && ev.DetourPort == d.Port() && ev.Bytes != nil {
				got = *ev.Bytes
				return true
			}
		}
		return false
	})
	if !withinHeaders(got, 2*n) {
		t.Fatalf("release attributes %d bytes, sent %d (echo: both directions)\n%s", got, 2*n, p.stderr.String())
	}
	t.Logf("sent %d bytes (both directions), attributed %d", 2*n, got)
}
