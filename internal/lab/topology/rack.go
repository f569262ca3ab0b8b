package topology

import (
	"fmt"
	"net/netip"
	"strconv"
)

// RackServers is the number of servers under the rack topology's ToR.
const RackServers = 8

// MaxRackDegree bounds the rack topology's degree (direct links per server).
const MaxRackDegree = 4

// RackNeighbours returns the servers directly linked to server i (1-based)
// in a rack of the given degree, nearest first: ring distance 1 (both
// sides), then 2, ...; an odd degree adds the opposite server (distance 4).
func RackNeighbours(i, degree int) []int {
	var out []int
	at := func(k int) int { return (i-1+k+RackServers)%RackServers + 1 }
	for k := 1; k <= degree/2; k++ {
		out = append(out, at(k), at(-k))
	}
	if degree%2 == 1 {
		out = append(out, at(RackServers/2))
	}
	return out
}

// genRack builds the GRIN rack (docs/results/rack): servers s1..s8 under one
// top-of-rack router tor, each over its own link Ui (class server, the
// per-server bottleneck, 50 Mbit/s by default, no delay), a remote host
// behind the ToR over an unshaped link X (the rest of the data centre),
// and direct links between neighbouring servers (class peer, the spare
// NIC ports GRIN uses, as fast as the server links): `degree` per server.
// A neighbour is a one-hop detour: a subflow that enters it over the peer
// link leaves the rack through the neighbour's own (idle) server link.
//
//	remote --X-- tor --U1-- s1 --P1_2-- s2 --U2-- tor ...
//
// Addresses: Ui 10.3.i.0/24 (tor .1, si .2: si's primary address), X
// 10.3.100.0/24 (tor .1, remote .2), peer links 10.4.N.0/24 in creation
// order. Each server routes by default via the ToR and reaches each
// neighbour's primary address (10.3.j.2/32) over their direct link, with
// its own primary address as the preferred source.
func genRack(p map[string]string) *Topology {
	degree, _ := strconv.Atoi(p["degree"])
	b := &topoBuilder{t: &Topology{}}
	const rate = 50 * mbit
	type peer struct{ a, b int }
	var peers []peer
	seen := map[[2]int]bool{}
	for i := 1; i <= RackServers; i++ {
		for _, j := range RackNeighbours(i, degree) {
			k := [2]int{min(i, j), max(i, j)}
			if !seen[k] {
				seen[k] = true
				peers = append(peers, peer{k[0], k[1]})
			}
		}
	}
	peerAddr := map[[2]int]netip.Addr{} // (server, neighbour) -> neighbour's address on their link
	for n, pr := range peers {
		s := netip.AddrFrom4([4]byte{10, 4, byte(n + 1), 0})
		peerAddr[[2]int{pr.a, pr.b}] = s.Next().Next()
		peerAddr[[2]int{pr.b, pr.a}] = s.Next()
	}
	b.node("tor", true)
	for i := 1; i <= RackServers; i++ {
		routes := []string{"default", fmt.Sprintf("10.3.%d.1", i)}
		for _, j := range RackNeighbours(i, degree) {
			routes = append(routes, fmt.Sprintf("10.3.%d.2/32", j), peerAddr[[2]int{i, j}].String())
		}
		// Forwarding on: a neighbour relays (its relay's NAT forwards).
		b.node(fmt.Sprintf("s%d", i), true, routes...)
	}
	// A relay grants a NAT mapping to the address its control packets
	// come from, and the agent opens the detour subflow from the address of
	// the connection's first subflow (the server link's): the routes to
	// the neighbours prefer that address as source.
	for i := 1; i <= RackServers; i++ {
		n := b.t.Node(fmt.Sprintf("s%d", i))
		for k := range n.Routes {
			if n.Routes[k].Dst.Bits() == 32 {
				n.Routes[k].Src = netip.MustParseAddr(fmt.Sprintf("10.3.%d.2", i))
			}
		}
	}
	b.node("remote", false, "default", "10.3.100.1")
	for i := 1; i <= RackServers; i++ {
		b.link(fmt.Sprintf("U%d", i), "server", "tor", fmt.Sprintf("s%d", i), fmt.Sprintf("10.3.%d.0/24", i), rate, 0)
	}
	b.link("X", "core", "tor", "remote", "10.3.100.0/24", 0, 0)
	for n, pr := range peers {
		b.link(fmt.Sprintf("P%d_%d", pr.a, pr.b), "peer", fmt.Sprintf("s%d", pr.a), fmt.Sprintf("s%d", pr.b), fmt.Sprintf("10.4.%d.0/24", n+1), rate, 0)
	}
	return b.t
}
