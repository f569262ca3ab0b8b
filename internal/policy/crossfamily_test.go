package policy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// perServer is a detour source that answers per server address (a relay
// grants toward one address of one family).
type perServer struct {
	ds       map[netip.AddrPort][]detour.Detour
	prepared []netip.AddrPort
	released chan netip.AddrPort
}

func (s *perServer) Prepare(a netip.AddrPort) { s.prepared = append(s.prepared, a) }
func (s *perServer) Release(_ context.Context, a netip.AddrPort) error {
	if s.released != nil {
		s.released <- a
	}
	return nil
}
func (s *perServer) Detours(a netip.AddrPort) []detour.Detour { return s.ds[a] }

var (
	server6   = netip.MustParseAddrPort("[fd00:2::2]:5201")
	client6   = netip.MustParseAddr("fd00:1::1")
	d6        = detour.Detour{Kind: detour.NAT, Relay: "r6", Remote: netip.MustParseAddrPort("[fd00:3::2]:4000")}
	tunnel6   = detour.Detour{Kind: detour.Tunnel, Relay: "t6", Local: netip.MustParseAddr("fd09::2"), Remote: server6}
	sourceFor = func(dst netip.Addr) (netip.Addr, error) {
		if dst.Is4() {
			return client.Addr(), nil
		}
		return client6, nil
	}
)

func crossEngine(t *testing.T, n int, mapping map[netip.Addr][]netip.Addr, ds map[netip.AddrPort][]detour.Detour) (*Engine, *perServer, *bytes.Buffer) {
	t.Helper()
	src := &perServer{ds: ds, released: make(chan netip.AddrPort, 16)}
	var logs bytes.Buffer
	clk := &clock{t: time.Unix(1000, 0)}
	p := NewStatic(Config{Subflows: n, Now: clk.now, OtherFamily: mapping, SourceFor: sourceFor,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}, []detour.Source{src})
	return p, src, &logs
}

func creates(ins []Intent) []Intent {
	var out []Intent
	for _, in := range ins {
		if in.Action == CreateSubflow {
			out = append(out, in)
		}
	}
	return out
}

// An IPv4 connection on an AF_INET6 socket gets an IPv6 detour toward the
// server's mapped IPv6 address, chosen beside the IPv4 one, from the
// client's own IPv6 address; the v6 grant is prepared and released.
func TestCrossFamilyDetourFromMapping(t *testing.T) {
	m := map[netip.Addr][]netip.Addr{server.Addr(): {server6.Addr()}}
	p, src, _ := crossEngine(t, 2, m, map[netip.AddrPort][]detour.Detour{server: {d1}, server6: {d6}})
	c := Conn{Token: 7, Local: client, Remote: server, Inet6: true}
	p.Created(c)
	if len(src.prepared) != 2 || src.prepared[1] != server6 {
		t.Fatalf("prepared %v, want %s and %s", src.prepared, server, server6)
	}
	ins := creates(p.Established(c))
	if len(ins) != 2 {
		t.Fatalf("intents %v, want the IPv4 and the IPv6 detour", ins)
	}
	v6 := ins[1]
	if ins[0].Remote != d1.Remote || v6.Remote != d6.Remote || v6.Local.Addr() != client6 || v6.LocalID == 0 {
		t.Fatalf("intents %v: want %s, then %s from %s with its own address id", ins, d1.Remote, d6.Remote, client6)
	}
	// The subflow is recognised as the detour's when it comes up.
	p.SubflowEstablished(up(v6, 41000))
	r := p.Report()
	if got := r.Conns[0].Cross; !strings.Contains(got, "IPv6 detours toward [fd00:2::2]:5201 (from mapping)") {
		t.Fatalf("status cross = %q", got)
	}
	var paths []string
	for _, s := range r.Conns[0].Subflows {
		paths = append(paths, s.Path)
	}
	if !strings.Contains(strings.Join(paths, " "), "nat:r6") {
		t.Fatalf("subflow paths %v: want nat:r6", paths)
	}
	// A second connection to the same server holds the IPv6 grant too:
	// closing the first releases nothing, closing the second releases
	// both servers once each.
	c2 := Conn{Token: 9, Local: netip.AddrPortFrom(client.Addr(), client.Port()+1), Remote: server, Inet6: true}
	p.Created(c2)
	p.Established(c2)
	p.Closed(c.Token)
	select {
	case a := <-src.released:
		t.Fatalf("released %s while connection 9 still uses it", a)
	case <-time.After(100 * time.Millisecond):
	}
	p.Closed(c2.Token)
	got := map[netip.AddrPort]int{}
	for len(got) < 2 {
		select {
		case a := <-src.released:
			got[a]++
		case <-time.After(2 * time.Second):
			t.Fatalf("released %v after the last connection closed, want %s and %s", got, server, server6)
		}
	}
	select {
	case a := <-src.released:
		t.Fatalf("released %s twice", a)
	case <-time.After(100 * time.Millisecond):
	}
	if got[server] != 1 || got[server6] != 1 {
		t.Fatalf("released %v, want %s and %s once each", got, server, server6)
	}
}

