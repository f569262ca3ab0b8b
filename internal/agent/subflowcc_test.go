package agent_test

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/kerneltest"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// recordCC records Prepare calls and whether the subflow's
// SUBFLOW_CREATE had already gone to the kernel by then.
type recordCC struct {
	mu    sync.Mutex
	k     *kerneltest.Fake
	calls []netip.Addr
	late  []netip.Addr
}

func (r *recordCC) Prepare(local, remote netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, remote)
	for _, in := range r.k.Commands() {
		if in.Action == policy.CreateSubflow && in.Remote.Addr() == remote {
			r.late = append(r.late, remote)
		}
	}
}

func (r *recordCC) Status() subflowcc.Status {
	return subflowcc.Status{State: "active", Algorithm: "bbr"}
}

func (r *recordCC) seen() ([]netip.Addr, []netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]netip.Addr(nil), r.calls...), append([]netip.Addr(nil), r.late...)
}

// subflow_congestion: the agent prepares each detour subflow's congestion
// control before its SUBFLOW_CREATE, never a subflow toward an address the
// server announced, and status shows the mechanism.
func TestAgentPreparesDetourSubflowCC(t *testing.T) {
	cc := &recordCC{}
	cfg := agent.Options{Subflows: 1, AnnouncedSubflows: 2, MaxConnections: 100, CommandWorkers: 1,
		Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: policy.Static, SubflowCC: cc}
	h := run(t, cfg, static.New([]static.Entry{natDetour("r1", relay1)}))
	cc.mu.Lock()
	cc.k = h.k
	cc.mu.Unlock()
	h.connect(21)
	h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	announced := netip.MustParseAddrPort("10.0.6.2:5201")
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventAnnounced, Token: 21, RemoteID: 1, Remote: announced})
	h.wait(0, "SUBFLOW_CREATE to the announced address", creates(announced))
	calls, late := cc.seen()
	if len(calls) != 1 || calls[0] != relay1.Addr() {
		t.Fatalf("Prepare calls %v, want one for the relay %s (none for the announced address)", calls, relay1.Addr())
	}
	if len(late) != 0 {
		t.Fatalf("Prepare after SUBFLOW_CREATE for %v", late)
	}
	if st := h.a.Status().SubflowCongestion; st == nil || st.State != "active" || st.Algorithm != "bbr" {
		t.Fatalf("status %+v", st)
	}
	// Without the mechanism, status says nothing about it.
	h2 := start(t, policy.Static)
	if st := h2.a.Status().SubflowCongestion; st != nil {
		t.Fatalf("status without subflow_congestion: %+v", st)
	}
}
