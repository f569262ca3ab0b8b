package dataplane

import (
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
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

// TestNFTFastPath: with the fast path on, a detour connection works,
// attribution comes from conntrack accounting for live and for finished
// connections (destroy events) and matches the bytes sent, no per-packet
// accounting rule is installed, the flowtable holds the connection where
// the kernel has flowtables, unmap stops new connections and Close leaves
// nothing behind.
func TestNFTFastPath(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	var d *nftDataPlane
	var err error
	in(t, f.Relay, func() {
		d, err = NewNFT(Options{FastPath: true, Log: slog.New(slog.NewTextHandler(logWriter{t}, nil))})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	// Finished connections leave conntrack quickly, so destroy events are
	// part of the test (time_wait is 120 s by default). After NewNFT: where
	// conntrack is a module, the table loads it.
	for _, s := range []string{"time_wait", "close", "fin_wait", "last_ack", "close_wait"} {
		netnstest.MustRun(t, "ip", "netns", "exec", f.Relay, "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_timeout_"+s+"=1")
	}
	startSink(t, f.Server, fxServer+":5201")
	key := Key{netip.MustParseAddr(fxClient), 40000}
	if err := d.Map([]Mapping{{Key: key, Server: netip.MustParseAddrPort(fxServer + ":5201")}}); err != nil {
		t.Fatal(err)
	}

	out, err := nftList(t, f.Relay, "list", "table", "ip", TableName)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "@"+AcctSetName) {
		t.Fatalf("per-packet accounting rule installed with the fast path:\n%s", out)
	}
	if !strings.Contains(out, "ct mark set") {
		t.Fatalf("no ct mark on DNATed connections:\n%s", out)
	}
	offload := d.FastPath()
	if offload != strings.Contains(out, "flow add @"+flowtableName) || offload != strings.Contains(out, "flowtable "+flowtableName) {
		t.Fatalf("FastPath() = %v but the table says otherwise:\n%s", offload, out)
	}
	if offload {
		for _, dev := range []string{"r0", "r1"} {
			if !strings.Contains(out, dev) {
				t.Fatalf("flowtable without device %s:\n%s", dev, out)
			}
		}
	} else {
		t.Logf("this kernel refused the flowtable (no nf_flow_table): offload not checked, attribution through conntrack checked")
	}
	// Devices follow the namespace's links: a new veth pair is added, a
	// deleted one removed (the flowtable is updated where there is one).
	devs := func() []string {
		d.mu.Lock()
		defer d.mu.Unlock()
		return append([]string(nil), d.devs...)
	}
	if got := strings.Join(devs(), ","); got != "r0,r1" {
		t.Fatalf("devices %q, want r0,r1 (no loopback)", got)
	}
	netnstest.MustRun(t, "ip", "-n", f.Relay, "link", "add", "r9", "type", "veth", "peer", "name", "r9p")
	waitFor(t, "new links in the device list", func() bool {
		return strings.Join(devs(), ",") == "r0,r1,r9p,r9" || strings.Join(devs(), ",") == "r0,r1,r9,r9p"
	})
	if offload {
		if out, _ := nftList(t, f.Relay, "list", "flowtable", "ip", TableName, flowtableName); !strings.Contains(out, "r9") {
			t.Fatalf("flowtable not updated with the new device:\n%s", out)
		}
	}
	netnstest.MustRun(t, "ip", "-n", f.Relay, "link", "del", "r9")
	waitFor(t, "deleted links out of the device list", func() bool { return strings.Join(devs(), ",") == "r0,r1" })
	if acct, _ := exec.Command("ip", "netns", "exec", f.Relay, "cat", "/proc/sys/net/netfilter/nf_conntrack_acct").Output(); strings.TrimSpace(string(acct)) != "1" {
		t.Fatalf("conntrack accounting not on in the relay's namespace: %q", acct)
	}

	// A finished connection (its conntrack entry destroyed) and a live one.
	const n1, n2 = 300000, 200000
	c1, err := dialFrom(t, f.Client, fxRelay+":40000")
	if err != nil {
		t.Fatalf("connect through the detour: %v", err)
	}
	if err := echo(c1, n1); err != nil {
		t.Fatalf("echo through the detour: %v", err)
	}
	c1.Close()
	c2, err := dialFrom(t, f.Client, fxRelay+":40000")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for i := 0; i < 4; i++ { // several round trips: established, offloaded
		if err := echo(c2, n2/4); err != nil {
			t.Fatal(err)
		}
	}
	if offload {
		if tab := conntrackTable(t, f.Relay); !strings.Contains(tab, "[OFFLOAD]") {
			t.Fatalf("live detour connection not in the flowtable:\n%s", tab)
		}
	}
	payload := uint64(2 * (n1 + n2)) // echo: both directions
	var got Counter
	deadline := time.Now().Add(10 * time.Second)
	for {
		// A dump also evicts expired entries, whose destroy events then
		// arrive.
		cnt, err := d.CountersOf([]Key{key})
		if err != nil {
			t.Fatal(err)
		}
		got = cnt[key]
		d.ct.mu.Lock()
		fin := d.ct.finished[key]
		d.ct.mu.Unlock()
		if fin.Bytes >= 2*n1 && got.Bytes >= payload {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counted %+v (finished connections %+v), want >= %d bytes with the finished connection's %d from its destroy event\n%s",
				got, fin, payload, 2*n1, conntrackTable(t, f.Relay))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !withinHeaders(got.Bytes, payload) {
		t.Fatalf("counted %d bytes for %d bytes of payload", got.Bytes, payload)
	}
	t.Logf("payload %d bytes, attributed %d bytes in %d packets (+%.1f%%)", payload, got.Bytes, got.Packets,
		100*float64(got.Bytes-payload)/float64(payload))
	// Counters (all mappings) agrees.
	if all, err := d.Counters(); err != nil || all[key].Bytes < got.Bytes {
		t.Fatalf("Counters = %+v (%v), CountersOf = %+v", all, err, got)
	}

	// Unmap: new connections stop, the established one goes on.
	if err := d.Unmap([]Key{key}); err != nil {
		t.Fatal(err)
	}
	if c3, err := dialFrom(t, f.Client, fxRelay+":40000"); err == nil {
		c3.Close()
		t.Fatal("new connection after unmap")
	}
	if err := echo(c2, 1000); err != nil {
		t.Fatalf("established connection broken by unmap: %v", err)
	}
	// Other forwarded traffic is not marked (so never offloaded): plain
	// routing through the relay to the server.
	netnstest.MustRun(t, "ip", "-n", f.Server, "route", "add", "10.0.1.0/24", "via", fxRelayServer)
	pc, err := dialFrom(t, f.Client, fxServer+":5201")
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(pc, 100000); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(conntrackTable(t, f.Relay), "\n") {
		if strings.Contains(l, "dport=5201 ") && strings.Contains(l, "src=10.0.1.1 dst=10.0.2.2") && (strings.Contains(l, "mark=1297088512") || strings.Contains(l, "OFFLOAD")) {
			t.Fatalf("plain routed connection marked or offloaded: %s", l)
		}
	}
	pc.Close()

	if err := d.Forget([]Key{key}); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := nftList(t, f.Relay, "list", "table", "ip", TableName); err == nil {
		t.Fatalf("table still there after Close:\n%s", out)
	}
}