// An AF_INET socket cannot take an IPv6 subflow (measured): no IPv6
// detour, the reason logged once however often the connection is filled.
func TestNoCrossFamilyOnAFInetSocket(t *testing.T) {
	m := map[netip.Addr][]netip.Addr{server.Addr(): {server6.Addr()}}
	p, src, logs := crossEngine(t, 2, m, map[netip.AddrPort][]detour.Detour{server: {d1}, server6: {d6}})
	c := Conn{Token: 8, Local: client, Remote: server}
	p.Created(c)
	ins := creates(p.Established(c))
	for i := 0; i < 3; i++ {
		ins = append(ins, creates(p.Refresh(time.Unix(1001, 0)))...)
		ins = append(ins, creates(p.Announced(8, 3, netip.AddrPortFrom(netip.MustParseAddr("fd00:2::3"), 0)))...)
	}
	for _, in := range ins {
		if !in.Local.Addr().Is4() || !in.Remote.Addr().Is4() {
			t.Fatalf("IPv6 subflow %v on an AF_INET socket", in)
		}
	}
	for _, a := range src.prepared {
		if a.Addr().Is6() {
			t.Fatalf("prepared %v for an AF_INET connection", a)
		}
	}
	if n := strings.Count(logs.String(), "no cross-family detour"); n != 1 {
		t.Fatalf("reason logged %d times, want once:\n%s", n, logs)
	}
	if got := p.Report().Conns[0].Cross; !strings.Contains(got, "AF_INET") {
		t.Fatalf("status cross = %q, want the AF_INET reason", got)
	}
}

// An IPv6 connection learns the server's IPv4 address from its ADD_ADDR:
// the announced subflow leaves from the client's IPv4 address (not its
// IPv6 one: the kernel refuses a mix), and IPv4 detours toward it are
// candidates like any other.
func TestCrossFamilyFromAddAddr(t *testing.T) {
	tun4 := detour.Detour{Kind: detour.Tunnel, Relay: "t4", Local: netip.MustParseAddr("10.9.0.2"), Remote: server}
	p, src, _ := crossEngine(t, 2, nil, map[netip.AddrPort][]detour.Detour{server6: {tunnel6}, server: {d1, tun4}})
	c := Conn{Token: 9, Local: netip.AddrPortFrom(client6, 40000), Remote: server6, Inet6: true}
	p.Created(c)
	ins := creates(p.Established(c))
	if len(ins) != 1 || ins[0].Local.Addr() != tunnel6.Local {
		t.Fatalf("intents %v, want the IPv6 tunnel detour", ins)
	}
	ins = creates(p.Announced(9, 2, netip.AddrPortFrom(server.Addr(), 0)))
	if len(src.prepared) != 2 || src.prepared[1] != server {
		t.Fatalf("prepared %v, want %s after the ADD_ADDR", src.prepared, server)
	}
	if len(ins) != 2 {
		t.Fatalf("intents %v, want the announced subflow and one IPv4 detour", ins)
	}
	if a := ins[0]; a.Remote != server || a.Local.Addr() != client.Addr() || a.RemoteID != 2 {
		t.Fatalf("announced subflow %v, want %s -> %s (id 2)", a, client.Addr(), server)
	}
	if d := ins[1]; d.Detour == nil || d.Remote != d1.Remote || d.Local.Addr() != client.Addr() {
		t.Fatalf("detour intent %v, want %s from %s", d, d1.Remote, client.Addr())
	}
	if got := p.Report().Conns[0].Cross; !strings.Contains(got, "(from ADD_ADDR)") {
		t.Fatalf("status cross = %q", got)
	}
}

