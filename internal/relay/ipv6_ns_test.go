package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/convert"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// dialRelay6 opens a control session over IPv6.
func dialRelay6(t *testing.T, ns string, k keys, priv proto.Key, relay netip.AddrPort) *relayconn.Conn {
	t.Helper()
	c, err := relayconn.Dial(relayconn.Relay{Name: "r6", Addr: relay, PublicKey: k.relay.Public()}, priv,
		relayconn.Options{ListenPacket: func() (net.PacketConn, error) {
			var pc net.PacketConn
			var err error
			in(t, ns, func() { pc, err = net.ListenUDP("udp6", nil) })
			if err == nil {
				t.Cleanup(func() { pc.Close() })
			}
			return pc, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRelayIPv6: the relay with listen6 grants IPv6 NAT detours to
// sessions over IPv6 (DNAT66 + masquerade through the ip6 table) with the
// IPv4 ones beside them; refuses what crosses families and IPv6
// special-use destinations as policy-denied without installing anything;
// releases, expires (established connections outlive their mapping, the
// attribution log counts their bytes) and revokes (a member removed by a
// reload loses its IPv6 mappings) like IPv4 ones.
func TestRelayIPv6(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture6(t)
	k := newKeys(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "relay.yaml")
	attrPath := filepath.Join(dir, "attribution.jsonl")
	extra := "listen6: '[" + fx6Relay + "]:45673'\nlease: 3s\nattribution_flush: 1s\nquota: {per_member: 4}\n"
	writeConfig(t, cfgPath, k, extra+"allow_destinations: [10.0.2.0/24, 'fd00:2::/64']\n")
	p := startRelay(t, f.Relay, cfgPath)
	if strings.Contains(p.stderr.String(), "level=ERROR") {
		t.Fatalf("relay errors:\n%s", p.stderr.String())
	}
	listenIn(t, f.Server, "tcp6", "["+fx6Server+"]:5201")
	listenIn(t, f.Server, "tcp6", "["+fx6Server+"]:5202")
	listenIn(t, f.Server, "tcp4", fxServer+":5201")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	relay6 := netip.MustParseAddrPort("[" + fx6Relay + "]:45673")
	server6 := netip.MustParseAddrPort("[" + fx6Server + "]:5201")
	server4 := netip.MustParseAddrPort(fxServer + ":5201")

	c6 := dialRelay6(t, f.Client, k, k.member, relay6)
	c4 := dialRelay(t, f.Client, k, k.member)

	// Cross-family and special-use destinations: policy-denied, nothing
	// installed.
	for _, c := range []struct {
		c      *relayconn.Conn
		server string
	}{
		{c6, fxServer + ":5201"},             // IPv4 server over an IPv6 session
		{c4, "[" + fx6Server + "]:5201"},     // IPv6 server over an IPv4 session
		{c6, "[::ffff:" + fxServer + "]:80"}, // IPv4-mapped: sent as IPv4 (appendAddr unmaps), so cross-family
		{c6, "[::1]:80"},
		{c6, "[fe80::1]:80"},
		{c6, "[ff02::1]:80"},
		{c6, "[fd00:9::1]:80"}, // ULA not allowed
		{c6, "[" + fx6RelayServer + "]:80"},
		{c6, "[" + fx6Relay + "]:80"},
		{c6, "[2001:db8::1]:80"},
		{c6, "[64:ff9b::a00:202]:80"},
		{c6, "[" + fx6Server + "]:25"},
	} {
		_, _, err := c.c.Grant(ctx, netip.MustParseAddrPort(c.server), 0)
		if r := proto.ReasonOf(err); r != proto.ReasonPolicyDenied {
			t.Errorf("grant %s: reason %v (%v), want policy-denied", c.server, r, err)
		}
	}
	if n4, n6 := elements(t, f.Relay), elementsOf(t, f.Relay, "ip6"); n4+n6 != 0 {
		t.Fatalf("refused grants installed %d IPv4 and %d IPv6 elements", n4, n6)
	}

	// A grant over IPv6: the detour is the relay's IPv6 address.
	d6, lease, err := c6.Grant(ctx, server6, 40600)
	if err != nil {
		t.Fatalf("IPv6 grant: %v", err)
	}
	if d6 != netip.MustParseAddrPort("["+fx6Relay+"]:40600") || lease <= 0 {
		t.Fatalf("IPv6 grant = %v lease %v, want [%s]:40600", d6, lease, fx6Relay)
	}
	d4, _, err := c4.Grant(ctx, server4, 40600)
	if err != nil || d4.Addr() != netip.MustParseAddr(fxRelay) {
		t.Fatalf("IPv4 grant beside: %v %v", d4, err)
	}
	if n4, n6 := elements(t, f.Relay), elementsOf(t, f.Relay, "ip6"); n4 != 1 || n6 != 1 {
		t.Fatalf("%d IPv4 and %d IPv6 elements, want 1 and 1", n4, n6)
	}
	if again, _, err := c6.Grant(ctx, server6, 0); err != nil || again != d6 {
		t.Fatalf("repeated IPv6 grant = %v %v, want %v", again, err, d6)
	}
	conn, err := dialIn(t, f.Client, "tcp6", d6.String())
	if err != nil {
		t.Fatalf("connect through the IPv6 detour: %v", err)
	}
	defer conn.Close()
	if err := echo(conn, 60000); err != nil {
		t.Fatalf("echo through the IPv6 detour: %v", err)
	}

	// Release: the element goes, new connections stop, the established
	// one goes on; its bytes reach the attribution log with the member.
	if err := c6.Release(ctx, d6.Port()); err != nil {
		t.Fatal(err)
	}
	if n := elementsOf(t, f.Relay, "ip6"); n != 0 {
		t.Fatalf("%d IPv6 elements after release", n)
	}
	if c2, err := dialIn(t, f.Client, "tcp6", d6.String()); err == nil {
		c2.Close()
		t.Fatal("new IPv6 connection after release")
	}
	if err := echo(conn, 1000); err != nil {
		t.Fatalf("established IPv6 connection cut by release: %v", err)
	}
	conn.Close()
	waitFor(t, "IPv6 release line with bytes", func() bool {
		for _, ev := range readAttribution(t, attrPath) {
			if ev.Event == "release" && ev.DetourPort == d6.Port() && ev.Client == fx6Client && ev.Member == "alice" && ev.Bytes != nil && *ev.Bytes >= 120000 {
				return true
			}
		}
		return false
	})

	// Expiry: the lease (3 s) ends without renewal; the established
	// connection outlives its mapping and is counted.
	de, _, err := c6.Grant(ctx, netip.MustParseAddrPort("["+fx6Server+"]:5202"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ce, err := dialIn(t, f.Client, "tcp6", de.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	waitFor(t, "IPv6 lease expiry", func() bool { return elementsOf(t, f.Relay, "ip6") == 0 })
	if err := echo(ce, 50000); err != nil {
		t.Fatalf("established IPv6 connection cut by expiry: %v", err)
	}
	if c2, err := dialIn(t, f.Client, "tcp6", de.String()); err == nil {
		c2.Close()
		t.Fatal("new IPv6 connection after expiry")
	}
	ce.Close()
	waitFor(t, "IPv6 expiry line", func() bool {
		for _, ev := range readAttribution(t, attrPath) {
			if ev.Event == "expiry" && ev.DetourPort == de.Port() && ev.Client == fx6Client && ev.Bytes != nil && *ev.Bytes >= 100000 {
				return true
			}
		}
		return false
	})

	// Revocation: alice removed from the members by a reload loses her
	// IPv6 mapping (and the IPv4 one) and is refused afterwards.
	if _, _, err := c6.Grant(ctx, server6, 40601); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c4.Grant(ctx, server4, 40602); err != nil {
		t.Fatal(err)
	}
	if n := elementsOf(t, f.Relay, "ip6"); n != 1 {
		t.Fatalf("%d IPv6 elements before revocation", n)
	}
	other := newKeys(t)
	k2 := k
	k2.member = other.member
	writeConfig(t, cfgPath, k2, extra+"allow_destinations: [10.0.2.0/24, 'fd00:2::/64']\n")
	p.signal(t, syscall.SIGHUP)
	waitFor(t, "revocation of the removed member's mappings", func() bool {
		return elementsOf(t, f.Relay, "ip6") == 0 && elements(t, f.Relay) == 0
	})
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	if _, _, err := c6.Grant(sctx, server6, 0); err == nil {
		t.Fatal("grant over IPv6 after revocation")
	}
}

// TestConverterIPv6Server: the converter (RFC 8803) reaches an IPv6
// server for a member whose session is over IPv4 (the converter is a TCP
// proxy, not NAT, so the families may differ), counts it in the
// attribution log, and refuses an IPv6 destination the policy refuses
// (EACCES) without connecting. A session over IPv6 gets no tickets while
// convert.listen6 is unset (unsupported: a ticket is valid only from the
// session's address); with it, tickets name the relay's IPv6 converter
// address and a conversion over IPv6 works.
func TestConverterIPv6Server(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	testenv.MPTCP(t)
	f := newFixture6(t)
	k := newKeys(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "relay.yaml")
	base := fmt.Sprintf("listen6: '[%s]:45673'\nallow_destinations: [10.0.2.0/24, 'fd00:2::/64']\n", fx6Relay)
	writeConfig(t, cfgPath, k, base+fmt.Sprintf("convert: {enabled: true, listen: '%s:%d'}\n", fxRelay, DefaultConvertPort))
	for _, ns := range []string{f.Relay, f.Client} {
		in(t, ns, func() {
			if err := os.WriteFile("/proc/sys/net/ipv4/tcp_fastopen", []byte("3"), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
	p := startRelay(t, f.Relay, cfgPath)
	listenIn(t, f.Server, "tcp6", "["+fx6Server+"]:5201")
	listenIn(t, f.Server, "tcp4", fxServer+":5201")
	c := dialRelay(t, f.Client, k, k.member)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conv, tickets, _, err := c.Convert(ctx, 2)
	if err != nil {
		t.Fatalf("convert tickets: %v\n%s", err, p.stderr.String())
	}
	server := netip.MustParseAddrPort("[" + fx6Server + "]:5201")
	dial := func(conv, dst netip.AddrPort, ticket []byte) (net.Conn, error) {
		var conn net.Conn
		var err error
		in(t, f.Client, func() {
			conn, err = convert.Dial(ctx, conv, dst, ticket, convert.DialOptions{Timeout: 5 * time.Second})
		})
		return conn, err
	}
	conn, err := dial(conv, server, tickets[0][:])
	if err != nil {
		t.Fatalf("conversion to an IPv6 server: %v\n%s", err, p.stderr.String())
	}
	if err := echo(conn, 60000); err != nil {
		t.Fatalf("echo through the converter to an IPv6 server: %v", err)
	}
	conn.Close()
	if _, err := dial(conv, netip.MustParseAddrPort("[fd00:9::1]:80"), tickets[1][:]); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("conversion to a refused IPv6 destination: %v, want EACCES", err)
	}
	waitFor(t, "convert line for the IPv6 server", func() bool {
		for _, ev := range readAttribution(t, filepath.Join(dir, "attribution.jsonl")) {
			if ev.Event == "convert" && ev.Member == "alice" && ev.Server == server.String() && ev.Result == "ok" &&
				ev.BytesUp != nil && *ev.BytesUp == 60000 {
				return true
			}
		}
		return false
	})
	relay6 := netip.MustParseAddrPort("[" + fx6Relay + "]:45673")
	if _, _, _, err := dialRelay6(t, f.Client, k, k.member, relay6).Convert(ctx, 1); proto.ReasonOf(err) != proto.ReasonUnsupported {
		t.Fatalf("tickets over an IPv6 session without convert.listen6: %v, want unsupported", err)
	}

	// With convert.listen6 (applied at start).
	p.signal(t, syscall.SIGTERM)
	_ = p.wait(t)
	writeConfig(t, cfgPath, k, base+fmt.Sprintf("convert: {enabled: true, listen: '%s:%d', listen6: '[%s]:%d'}\n", fxRelay, DefaultConvertPort, fx6Relay, DefaultConvertPort))
	p = startRelay(t, f.Relay, cfgPath)
	var conv6 netip.AddrPort
	var tickets6 [][proto.TicketLen]byte
	waitFor(t, "tickets over IPv6", func() bool {
		conv6, tickets6, _, err = dialRelay6(t, f.Client, k, k.member, relay6).Convert(ctx, 2)
		return err == nil
	})
	if conv6 != netip.MustParseAddrPort(fmt.Sprintf("[%s]:%d", fx6Relay, DefaultConvertPort)) {
		t.Fatalf("converter over IPv6 at %v", conv6)
	}
	for i, dst := range []netip.AddrPort{server, netip.MustParseAddrPort(fxServer + ":5201")} {
		conn, err := dial(conv6, dst, tickets6[i][:])
		if err != nil {
			t.Fatalf("conversion over IPv6 to %v: %v\n%s", dst, err, p.stderr.String())
		}
		if err := echo(conn, 30000); err != nil {
			t.Fatalf("echo through the IPv6 converter to %v: %v", dst, err)
		}
		conn.Close()
	}
	// The IPv4 converter still serves IPv4 sessions.
	conv4, t4, _, err := dialRelay(t, f.Client, k, k.member).Convert(ctx, 1)
	if err != nil || !conv4.Addr().Is4() {
		t.Fatalf("IPv4 tickets beside: %v %v", conv4, err)
	}
	conn, err = dial(conv4, server, t4[0][:])
	if err != nil {
		t.Fatalf("IPv4 converter with the IPv6 one beside: %v", err)
	}
	conn.Close()
}

// TestGossipOverIPv6: two relays gossip over IPv6 only (bind, join and
// advertise are IPv6 addresses); each one's roster holds both, and each
// entry announces both control addresses (listen and listen6, the default
// announce), so members can reach a discovered relay over either family.
func TestGossipOverIPv6(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	a, b := netnstest.New(t, "tg6a"), netnstest.New(t, "tg6b")
	for _, ns := range []*netnstest.NS{a, b} {
		for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
			if err := ns.Sysctl(k, "0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	netnstest.LinkNamed(t, a, "g0", "10.78.0.1/24", b, "g0", "10.78.0.2/24")
	a.Addr(t, "g0", "fd00:78::1/64")
	b.Addr(t, "g0", "fd00:78::2/64")
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	now := time.Now()
	type relayNS struct {
		ns  *netnstest.NS
		key proto.Key
	}
	relays := []relayNS{{ns: a}, {ns: b}}
	for i := range relays {
		relays[i].key, _ = proto.GenerateKey()
		cert := writeRelayCert(t, auth, dir, fmt.Sprintf("r%d.cert", i), fmt.Sprintf("relay%d", i), relays[i].key, now)
		cfg := fmt.Sprintf(`listen: 10.78.0.%d:%d
listen6: '[fd00:78::%d]:%d'
private_key: %s
ports: 40000-40999
collective:
  authority: %s
  certificate_file: %s
  gossip:
    bind: '[fd00:78::%d]:7946'
    join: ['[fd00:78::1]:7946']
    secret_file: %s
`, i+1, DefaultPort, i+1, DefaultPort, relays[i].key, auth.Public(), cert, i+1, writeGossipKey(t, dir))
		path := filepath.Join(dir, fmt.Sprintf("r%d.yaml", i))
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		startRelay(t, relays[i].ns.Name, path)
	}
	roster := func(ns string) []RosterRelay {
		var st *Status
		var err error
		in(t, ns, func() { st, err = QueryStatus(2 * time.Second) })
		if err != nil || st.Roster == nil {
			return nil
		}
		return st.Roster.Relays
	}
	waitLong(t, 20*time.Second, "both relays in both rosters over IPv6 gossip", func() bool {
		return len(roster(a.Name)) == 2 && len(roster(b.Name)) == 2
	})
	for _, e := range roster(a.Name) {
		i := 0
		if e.Name == "relay1" {
			i = 1
		}
		want := []netip.AddrPort{
			netip.MustParseAddrPort(fmt.Sprintf("10.78.0.%d:%d", i+1, DefaultPort)),
			netip.MustParseAddrPort(fmt.Sprintf("[fd00:78::%d]:%d", i+1, DefaultPort)),
		}
		if len(e.Addrs) != 2 || e.Addrs[0] != want[0] || e.Addrs[1] != want[1] {
			t.Errorf("roster entry %s announces %v, want %v", e.Name, e.Addrs, want)
		}
	}
	var st *Status
	in(t, b.Name, func() { st, err = QueryStatus(2 * time.Second) })
	if err != nil || st.Roster.Gossip != "[fd00:78::2]:7946" {
		t.Fatalf("relay b gossips at %v (%v), want [fd00:78::2]:7946", st.Roster.Gossip, err)
	}
}

// TestRelayIPv6Handover: a graceful stop with a state_file leaves the
// IPv6 mapping (and the IPv4 one beside it) in the ip6 table, the
// established IPv6 connection keeps flowing while no relay runs, and the
// next start adopts both: a new connection to the IPv6 detour port works and
// the member's grant after its new handshake over IPv6 finds the same port.
func TestRelayIPv6Handover(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture6(t)
	k := newKeys(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "relay.yaml")
	writeConfig(t, cfgPath, k, "listen6: '["+fx6Relay+"]:45673'\nstate_file: "+filepath.Join(dir, "state.json")+
		"\nallow_destinations: [10.0.2.0/24, 'fd00:2::/64']\n")
	p := startRelay(t, f.Relay, cfgPath)
	listenIn(t, f.Server, "tcp6", "["+fx6Server+"]:5201")
	listenIn(t, f.Server, "tcp4", fxServer+":5201")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c6 := dialRelay6(t, f.Client, k, k.member, netip.MustParseAddrPort("["+fx6Relay+"]:45673"))
	server6 := netip.MustParseAddrPort("[" + fx6Server + "]:5201")
	d6, _, err := c6.Grant(ctx, server6, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := dialRelay(t, f.Client, k, k.member).Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0); err != nil {
		t.Fatal(err)
	}
	conn, err := dialIn(t, f.Client, "tcp6", d6.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := echo(conn, 30000); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGTERM)
	if err := p.wait(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}
	if n4, n6 := elements(t, f.Relay), elementsOf(t, f.Relay, "ip6"); n4 != 1 || n6 != 1 {
		t.Fatalf("after SIGTERM with a state_file: %d IPv4 and %d IPv6 elements, want both left", n4, n6)
	}
	if err := echo(conn, 30000); err != nil {
		t.Fatalf("established IPv6 connection broken while no relay runs: %v", err)
	}
	p2 := startRelay(t, f.Relay, cfgPath)
	waitFor(t, "relay serving", func() bool { return strings.Contains(p2.stderr.String(), "relay serving") })
	if n4, n6 := elements(t, f.Relay), elementsOf(t, f.Relay, "ip6"); n4 != 1 || n6 != 1 {
		t.Fatalf("after the restart: %d IPv4 and %d IPv6 elements, want both adopted\n%s", n4, n6, p2.stderr.String())
	}
	if err := echo(conn, 30000); err != nil {
		t.Fatalf("established IPv6 connection broken by the restart: %v", err)
	}
	if c2, err := dialIn(t, f.Client, "tcp6", d6.String()); err != nil {
		t.Fatalf("new connection to the adopted IPv6 detour port: %v", err)
	} else {
		c2.Close()
	}
	if again, _, err := c6.Grant(ctx, server6, 0); err != nil || again != d6 {
		t.Fatalf("grant after the restart = %v %v, want the adopted %v", again, err, d6)
	}
	// relay status shows both control addresses and the IPv6 mapping.
	var st *Status
	in(t, f.Relay, func() { st, err = QueryStatus(3 * time.Second) })
	if err != nil || st.Listen6 != "["+fx6Relay+"]:45673" || st.Mappings != 2 {
		t.Fatalf("relay status: %+v %v, want listen6 [%s]:45673 and 2 mappings", st, err, fx6Relay)
	}
}
