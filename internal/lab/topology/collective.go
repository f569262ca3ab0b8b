package topology

import (
	"fmt"
	"strconv"
)

// Bounds of the collective topology's parameters: relays + clients + the
// server and the hub stay within MaxNodes.
const (
	MaxCollectiveRelays  = 40
	MaxCollectiveClients = 16
)

// checkCollective validates one parameter of the collective topology.
func checkCollective(key, value string) error {
	n, err := strconv.Atoi(value)
	switch key {
	case "relays":
		if err != nil || n < 2 || n > MaxCollectiveRelays {
			return fmt.Errorf("relays must be a number from 2 to %d, not %q", MaxCollectiveRelays, value)
		}
	case "clients":
		if err != nil || n < 1 || n > MaxCollectiveClients {
			return fmt.Errorf("clients must be a number from 1 to %d, not %q", MaxCollectiveClients, value)
		}
	}
	return nil
}

// genCollective builds the Detour Collective's lab (docs/collective.md): N relays,
// M clients and a server, each on its own link to one router (a star):
//
//	client1..M --Ci-- hub --Ri-- relay1..N
//	                   |
//	                   S
//	                   |
//	                 server
//
// Client i is 10.1.i.2 (hub 10.1.i.1), relay i 10.2.i.2 (hub 10.2.i.1),
// the server 10.0.3.2 (hub 10.0.3.1); every leaf routes by default to the
// hub, relays forward (NAT detours go client-hub-relay-hub-server). The
// links are unshaped (no rate, delay or loss): the scenario measures
// discovery and failure detection, not bandwidth, and 20 relays with
// delay lines would not fit 2 cores. --set all.rate=100mbit etc. shape them.
func genCollective(p map[string]string) *Topology {
	relays, _ := strconv.Atoi(p["relays"])
	clients, _ := strconv.Atoi(p["clients"])
	b := &topoBuilder{t: &Topology{}}
	b.node("hub", true)
	b.node("server", false, "default", "10.0.3.1")
	b.link("S", "server", "hub", "server", "10.0.3.0/24", 0, 0)
	for i := 1; i <= clients; i++ {
		name := fmt.Sprintf("client%d", i)
		b.node(name, false, "default", fmt.Sprintf("10.1.%d.1", i))
		b.link(fmt.Sprintf("C%d", i), "client", "hub", name, fmt.Sprintf("10.1.%d.0/24", i), 0, 0)
	}
	for i := 1; i <= relays; i++ {
		name := fmt.Sprintf("relay%d", i)
		b.node(name, true, "default", fmt.Sprintf("10.2.%d.1", i))
		b.link(fmt.Sprintf("R%d", i), "relay", "hub", name, fmt.Sprintf("10.2.%d.0/24", i), 0, 0)
	}
	return b.t
}
