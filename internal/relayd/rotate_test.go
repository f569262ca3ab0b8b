package relayd

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// Issue 29 item 4: a static member list holds a member's old and new key
// during a rotation (previous_public_key); a second entry of the same name
// is still refused, and so is a previous key that is someone's key.
func TestMemberPreviousKeyConfig(t *testing.T) {
	priv, old, newKey, other := testKey(t), testKey(t).Public(), testKey(t).Public(), testKey(t).Public()
	head := "private_key: " + priv.String() + "\nmembers:\n"
	s, err := ParseConfig([]byte(head + "  - {name: bob, public_key: " + newKey.String() + ", previous_public_key: " + old.String() + "}\n" +
		"  - {name: carol, public_key: " + other.String() + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Members[old] != "bob" || s.Members[newKey] != "bob" || s.Members[other] != "carol" || len(s.Members) != 3 {
		t.Fatalf("members: %v", s.Members)
	}
	for cfg, want := range map[string]string{
		"  - {name: bob, public_key: " + newKey.String() + "}\n  - {name: bob, public_key: " + old.String() + "}\n":                                                  "duplicate name \"bob\" (to rotate a member's key, give its new key as public_key and the old one as previous_public_key",
		"  - {name: bob, public_key: " + newKey.String() + ", previous_public_key: " + newKey.String() + "}\n":                                                       "previous_public_key (bob): the same key as public_key",
		"  - {name: carol, public_key: " + other.String() + "}\n  - {name: bob, public_key: " + newKey.String() + ", previous_public_key: " + other.String() + "}\n": "members[1].previous_public_key (bob): same key as carol",
		"  - {name: bob, public_key: " + newKey.String() + ", previous_public_key: nope}\n":                                                                          "members[0].previous_public_key: bob",
	} {
		if _, err := ParseConfig([]byte(head + cfg)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", cfg, err, want)
		}
	}
}

// The rotate path with a configured list (loader, relay, client): the old
// key's mapping carries over to the new key when the entry names the old
// key as previous_public_key; without it (new key under another name) the
// relay refuses, the client's Rotate returns the refusal and the key the
// relay holds our state under (what a tunnel may rekey to) stays the old
// one.
func TestRotateThroughConfiguredList(t *testing.T) {
	priv, oldPriv, newPriv := testKey(t), testKey(t), testKey(t)
	server := netip.MustParseAddrPort("198.51.100.1:80")
	var confirmed, session proto.Key
	run := func(t *testing.T, members string) (grant0, grant1 netip.AddrPort, rotErr error) {
		ctx, addr := loopbackRelay(t, "private_key: "+priv.String()+"\nlisten: 127.0.0.1:0\nmembers:\n"+members)
		c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: addr, PublicKey: priv.Public()}, oldPriv, relayconn.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		defer func() { confirmed, session = c.ConfirmedKey(), c.SessionKey() }()
		if grant0, _, err = c.Grant(ctx, server, 0); err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		if rotErr = c.Rotate(rctx, newPriv, nil); rotErr != nil {
			return grant0, grant1, rotErr
		}
		if grant1, _, err = c.Grant(ctx, server, 0); err != nil {
			t.Fatal(err)
		}
		return grant0, grant1, nil
	}
	t.Run("previous_public_key", func(t *testing.T) {
		g0, g1, err := run(t, "  - {name: bob, public_key: "+newPriv.Public().String()+", previous_public_key: "+oldPriv.Public().String()+"}\n")
		if err != nil {
			t.Fatalf("rotation refused: %v", err)
		}
		if g1 != g0 {
			t.Fatalf("after the rotation the same server's grant is %v, want the carried-over %v", g1, g0)
		}
		if confirmed != newPriv.Public() {
			t.Fatal("the relay confirmed the rotation but ConfirmedKey is not the new key (the tunnel would not follow)")
		}
	})
	t.Run("another name", func(t *testing.T) {
		_, _, err := run(t, "  - {name: bob, public_key: "+oldPriv.Public().String()+"}\n  - {name: bob2, public_key: "+newPriv.Public().String()+"}\n")
		var pe *proto.Error
		if err == nil || !errors.As(err, &pe) {
			t.Fatalf("rotation to a key listed under another name: %v, want a refusal", err)
		}
		// The new key's session is in use (requests), but the relay moved
		// nothing: a tunnel must keep the old key (the agent's SIGHUP path
		// and tunnelctl's follow rekey only to ConfirmedKey).
		if session != newPriv.Public() || confirmed != oldPriv.Public() {
			t.Fatalf("after a refused rotation: session key new=%v, confirmed key old=%v; want true, true", session == newPriv.Public(), confirmed == oldPriv.Public())
		}
	})
}

// The agent follows a rotated relay key (its SIGHUP path calls
// SetRelayKey with the configuration's key): a connection made with the
// relay's old key gets no answer from a relay that has only its new key,
// and works at once after SetRelayKey.
func TestClientFollowsRelayKey(t *testing.T) {
	oldRelay, newRelay, member := testKey(t), testKey(t), testKey(t)
	ctx, addr := loopbackRelay(t, "private_key: "+newRelay.String()+"\nlisten: 127.0.0.1:0\nmembers:\n  - {name: bob, public_key: "+member.Public().String()+"}\n")
	c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: addr, PublicKey: oldRelay.Public()}, member, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	server := netip.MustParseAddrPort("198.51.100.1:80")
	short, scancel := context.WithTimeout(ctx, time.Second)
	_, _, err = c.Grant(short, server, 0)
	scancel()
	if err == nil {
		t.Fatal("a grant through the relay's old key succeeded: the test proves nothing")
	}
	if c.SetRelayKey(oldRelay.Public()) {
		t.Fatal("SetRelayKey with the current key reported a change")
	}
	if !c.SetRelayKey(newRelay.Public()) {
		t.Fatal("SetRelayKey with a new key reported no change")
	}
	start := time.Now()
	quick, qcancel := context.WithTimeout(ctx, 5*time.Second)
	defer qcancel()
	if _, _, err := c.Grant(quick, server, 0); err != nil {
		t.Fatalf("grant after SetRelayKey: %v", err)
	}
	if c.Relay().PublicKey != newRelay.Public() {
		t.Fatal("Relay() does not report the new key")
	}
	t.Logf("first grant %v after SetRelayKey", time.Since(start).Round(time.Millisecond))
}

// loopbackRelay runs a relay built from the config text through the loader,
// with a fake data plane, on loopback until the test ends; it returns a
// context that ends with it and the relay's control address.
func loopbackRelay(t *testing.T, text string) (context.Context, netip.AddrPort) {
	t.Helper()
	// The tests' server 198.51.100.1 is a documentation address, refused
	// unless allowed.
	cfg, err := ParseConfig([]byte(text + "allow_destinations: [198.51.100.0/24]\n"))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := relay.New(cfg.Static, &cfg.Reloadable, relay.Deps{PacketConn: pc, DataPlane: dataplane.NewFake()})
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return ctx, srv.Addr()
}
