package agent_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/kerneltest"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// crossSetup: the server's IPv6 address in the agent's other_family
// mapping, an IPv6 NAT detour toward it (relay6) beside the IPv4 one, and
// client6 as the route lookup's source for IPv6.
func crossSetup() (opts agent.Options, src detour.Source, relay6 netip.AddrPort, client6 netip.Addr) {
	server6 := netip.MustParseAddrPort("[fd00:2::2]:5201")
	relay6 = netip.MustParseAddrPort("[fd00:3::2]:4000")
	client6 = netip.MustParseAddr("fd00:1::1")
	e6 := static.Entry{Detour: detour.Detour{Kind: detour.NAT, Relay: "r6", Remote: relay6},
		Servers: []netip.Prefix{netip.PrefixFrom(server6.Addr(), 128)}, Port: server6.Port()}
	opts = agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static,
		OtherFamily: map[netip.Addr][]netip.Addr{server.Addr(): {server6.Addr()}},
		SourceFor:   func(netip.Addr) (netip.Addr, error) { return client6, nil }}
	return opts, static.New([]static.Entry{natDetour("r1", relay1), e6}), relay6, client6
}

// The agent tells an AF_INET6 socket's IPv4 connection (its events carry
// IPv4-mapped addresses) from an AF_INET one: only the former gets the
// IPv6 detour toward the server's mapped IPv6 address, from the address
// the route lookup gives; status says which and why.
func TestAgentCrossFamilyByEventFamily(t *testing.T) {
	opts, src, relay6, client6 := crossSetup()
	h := run(t, opts, src)
	emit := func(tok uint32, family uint16, local, remote netip.AddrPort) {
		for _, typ := range []mptcppm.EventType{mptcppm.EventCreated, mptcppm.EventEstablished} {
			h.k.Emit(mptcppm.Event{Type: typ, Token: tok, Family: family, Local: local, Remote: remote})
		}
	}
	mapped := func(ap netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
	}
	emit(1, 2, client, server)                  // AF_INET
	emit(2, 10, mapped(client), mapped(server)) // AF_INET6, IPv4-mapped
	in, _ := h.wait(0, "IPv6 detour for the AF_INET6 connection", creates(relay6))
	if in.Token != 2 || in.Local.Addr() != client6 {
		t.Fatalf("create %v: want token 2 from %s", in, client6)
	}
	h.wait(0, "IPv4 detour of the AF_INET connection", func(in policy.Intent) bool { return in.Token == 1 && in.Remote == relay1 })
	time.Sleep(100 * time.Millisecond)
	for _, c := range h.k.Commands() {
		if c.Token == 1 && c.Remote == relay6 {
			t.Fatalf("IPv6 detour %v on the AF_INET connection", c)
		}
	}
	st := h.a.Status()
	byTok := map[string]agent.ConnStatus{}
	for _, c := range st.Connections {
		byTok[c.Token] = c
	}
	if c := byTok["00000001"]; c.Socket != "AF_INET" || !strings.Contains(c.CrossFamily, "no cross-family detour: the connection's socket is AF_INET") {
		t.Errorf("AF_INET connection: socket %q, cross %q", c.Socket, c.CrossFamily)
	}
	if c := byTok["00000002"]; c.Socket != "AF_INET6" || !strings.Contains(c.CrossFamily, "from mapping") {
		t.Errorf("AF_INET6 connection: socket %q, cross %q", c.Socket, c.CrossFamily)
	}
	if len(st.Families) != 2 || st.Families[0].Connections != 2 || st.Families[0].OnInet6 != 1 || st.Families[1].Detours != 1 {
		t.Errorf("families %+v", st.Families)
	}
}

// TestAgentAdoptsAFInet6ConnectionAsCrossFamily: a connection adopted from
// the kernel's table at start (inet_diag unmaps the addresses of an
// AF_INET6 socket) keeps its socket family and gets its IPv6 detour.
func TestAgentAdoptsAFInet6ConnectionAsCrossFamily(t *testing.T) {
	opts, src, relay6, _ := crossSetup()
	k := kerneltest.New()
	k.SetConnections([]mptcppm.Connection{
		{Token: 7, State: 1, Local: client, Remote: server, Inet6: true},
		{Token: 8, State: 1, Local: client, Remote: server},
	})
	a := agent.New(opts, nil, k, nil, src)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); k.Close(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var got6, wrong6 bool
		for _, c := range k.Commands() {
			if c.Action == policy.CreateSubflow && c.Remote == relay6 {
				got6 = got6 || c.Token == 7
				wrong6 = wrong6 || c.Token == 8
			}
		}
		if wrong6 {
			t.Fatal("IPv6 detour on the adopted AF_INET connection")
		}
		if got6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no IPv6 detour for the adopted AF_INET6 connection; commands %v", k.Commands())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range a.Status().Connections {
		if c.Token == "00000007" && c.Socket != "AF_INET6" {
			t.Errorf("adopted connection 7: socket %q, want AF_INET6", c.Socket)
		}
	}
}
