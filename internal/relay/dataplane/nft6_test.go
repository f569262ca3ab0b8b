package dataplane

import (
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"golang.org/x/sys/unix"
)

// startSink6 is startSink on an IPv6 address.
func startSink6(t testing.TB, ns, addr string) {
	t.Helper()
	netnstest.EchoIn(t, ns, "tcp6", addr)
}

// dialFrom6 connects from inside ns over IPv6; control (may be nil) runs
// on the socket before connect.
func dialFrom6(t testing.TB, ns, addr string, control func(fd uintptr) error) (net.Conn, error) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if control != nil {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = control(fd) }); err != nil {
				return err
			}
			return serr
		}
	}
	return netnstest.DialIn(t, ns, &d, "tcp6", addr)
}

// TestNFTDataPlaneIPv6: a mapping of an IPv6 client to an IPv6 server
// (DNAT66 and masquerade) carries traffic, is counted, stops new
// connections when unmapped while an established one goes on, and lives
// beside an IPv4 mapping of the same port; what cannot be mapped (families
// mixed, IPv4-mapped, zoned) is refused without installing anything of the
// batch; Close removes both tables.
func TestNFTDataPlaneIPv6(t *testing.T) {
	for _, fast := range []bool{false, true} {
		t.Run(map[bool]string{false: "counters", true: "fastpath"}[fast], func(t *testing.T) {
			testNFT6(t, fast)
		})
	}
}

