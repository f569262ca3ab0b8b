package lab

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// The rack (GRIN, docs/results/rack): s1 reaches the remote host through the ToR
// over its own shaped server link, and its neighbours' primary addresses
// over the direct links, so a relay on a neighbour is a one-hop detour.
func TestRack(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "tc")
	topo, err := topology.Builtin("rack")
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.Set("degree", "2"); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("rk%d", os.Getpid())
	t.Cleanup(func() {
		if err := Down(name); err != nil {
			t.Errorf("Down(%s): %v", name, err)
		}
		if left := listNetns(name); len(left) > 0 {
			t.Errorf("namespaces left after Down: %v", left)
		}
	})
	l, err := Up(context.Background(), topo, name)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	if len(l.Nodes()) != 10 {
		t.Errorf("nodes %v, want tor, s1..s8, remote", l.Nodes())
	}
	if err := ping(t, l, "s1", "10.3.100.2"); err != nil {
		t.Error(err)
	}
	for _, c := range []struct{ dst, dev string }{
		{"10.3.2.2", "P1_2"}, {"10.3.8.2", "P1_8"}, {"10.3.5.2", "U1"}, {"10.3.100.2", "U1"},
	} {
		// Always from s1's primary address: a relay's grant is for the
		// address its control packets come from, and the detour subflow
		// leaves from the first subflow's address.
		if r := run(t, l, "s1", "ip", "route", "get", c.dst); !strings.Contains(r, "dev "+c.dev) || !strings.Contains(r, "src 10.3.1.2") {
			t.Errorf("s1 route to %s: %s, want dev %s src 10.3.1.2", c.dst, r, c.dev)
		}
		if err := ping(t, l, "s1", c.dst); err != nil {
			t.Error(err)
		}
	}
	// The neighbour forwards: s1 reaches the remote host through s2 when
	// routed there (what a relay's NAT does with a detour subflow).
	if r := run(t, l, "s2", "sysctl", "-n", "net.ipv4.ip_forward"); strings.TrimSpace(r) != "1" {
		t.Errorf("s2 forwarding %q", r)
	}
	if q := run(t, l, "s1", "tc", "qdisc", "show", "dev", "U1"); !strings.Contains(q, "tbf") || !strings.Contains(q, "50Mbit") {
		t.Errorf("s1's server link U1 not shaped to 50 Mbit/s: %s", q)
	}
	if q := run(t, l, "tor", "tc", "qdisc", "show", "dev", "X"); strings.Contains(q, "tbf") {
		t.Errorf("the ToR's uplink X is shaped: %s", q)
	}
}
