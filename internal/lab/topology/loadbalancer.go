package topology

import (
	"net/netip"
	"time"
)

// LoadBalancerVIP is the service address of the loadbalancer topology: the
// anycast prefix 10.0.100.0/24 that r2 routes to lb1 or lb2.
var LoadBalancerVIP = netip.MustParseAddr("10.0.100.1")

// genLoadBalancer builds the load-balancer topology (docs/results/loadbalancer):
//
//	client --L1-- r1 --L2 (core)-- r2 --B1-- b1 (backend 10.0.31.2)
//	               \              / |\--B2-- b2 (backend 10.0.32.2)
//	               L4 (core)    L5  | LA-- lb1 (one-armed L4 balancer)
//	                 \-- detour-/    \LB-- lb2 (the other instance)
//
// The service address 10.0.100.1 is anycast: r2 routes 10.0.100.0/24 to
// lb1 or lb2 (the bench switches it). A balancer (nftables, set up by the
// bench) DNATs the service to a backend chosen by a hash and masquerades
// to itself. A subflow to a backend's own address goes r1-L2-r2 (the same
// core link as the balanced path), one through the detour r1-L4-detour-L5.
// Core links 10 Mbit/s, access 20 Mbit/s, 5 ms each; the balancer links are
// unshaped.
func genLoadBalancer(map[string]string) *Topology {
	b := &topoBuilder{t: &Topology{}}
	const d = 5 * time.Millisecond
	b.node("client", false, "default", "10.0.1.2")
	b.node("r1", true, "10.0.0.0/8", "10.0.2.2")
	b.node("r2", true, "default", "10.0.2.1", "10.0.100.0/24", "10.0.21.2")
	b.node("detour", true, "default", "10.0.4.1", "10.0.31.0/24", "10.0.5.2", "10.0.32.0/24", "10.0.5.2")
	b.node("lb1", true, "default", "10.0.21.1")
	b.node("lb2", true, "default", "10.0.22.1")
	b.node("b1", false, "default", "10.0.31.1")
	b.node("b2", false, "default", "10.0.32.1")
	b.link("L1", "access", "client", "r1", "10.0.1.0/24", 20*mbit, d)
	b.link("L2", "core", "r1", "r2", "10.0.2.0/24", 10*mbit, d)
	b.link("L4", "core", "r1", "detour", "10.0.4.0/24", 10*mbit, d)
	b.link("L5", "access", "detour", "r2", "10.0.5.0/24", 20*mbit, d)
	b.link("LA", "lb", "r2", "lb1", "10.0.21.0/24", 0, 0)
	b.link("LB", "lb", "r2", "lb2", "10.0.22.0/24", 0, 0)
	b.link("B1", "access", "r2", "b1", "10.0.31.0/24", 20*mbit, 0)
	b.link("B2", "access", "r2", "b2", "10.0.32.0/24", 20*mbit, 0)
	return b.t
}
