package relay

import (
	"context"
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
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// Key rotation without dropping detours. A member holds a
// mapping with a connection through it. The relay's key is replaced by
// SIGHUP (old key as previous_private_key): the established session, the
// mapping and the connection keep working; new sessions to the new key and
// to the old one are served. The member rotates its own key (new key, new
// certificate): the new key gets its own mapping while the old key's
// session and mapping keep working. Without previous_private_key (second
// reload), handshakes to the old relay key are not answered, the
// established session still is. Revoking the member's old certificate
// drops the old key's mapping only.
func TestKeyRotation(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	attach := starNet(t, "cgh", 79) // a star: every namespace off a router on its own /24
	client, _ := attach("cgc", 100)
	server, serverAddr := attach("cgs", 200)
	relayNS, relayAddr := attach("cgr", 1)
	if err := relayNS.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	startSink(t, server.Name, serverAddr+":5201")

	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	crlPath := filepath.Join(dir, "crl.txt")
	crl := auth.Revoke(nil, time.Now())
	if err := os.WriteFile(crlPath, []byte(crl.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	gen := func() proto.Key {
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	r1, r2 := gen(), gen()
	cfgPath := filepath.Join(dir, "relay.yaml")
	writeCfg := func(key, previous proto.Key) {
		prev := ""
		if !previous.IsZero() {
			prev = fmt.Sprintf("previous_private_key: %s\n", previous)
		}
		cfg := fmt.Sprintf(`listen: %s:%d
private_key: %s
%sports: 40000-40999
allow_destinations: [10.79.0.0/16]
collective: {authority: %s, crl_file: %s}
`, relayAddr, DefaultPort, key, prev, auth.Public(), crlPath)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(r1, proto.Key{})
	p := startRelay(t, relayNS.Name, cfgPath)
	waitFor(t, "relay serving", func() bool { return strings.Contains(p.stderr.String(), "relay serving") })
	reloads := 0
	reload := func() {
		reloads++
		p.signal(t, syscall.SIGHUP)
		waitFor(t, "reload", func() bool { return strings.Count(p.stderr.String(), "configuration reloaded") == reloads })
	}

	now := time.Now()
	m1 := gen()
	c1, err := auth.Issue(m1.Public(), "alice", collective.RoleClient, now.Add(-2*time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(member proto.Key, cert *collective.Certificate, relayKey proto.Key) *relayconn.Conn {
		c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: netip.MustParseAddrPort(fmt.Sprintf("%s:%d", relayAddr, DefaultPort)), PublicKey: relayKey.Public()}, member,
			relayconn.Options{Certificate: cert.Bytes(), ListenPacket: func() (net.PacketConn, error) { return udpIn(t, client.Name, ""), nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	srv := netip.MustParseAddrPort(serverAddr + ":5201")
	grant := func(c *relayconn.Conn) (netip.AddrPort, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		d, _, err := c.Grant(ctx, srv, 0)
		return d, err
	}
	renew := func(c *relayconn.Conn, d netip.AddrPort) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := c.Renew(ctx, d.Port())
		return err
	}

	// Before: alice's mapping and a connection through it.
	old := dial(m1, c1, r1)
	d1, err := grant(old)
	if err != nil {
		t.Fatalf("grant: %v\n%s", err, p.stderr.String())
	}
	conn, err := dialFrom(t, client.Name, d1.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := echo(conn, 1000); err != nil {
		t.Fatal(err)
	}

	// The relay's key rotates; the old one stays accepted.
	writeCfg(r2, r1)
	reload()
	if !strings.Contains(p.stderr.String(), "new relay key") {
		t.Fatal("no log line for the new key")
	}
	if err := echo(conn, 1000); err != nil {
		t.Fatalf("connection through the mapping after the relay's key rotation: %v", err)
	}
	if err := renew(old, d1); err != nil {
		t.Fatalf("renew on the session established before the rotation: %v", err)
	}
	if n := elements(t, relayNS.Name); n != 1 {
		t.Fatalf("%d mappings after the rotation, want 1", n)
	}
	if d, err := grant(dial(m1, c1, r2)); err != nil || d != d1 {
		t.Fatalf("new session to the new key: %v %v (want the same mapping %v)", d, err, d1)
	}
	if _, err := grant(dial(m1, c1, r1)); err != nil {
		t.Fatalf("new session to the previous key: %v", err)
	}

	// The member rotates its key: new key, new certificate.
	m2 := gen()
	c2, err := auth.Issue(m2.Public(), "alice", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	d2, err := grant(dial(m2, c2, r2))
	if err != nil {
		t.Fatalf("grant for the member's new key: %v", err)
	}
	if d2 == d1 || elements(t, relayNS.Name) != 2 {
		t.Fatalf("new key's mapping %v (old %v), %d mappings", d2, d1, elements(t, relayNS.Name))
	}
	if err := renew(old, d1); err != nil {
		t.Fatalf("the old key's renew after the member's rotation: %v", err)
	}
	if err := echo(conn, 1000); err != nil {
		t.Fatalf("connection of the old key after the member's rotation: %v", err)
	}
	c2conn, err := dialFrom(t, client.Name, d2.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2conn.Close()
	if err := echo(c2conn, 1000); err != nil {
		t.Fatalf("connection through the new key's mapping: %v", err)
	}

	// The previous relay key removed: new handshakes to it are not answered
	// (dropped at mac1); the session established to it stays.
	writeCfg(r2, proto.Key{})
	reload()
	if _, err := grant(dial(m1, c1, r1)); err == nil {
		t.Fatal("a new session to the removed relay key was served")
	}
	if err := renew(old, d1); err != nil {
		t.Fatalf("the session established before both reloads: %v", err)
	}

	// The old certificate revoked: the old key's mapping goes, the new one stays.
	crl = auth.Revoke(crl, time.Now(), c1.Serial)
	tmp := crlPath + ".new"
	if err := os.WriteFile(tmp, []byte(crl.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, crlPath); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old key's mapping removed", func() bool { return elements(t, relayNS.Name) == 1 })
	if err := echo(c2conn, 1000); err != nil {
		t.Fatalf("the new key's connection after the old certificate's revocation: %v", err)
	}
}
