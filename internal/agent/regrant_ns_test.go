package agent

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// staleSource stands in for a relay source whose relay restarted without
// its state file: its detour's port is closed (the relay's kernel answers
// the subflow's SYN with a reset: ECONNREFUSED) until the agent reports the
// refusal (detour.Refuser); the fresh grant then points at the open port
// and the change is notified, as relayclient.NATSource does.
type staleSource struct {
	server         netip.AddrPort
	closed, opened detour.Detour
	changed        chan struct{}
	mu             sync.Mutex
	refused        []detour.Detour
}

func (s *staleSource) Prepare(netip.AddrPort)   {}
func (s *staleSource) Changed() <-chan struct{} { return s.changed }
func (s *staleSource) Detours(server netip.AddrPort) []detour.Detour {
	if server != s.server {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.refused) > 0 {
		return []detour.Detour{s.opened}
	}
	return []detour.Detour{s.closed}
}

func (s *staleSource) Refused(server netip.AddrPort, d detour.Detour) {
	s.mu.Lock()
	s.refused = append(s.refused, d)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// A detour subflow refused by the relay's kernel (a NAT port a restarted
// relay no longer has) is reported to its source at once, and the subflow
// comes up through the new grant: the agent does not keep retrying the
// closed port until the grant's renewal.
func TestAgentReportsRefusedDetourToSource(t *testing.T) {
	dl := upDetourLab(t, 1)
	ns := dl.l.NetnsName("client")
	dl.serve(t)
	cfg := dl.config(t, 1)
	relay := dl.relays[0] // relay:4000 is DNATed to the server
	src := &staleSource{
		server:  dl.server,
		closed:  detour.Detour{Kind: detour.NAT, Relay: "d1", Remote: netip.AddrPortFrom(relay.Addr(), 4001)}, // nothing listens: RST
		opened:  detour.Detour{Kind: detour.NAT, Relay: "d1", Remote: relay},
		changed: make(chan struct{}, 1),
	}
	start(t, cfg, src)
	c := dl.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	begin := time.Now()
	waitFor(t, 10*time.Second, "a detour subflow via the new grant after the old port refused", func() (bool, string) {
		sfs := kernelSubflows(t, ns, local)
		return has(sfs, relay), fmt.Sprint(sfs)
	})
	t.Logf("subflow via the new grant %v after the dial", time.Since(begin).Round(time.Millisecond))
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.refused) == 0 || src.refused[0] != src.closed {
		t.Fatalf("refusals reported %v, want the closed detour %v first", src.refused, src.closed)
	}
}
