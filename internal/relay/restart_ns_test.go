package relay

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A relay with a state_file stopped with SIGTERM (systemctl restart) hands
// its mappings over: the established connection through the detour is not
// reset while no relay runs nor after the next start, which adopts the
// mapping (same detour port for a new connection and for the agent's next
// grant). Without the handover the stop removed the table and its NAT
// hooks, and the connection's next segment met a closed port (reset).
func TestRelaySIGTERMHandsMappingsOver(t *testing.T) {
	statePath := filepath.Join(t.TempDir(), "relay-state.json")
	f, _, cfgPath, p, c := relayLine(t, "state_file: "+statePath+"\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := netip.MustParseAddrPort(fxServer + ":5201")
	d0, _, err := c.Grant(ctx, server, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dialFrom(t, f.Client, d0.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := echo(conn, 50000); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGTERM)
	if err := p.wait(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}
	if n := elements(t, f.Relay); n != 1 {
		t.Fatalf("after SIGTERM with a state_file: %d elements, want the mapping left in place", n)
	}
	if err := echo(conn, 50000); err != nil {
		t.Fatalf("established detour connection broken while no relay runs: %v", err)
	}
	p2 := startRelay(t, f.Relay, cfgPath)
	waitFor(t, "relay serving", func() bool { return strings.Contains(p2.stderr.String(), "relay serving") })
	if !strings.Contains(p2.stderr.String(), "adopted the mappings of the previous run") {
		t.Fatalf("no adoption logged:\n%s", p2.stderr.String())
	}
	if n := elements(t, f.Relay); n != 1 {
		t.Fatalf("after the restart: %d elements, want the adopted mapping", n)
	}
	if err := echo(conn, 50000); err != nil {
		t.Fatalf("established detour connection broken by the restart: %v", err)
	}
	c2, err := dialFrom(t, f.Client, d0.String())
	if err != nil {
		t.Fatalf("new connection to the adopted detour port: %v", err)
	}
	c2.Close()
	// The agent's session died with the relay: it hand shakes again and
	// its grant for the same server finds the adopted mapping.
	d1, _, err := c.Grant(ctx, server, 0)
	if err != nil {
		t.Fatalf("grant after the restart: %v", err)
	}
	if d1 != d0 {
		t.Fatalf("grant after the restart gave %v, want the adopted %v", d1, d0)
	}
	// A second stop and a kill of the next run: nothing is adopted twice.
	p2.signal(t, syscall.SIGTERM)
	if err := p2.wait(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}
	if err := echo(conn, 50000); err != nil {
		t.Fatalf("established detour connection broken by the second stop: %v", err)
	}
}
