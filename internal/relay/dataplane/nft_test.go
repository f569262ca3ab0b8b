package dataplane

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// startSink runs an echo server on addr (IPv4) inside ns.
func startSink(t testing.TB, ns, addr string) net.Listener {
	t.Helper()
	return netnstest.EchoIn(t, ns, "tcp4", addr)
}

// dialFrom connects from inside ns over IPv4.
func dialFrom(t testing.TB, ns, addr string) (net.Conn, error) {
	t.Helper()
	return netnstest.DialIn(t, ns, nil, "tcp4", addr)
}

func echo(c net.Conn, n int) error { return netnstest.RoundTrip(c, n) }

func TestNFTDataPlane(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	var d *nftDataPlane
	var err error
	in(t, f.Relay, func() { d, err = NewNFT(Options{}) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	startSink(t, f.Server, fxServer+":5201")

	key := Key{netip.MustParseAddr(fxClient), 40000}
	if err := d.Map([]Mapping{{Key: key, Server: netip.MustParseAddrPort(fxServer + ":5201")}}); err != nil {
		t.Fatal(err)
	}
	out, err := nftList(t, f.Relay, "list", "table", "ip", TableName)
	if err != nil || !strings.Contains(out, "10.0.1.1 . 40000 : 10.0.2.2 . 5201") {
		t.Fatalf("mapping not in the map (%v):\n%s", err, out)
	}

	// Through the detour: the server has no route to the client, so this
	// works only with both DNAT and masquerade.
	c, err := dialFrom(t, f.Client, fxRelay+":40000")
	if err != nil {
		t.Fatalf("connect through the detour: %v", err)
	}
	defer c.Close()
	if err := echo(c, 100000); err != nil {
		t.Fatalf("echo through the detour: %v", err)
	}
	// An unmapped port is not forwarded.
	if c2, err := dialFrom(t, f.Client, fxRelay+":40001"); err == nil {
		c2.Close()
		t.Fatal("unmapped port reached something")
	}

	cnt, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if got := cnt[key]; got.Bytes < 200000 || got.Packets == 0 {
		t.Fatalf("counter %+v, want >= 200000 bytes (100 kB each way)", got)
	}
	// Reading one element gives the same as the dump.
	one, err := d.CountersOf([]Key{key})
	if err != nil || one[key] != cnt[key] {
		t.Fatalf("CountersOf = %+v (%v), dump = %+v", one, err, cnt[key])
	}
	if _, err := d.CountersOf([]Key{{netip.MustParseAddr(fxClient), 1}}); err == nil {
		t.Fatal("CountersOf of a missing element succeeded")
	}

	// Unmap: new connections stop, the established one goes on.
	if err := d.Unmap([]Key{key}); err != nil {
		t.Fatal(err)
	}
	if c3, err := dialFrom(t, f.Client, fxRelay+":40000"); err == nil {
		c3.Close()
		t.Fatal("new connection after unmap")
	}
	if err := echo(c, 1000); err != nil {
		t.Fatalf("established connection broken by unmap: %v", err)
	}
	if err := d.Forget([]Key{key}); err != nil {
		t.Fatal(err)
	}
	if cnt, _ := d.Counters(); len(cnt) != 0 {
		t.Fatalf("counters left after forget: %v", cnt)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := nftList(t, f.Relay, "list", "table", "ip", TableName); err == nil {
		t.Fatalf("table still there after Close:\n%s", out)
	}
}

// A leftover table (crash) is replaced at start, not added to.
func TestNFTReplacesLeftover(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	var d *nftDataPlane
	var err error
	in(t, f.Relay, func() { d, err = NewNFT(Options{}) })
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map([]Mapping{{Key: Key{netip.MustParseAddr(fxClient), 40000}, Server: netip.MustParseAddrPort(fxServer + ":1")}}); err != nil {
		t.Fatal(err)
	}
	_ = d.conn.CloseLasting() // "crash": the table stays
	in(t, f.Relay, func() { d, err = NewNFT(Options{}) })
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	out, err := nftList(t, f.Relay, "list", "table", "ip", TableName)
	if err != nil || strings.Contains(out, "40000") || strings.Count(out, "masquerade") != 1 {
		t.Fatalf("leftover not replaced (%v):\n%s", err, out)
	}
}