func testNFT6(t *testing.T, fast bool) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture6(t)
	var d *nftDataPlane
	var err error
	in(t, f.Relay, func() {
		d, err = NewNFT(Options{FastPath: fast, Log: slog.New(slog.NewTextHandler(logWriter{t}, nil))})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	startSink6(t, f.Server, "["+fx6Server+"]:5201")
	startSink(t, f.Server, fxServer+":5201")

	key6 := Key{netip.MustParseAddr(fx6Client), 40000}
	key4 := Key{netip.MustParseAddr(fxClient), 40000}
	bad := []Mapping{
		{Key: Key{netip.MustParseAddr(fx6Client), 40001}, Server: netip.MustParseAddrPort(fxServer + ":5201")},
		{Key: Key{netip.MustParseAddr("::ffff:" + fxClient), 40002}, Server: netip.MustParseAddrPort("[::ffff:" + fxServer + "]:5201")},
		{Key: Key{netip.MustParseAddr("fe80::1%c0"), 40003}, Server: netip.MustParseAddrPort("[" + fx6Server + "]:5201")},
	}
	for _, b := range bad {
		// A good mapping in the same batch is not installed either.
		if err := d.Map([]Mapping{{Key: key6, Server: netip.MustParseAddrPort("[" + fx6Server + "]:5201")}, b}); err == nil {
			t.Fatalf("mapping %v -> %v accepted", b.Key, b.Server)
		} else {
			t.Logf("refused as expected: %v", err)
		}
	}
	if out, _ := nftList(t, f.Relay, "list", "map", "ip6", TableName, DNATMapName); strings.Contains(out, "40000") || strings.Contains(out, "40001") {
		t.Fatalf("a refused batch left elements behind:\n%s", out)
	}

	if err := d.Map([]Mapping{
		{Key: key6, Server: netip.MustParseAddrPort("[" + fx6Server + "]:5201")},
		{Key: key4, Server: netip.MustParseAddrPort(fxServer + ":5201")},
	}); err != nil {
		t.Fatal(err)
	}
	out, err := nftList(t, f.Relay, "list", "table", "ip6", TableName)
	if err != nil || !strings.Contains(out, fx6Client+" . 40000 : "+fx6Server+" . 5201") {
		t.Fatalf("IPv6 mapping not in the ip6 map (%v):\n%s", err, out)
	}
	if out4, err := nftList(t, f.Relay, "list", "table", "ip", TableName); err != nil || !strings.Contains(out4, fxClient+" . 40000 : "+fxServer+" . 5201") || strings.Contains(out4, fx6Client) {
		t.Fatalf("IPv4 table (%v):\n%s", err, out4)
	}

	// Through the detour, both families; the servers have no route back to
	// the client, so this works only with DNAT and masquerade.
	c, err := dialFrom6(t, f.Client, "["+fx6Relay+"]:40000", nil)
	if err != nil {
		t.Fatalf("connect through the IPv6 detour: %v", err)
	}
	defer c.Close()
	if err := echo(c, 100000); err != nil {
		t.Fatalf("echo through the IPv6 detour: %v", err)
	}
	if ra := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); ra != netip.MustParseAddr(fx6Relay) {
		t.Fatalf("connected to %v", ra)
	}
	c4, err := dialFrom(t, f.Client, fxRelay+":40000")
	if err != nil {
		t.Fatalf("connect through the IPv4 detour beside: %v", err)
	}
	if err := echo(c4, 1000); err != nil {
		t.Fatalf("echo through the IPv4 detour: %v", err)
	}
	c4.Close()

	// TCP segments behind IPv6 extension headers (hop-by-hop options,
	// destination options: one PadN option each) are matched like those
	// without: nftables reads the transport header after the extension
	// headers. A counter in the server's namespace proves the headers
	// arrived (forwarded through the NAT).
	for _, h := range []struct {
		name, nft string
		opt       int
	}{{"hop-by-hop", "hbh", unix.IPV6_HOPOPTS}, {"destination options", "dst", unix.IPV6_DSTOPTS}} {
		rule := "add table ip6 exthdrs\nadd chain ip6 exthdrs in { type filter hook input priority 0; }\nadd rule ip6 exthdrs in exthdr " + h.nft + " exists tcp dport 5201 counter\n"
		cmd := exec.Command("ip", "netns", "exec", f.Server, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rule)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft in the server namespace: %v\n%s", err, out)
		}
		opts := []byte{0, 0, 1, 4, 0, 0, 0, 0} // next header (kernel fills), length 0 (8 bytes), PadN of 4
		cx, err := dialFrom6(t, f.Client, "["+fx6Relay+"]:40000", func(fd uintptr) error {
			return unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, h.opt, string(opts))
		})
		if err != nil {
			t.Fatalf("connect through the IPv6 detour with a %s header: %v", h.name, err)
		}
		if err := echo(cx, 10000); err != nil {
			t.Fatalf("echo with a %s header: %v", h.name, err)
		}
		cx.Close()
		out, _ := nftList(t, f.Server, "list", "table", "ip6", "exthdrs")
		if !strings.Contains(out, "counter packets") || strings.Contains(out, "counter packets 0 ") {
			t.Fatalf("the server saw no segment with a %s header:\n%s", h.name, out)
		}
		netnstest.MustRun(t, "ip", "netns", "exec", f.Server, "nft", "delete", "table", "ip6", "exthdrs")
	}

	// Unmapped port: nothing.
	if c2, err := dialFrom6(t, f.Client, "["+fx6Relay+"]:40001", nil); err == nil {
		c2.Close()
		t.Fatal("unmapped IPv6 port reached something")
	}

	waitFor(t, "IPv6 counter", func() bool {
		cnt, err := d.CountersOf([]Key{key6, key4})
		return err == nil && cnt[key6].Bytes >= 220000 && cnt[key6].Packets > 0 && cnt[key4].Bytes >= 2000
	})
	cnt, err := d.Counters()
	if err != nil || cnt[key6].Bytes < 220000 || cnt[key4].Bytes < 2000 {
		t.Fatalf("dump %v (%v): want both families counted", cnt, err)
	}

	// Unmap: new connections stop, the established one goes on.
	if err := d.Unmap([]Key{key6}); err != nil {
		t.Fatal(err)
	}
	if c3, err := dialFrom6(t, f.Client, "["+fx6Relay+"]:40000", nil); err == nil {
		c3.Close()
		t.Fatal("new IPv6 connection after unmap")
	}
	if err := echo(c, 1000); err != nil {
		t.Fatalf("established IPv6 connection broken by unmap: %v", err)
	}
	if c4, err := dialFrom(t, f.Client, fxRelay+":40000"); err != nil {
		t.Fatalf("IPv4 mapping of the same port gone with the IPv6 one: %v", err)
	} else {
		c4.Close()
	}
	if err := d.Forget([]Key{key6}); err != nil {
		t.Fatal(err)
	}
	if cnt, _ := d.Counters(); len(cnt) != 1 {
		t.Fatalf("counters after forgetting the IPv6 mapping: %v", cnt)
	}

	// Someone deletes the ip6 table: Exists says so, Recreate restores both.
	netnstest.MustRun(t, "ip", "netns", "exec", f.Relay, "nft", "delete", "table", "ip6", TableName)
	if ok, err := d.Exists(); err != nil || ok {
		t.Fatalf("Exists() = %v, %v with the ip6 table deleted", ok, err)
	}
	if err := d.Recreate([]Mapping{{Key: key6, Server: netip.MustParseAddrPort("[" + fx6Server + "]:5201")}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Exists(); err != nil || !ok {
		t.Fatalf("Exists() = %v, %v after Recreate", ok, err)
	}
	c5, err := dialFrom6(t, f.Client, "["+fx6Relay+"]:40000", nil)
	if err != nil {
		t.Fatalf("IPv6 detour after Recreate: %v", err)
	}
	c5.Close()

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"ip", "ip6"} {
		if out, err := nftList(t, f.Relay, "list", "table", fam, TableName); err == nil {
			t.Fatalf("%s table still there after Close:\n%s", fam, out)
		}
	}
}