// A detour whose two ends differ in family is never opened, and a failed
// route lookup is a logged reason, not a subflow from the wrong address.
func TestCrossFamilyRefusesMixedEnds(t *testing.T) {
	bad := detour.Detour{Kind: detour.Tunnel, Relay: "mix", Local: netip.MustParseAddr("10.9.0.2"), Remote: server6}
	m := map[netip.Addr][]netip.Addr{server.Addr(): {server6.Addr()}}
	p, _, logs := crossEngine(t, 3, m, map[netip.AddrPort][]detour.Detour{server6: {bad, d6}})
	p.cfg.SourceFor = func(netip.Addr) (netip.Addr, error) { return netip.Addr{}, errors.New("network unreachable") }
	c := Conn{Token: 10, Local: client, Remote: server, Inet6: true}
	p.Created(c)
	if ins := creates(p.Established(c)); len(ins) != 0 {
		t.Fatalf("intents %v, want none", ins)
	}
	if !strings.Contains(logs.String(), "network unreachable") {
		t.Fatalf("log lacks the route lookup's error:\n%s", logs)
	}
}

// With announced subflows off (the default), an other-family ADD_ADDR is
// not a cross-family source (a forged one would name the grants' target);
// when on, the server's REMOVE_ADDR withdraws the target and releases the
// grants toward it.
func TestCrossFamilyAddAddrOffAndRemoved(t *testing.T) {
	tun4 := detour.Detour{Kind: detour.Tunnel, Relay: "t4", Local: netip.MustParseAddr("10.9.0.2"), Remote: server}
	p, src, _ := crossEngine(t, 2, nil, map[netip.AddrPort][]detour.Detour{server: {tun4}})
	p.cfg.Announced = -1
	c := Conn{Token: 11, Local: netip.AddrPortFrom(client6, 40000), Remote: server6, Inet6: true}
	p.Created(c)
	p.Established(c)
	if ins := creates(p.Announced(11, 2, netip.AddrPortFrom(server.Addr(), 0))); len(ins) != 0 || len(src.prepared) != 1 {
		t.Fatalf("announcements off: intents %v, prepared %v; want none beyond the server's own", ins, src.prepared)
	}

	p.cfg.Announced = 1
	c.Token = 12
	p.Created(c)
	p.Established(c)
	ins := creates(p.Announced(12, 2, netip.AddrPortFrom(server.Addr(), 0)))
	if len(ins) != 2 || len(src.prepared) != 3 || src.prepared[2] != server {
		t.Fatalf("intents %v, prepared %v; want the announced subflow and the IPv4 tunnel detour, %s prepared", ins, src.prepared, server)
	}
	p.Removed(12, 2)
	select {
	case a := <-src.released:
		if a != server {
			t.Fatalf("released %s, want %s", a, server)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("grants toward the withdrawn address not released")
	}
	if ds := p.crossCandidates(p.conns[12]); len(ds) != 0 {
		t.Fatalf("candidates %v after REMOVE_ADDR, want none", ds)
	}
	var cross string
	for _, r := range p.Report().Conns {
		if r.Token == 12 {
			cross = r.Cross
		}
	}
	if !strings.Contains(cross, "withdrawn") {
		t.Fatalf("status cross = %q", cross)
	}
}

// A REMOVE_ADDR of one id does not withdraw an other-family address the
// server still announces under another id (ADD_ADDR ids are per address
// announcement; the same address may come under two).
func TestCrossFamilyRemovedKeepsAddressAnnouncedTwice(t *testing.T) {
	tun4 := detour.Detour{Kind: detour.Tunnel, Relay: "t4", Local: netip.MustParseAddr("10.9.0.2"), Remote: server}
	p, src, _ := crossEngine(t, 2, nil, map[netip.AddrPort][]detour.Detour{server: {tun4}})
	p.cfg.Announced = 1
	c := Conn{Token: 13, Local: netip.AddrPortFrom(client6, 40000), Remote: server6, Inet6: true}
	p.Created(c)
	p.Established(c)
	p.Announced(13, 2, netip.AddrPortFrom(server.Addr(), 0))
	p.Announced(13, 3, netip.AddrPortFrom(server.Addr(), 0))
	p.Removed(13, 2)
	select {
	case a := <-src.released:
		t.Fatalf("released %s although id 3 still announces it", a)
	case <-time.After(200 * time.Millisecond):
	}
	if ds := p.crossCandidates(p.conns[13]); len(ds) == 0 {
		t.Fatal("no cross-family candidates after removing one of two ids announcing the address")
	}
	p.Removed(13, 3)
	select {
	case a := <-src.released:
		if a != server {
			t.Fatalf("released %s, want %s", a, server)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("grants toward the withdrawn address not released after its last id went")
	}
}
