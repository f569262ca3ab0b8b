package tunnel

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestTunnelEndToEnd: two clients get distinct addresses from one relay,
// TCP through the tunnel reaches the server masqueraded to the relay's
// address, the MSS is clamped to the relay's tunnel MTU, the destination
// policy holds, an unknown key gets nothing, and everything is removed on
// Close.
func TestTunnelEndToEnd(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	srv := newServer(t, tp, genKey(t))
	if srv.Backend() != Embedded {
		t.Logf("backend %s", srv.Backend())
	}
	k1, k2 := genKey(t), genKey(t)
	a1, err := srv.Offer(k1.PublicKey(), tp.relayEndpoint(1).Addr())
	if err != nil {
		t.Fatal(err)
	}
	a2, err := srv.Offer(k2.PublicKey(), tp.relayEndpoint(2).Addr())
	if err != nil {
		t.Fatal(err)
	}
	if !tunSubnet.Contains(a1.Address.Addr()) || !tunSubnet.Contains(a2.Address.Addr()) || a1.Address == a2.Address {
		t.Fatalf("allocations %s and %s: want two distinct addresses in %s", a1.Address, a2.Address, tunSubnet)
	}
	again, err := srv.AddPeer(k1.PublicKey())
	if err != nil || again != a1.Address {
		t.Fatalf("AddPeer again = %s, %v; want the stable %s", again, err, a1.Address)
	}
	// The client runs the default MTU (1420), the relay 1380: only the
	// relay's clamp can bring the client's MSS down to 1380-40.
	a1.MTU = 0
	c1 := newClient(t, tp.c1, 0, k1, a1)
	c2 := newClient(t, tp.c2, 0, k2, a2)

	echo := echoServer(t, tp.server, serverAddr, false)
	seen, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 10*time.Second)
	if err != nil {
		t.Fatalf("TCP through tunnel 1: %v", err)
	}
	if ap := netip.MustParseAddrPort(seen); ap.Addr() != relayUplink {
		t.Errorf("server saw %s, want the relay's address %s (masquerade)", seen, relayUplink)
	}
	seen, _, err = retryExchange(t, tp.c2, c2.Address(), echo, 10*time.Second)
	if err != nil {
		t.Fatalf("TCP through tunnel 2: %v", err)
	}
	if ap := netip.MustParseAddrPort(seen); ap.Addr() != relayUplink {
		t.Errorf("server saw %s for client 2, want %s", seen, relayUplink)
	}
	// Normal traffic from c1 is untouched: it reaches the server directly.
	seen, err = exchange(t, tp.c1, netip.Addr{}, echo, 1000, 2*time.Second)
	if err != nil || netip.MustParseAddrPort(seen).Addr() != netip.MustParseAddr("192.0.2.2") {
		t.Errorf("direct connection: seen %q, %v; want 192.0.2.2", seen, err)
	}

	t.Run("mss-clamp", func(t *testing.T) {
		c, err := dial(t, tp.c1, c1.Address(), echo, false, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, _ := c.SyscallConn()
		var info *unix.TCPInfo
		rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if err != nil {
			t.Fatal(err)
		}
		if max := uint32(1380 - 40); info.Snd_mss > max {
			t.Errorf("client send MSS %d > %d: relay did not clamp to its tunnel MTU", info.Snd_mss, max)
		}
	})

	// Someone on the relay's uplink routes a member's inner address to the
	// relay: a connection it opens must not reach the member (the tunnel
	// carries the member's own connections and their replies only).
	t.Run("inbound-new", func(t *testing.T) {
		inner := echoServer(t, tp.c1, c1.Address(), false)
		nsRun(t, tp.server, "ip", "route", "replace", tunSubnet.String(), "via", relayUplink.String())
		defer nsRun(t, tp.server, "ip", "route", "del", tunSubnet.String())
		if c, err := dial(t, tp.server, netip.Addr{}, inner, false, 1500*time.Millisecond); err == nil {
			c.Close()
			t.Fatalf("a connection from the relay's uplink reached member %s through the tunnel", inner)
		}
		out := nsRun(t, tp.relay, "nft", "list", "chain", "ip", TableName, "destinations")
		if !strings.Contains(out, "oifname \"mpdt-relay\" ct state ! established,related counter") {
			t.Errorf("destinations chain lacks the inbound rule:\n%s", out)
		}
		// The member's own connections still work (their replies are established).
		if _, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 5*time.Second); err != nil {
			t.Errorf("member's own connection after the inbound attempt: %v", err)
		}
	})

	t.Run("policy", func(t *testing.T) {
		denied := echoServer(t, tp.server, deniedAddr, false)
		// Reachable directly, so a failure through the tunnel is the relay's policy.
		if _, err := exchange(t, tp.c1, netip.Addr{}, denied, 100, 2*time.Second); err != nil {
			t.Fatalf("denied address not even reachable directly: %v", err)
		}
		if _, err := exchange(t, tp.c1, c1.Address(), denied, 100, 2*time.Second); err == nil {
			t.Errorf("reached %s (private) through the tunnel", deniedAddr)
		}
		out := nsRun(t, tp.relay, "nft", "list", "chain", "ip", TableName, "destinations")
		if !strings.Contains(out, "10.0.0.0/8") {
			t.Errorf("policy chain lacks the deny rule:\n%s", out)
		}
		// An allow exception opens the private address...
		allowed := testDestinations
		allowed.Allow = []netip.Prefix{netip.MustParsePrefix("10.200.0.0/24")}
		if err := srv.SetDestinations(allowed); err != nil {
			t.Fatal(err)
		}
		if _, err := exchange(t, tp.c1, c1.Address(), denied, 100, 3*time.Second); err != nil {
			t.Errorf("allowed %s not reachable through the tunnel: %v", deniedAddr, err)
		}
		// ...but an explicit deny beats the allow, also for public addresses.
		allowed.Deny = []netip.Prefix{netip.PrefixFrom(deniedAddr, 32), netip.PrefixFrom(serverAddr, 32)}
		if err := srv.SetDestinations(allowed); err != nil {
			t.Fatal(err)
		}
		for _, d := range []netip.AddrPort{denied, echo} {
			if _, err := exchange(t, tp.c1, c1.Address(), d, 100, 2*time.Second); err == nil {
				t.Errorf("denied %s reached through the tunnel", d)
			}
		}
		if err := srv.SetDestinations(testDestinations); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("unknown-key", func(t *testing.T) {
		stranger := genKey(t)
		fake := a2
		fake.Address = netip.MustParsePrefix("100.80.254.254/16")
		cs := newClient(t, tp.c2, 1, stranger, fake)
		if _, err := exchange(t, tp.c2, cs.Address(), echo, 100, 3*time.Second); err == nil {
			t.Fatal("a key the relay never admitted got through")
		}
		if hs, err := cs.LastHandshake(); err != nil || !hs.IsZero() {
			t.Errorf("unknown key: last handshake %v, %v; want none", hs, err)
		}
		st, err := srv.Status()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Peers {
			if p.PublicKey == stranger.PublicKey() {
				t.Error("relay lists the unknown key as a peer")
			}
		}
		if err := cs.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})

	t.Run("remove-peer", func(t *testing.T) {
		if err := srv.RemovePeer(k2.PublicKey()); err != nil {
			t.Fatal(err)
		}
		if _, err := exchange(t, tp.c2, c2.Address(), echo, 100, 2*time.Second); err == nil {
			t.Error("removed peer still gets through")
		}
	})

	ds := c1.Detours(echo)
	if len(ds) != 1 || ds[0].Kind != detour.Tunnel || ds[0].Local != c1.Address() || ds[0].Remote != echo {
		t.Errorf("Detours = %v", ds)
	}
	for _, c := range []*Client{c1, c2} {
		if err := c.Close(); err != nil {
			t.Errorf("client close: %v", err)
		}
	}
	if err := srv.Close(); err != nil {
		t.Errorf("server close: %v", err)
	}
	for _, ns := range []string{tp.c1, tp.c2, tp.relay} {
		assertClean(t, ns)
	}
}

// TestServerRefusesOverlap: a subnet overlapping the relay's own routes is
// refused with a clear error and leaves nothing behind.
func TestServerRefusesOverlap(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	for _, p := range []string{"203.0.113.0/25", "10.200.0.0/16", "198.18.0.0/15"} {
		_, err := NewServer(ServerConfig{Netns: tp.relay, Subnet: netip.MustParsePrefix(p), ListenPort: relayPort,
			PrivateKey: genKey(t), Destinations: testDestinations})
		if err == nil || !strings.Contains(err.Error(), "overlaps") {
			t.Errorf("subnet %s: err = %v, want an overlap error", p, err)
		}
	}
	assertClean(t, tp.relay)
}

// TestStaleStateRemoved: leftovers of a crashed relay and agent (table,
// rule, route) are removed at the next start.
func TestStaleStateRemoved(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	nsRun(t, tp.relay, "nft", "add table ip "+TableName+"; add chain ip "+TableName+" junk")
	nsRun(t, tp.c1, "ip", "rule", "add", "from", "100.80.7.7", "lookup", "52003", "priority", "5200")
	nsRun(t, tp.c1, "ip", "route", "add", "blackhole", "default", "table", "52003")
	srv := newServer(t, tp, genKey(t))
	if out := nsRun(t, tp.relay, "nft", "list", "table", "ip", TableName); strings.Contains(out, "junk") {
		t.Errorf("stale chain survived:\n%s", out)
	}
	if err := CleanupClients(tp.c1); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	assertClean(t, tp.c1)
	assertClean(t, tp.relay)
}

// TestAllocationLostRefresh: the relay comes back without its allocations
// (new subnet, no state file); traffic into the tunnel gets nothing back, so
// the client's watchdog re-requests through Refresh (the control channel in
// the product) and the tunnel works again.
func TestAllocationLostRefresh(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	relayKey, k1 := genKey(t), genKey(t)
	srv := newServer(t, tp, relayKey)
	a1, err := srv.Offer(k1.PublicKey(), tp.relayEndpoint(1).Addr())
	if err != nil {
		t.Fatal(err)
	}
	current := make(chan *Server, 1)
	current <- srv
	refresh := func(ctx_ interface{ Done() <-chan struct{} }) (Allocation, error) {
		s := <-current
		defer func() { current <- s }()
		return s.Offer(k1.PublicKey(), tp.relayEndpoint(1).Addr())
	}
	c1 := newClient(t, tp.c1, 0, k1, a1, func(c *ClientConfig) {
		c.DeadAfter = time.Second
		c.Refresh = func(ctx context.Context) (Allocation, error) { return refresh(ctx) }
	})
	echo := echoServer(t, tp.server, serverAddr, false)
	if _, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 10*time.Second); err != nil {
		t.Fatalf("before restart: %v", err)
	}
	// A connection in use when the relay goes away: its retransmissions are
	// the traffic that gets nothing back.
	inUse, err := dial(t, tp.c1, c1.Address(), echo, false, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer inUse.Close()
	old := <-current
	old.Close()
	other := netip.MustParsePrefix("100.81.0.0/16")
	srv2 := newServer(t, tp, relayKey, func(c *ServerConfig) { c.Subnet = other })
	current <- srv2
	if _, err := inUse.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	sawWithdrawn := false
	for !other.Contains(c1.Address()) && time.Now().Before(deadline) {
		sawWithdrawn = sawWithdrawn || len(c1.Detours(echo)) == 0
		time.Sleep(100 * time.Millisecond)
	}
	if !other.Contains(c1.Address()) {
		t.Fatalf("client address %s not re-allocated from %s", c1.Address(), other)
	}
	if _, took, err := retryExchange(t, tp.c1, c1.Address(), echo, 15*time.Second); err != nil {
		for _, ns := range []string{tp.c1, tp.relay} {
			out, _ := exec.Command("sh", "-c", "ip -n "+ns+" rule; ip -n "+ns+" route show table all | grep -v local; ip -n "+ns+" addr; ip netns exec "+ns+" nft list ruleset").CombinedOutput()
			t.Logf("%s:\n%s", ns, out)
		}
		t.Fatalf("after re-allocation: %v", err)
	} else {
		t.Logf("tunnel back %v after re-allocation (detour withdrawn meanwhile: %v)", took, sawWithdrawn)
	}
	// Alive again: the detour is offered again once traffic came back.
	back := time.Now().Add(5 * time.Second)
	for len(c1.Detours(echo)) == 0 && time.Now().Before(back) {
		time.Sleep(100 * time.Millisecond)
	}
	if ds := c1.Detours(echo); len(ds) != 1 || ds[0].Local != c1.Address() {
		t.Errorf("after recovery Detours = %v", ds)
	}
	c1.Close()
	srv2.Close()
	assertClean(t, tp.c1)
	assertClean(t, tp.relay)
}
