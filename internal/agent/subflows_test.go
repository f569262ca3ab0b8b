package agent_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// pairLog records what OnSubflows got, per connection (the last call).
type pairLog struct {
	mu   sync.Mutex
	last map[uint32][]agent.SubflowPair
}

func (p *pairLog) on(token uint32, pairs []agent.SubflowPair) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last[token] = slices.Clone(pairs)
}

func (p *pairLog) get(token uint32) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	pairs, ok := p.last[token]
	if !ok {
		return "never"
	}
	var s []string
	for _, x := range pairs {
		s = append(s, x.Local.String()+">"+x.Remote.String())
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), " ")
}

// wait polls until the connection's last report is want.
func (p *pairLog) wait(t *testing.T, token uint32, want string) {
	t.Helper()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if p.get(token) == want {
			return
		}
	}
	t.Fatalf("connection %d: subflow pairs %q, want %q", token, p.get(token), want)
}

// OnSubflows hears the initial subflow's 4-tuple once the connection is
// tracked, each join's while it is up (a failed join never), the pairs
// without a closed join, and nothing once the connection closes.
func TestAgentReportsSubflowPairs(t *testing.T) {
	pl := &pairLog{last: map[uint32][]agent.SubflowPair{}}
	h := run(t, agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static, OnSubflows: pl.on},
		static.New([]static.Entry{natDetour("r1", relay1), natDetour("r2", relay2)}))
	h.connect(7)
	initial := fmt.Sprintf("%s>%s", client, server)
	pl.wait(t, 7, initial)
	h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	sub1 := netip.AddrPortFrom(client.Addr(), 50001)
	sub2 := netip.AddrPortFrom(client.Addr(), 50002)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 7, Local: sub1, Remote: relay1})
	via1 := fmt.Sprintf("%s>%s", sub1, relay1)
	pl.wait(t, 7, initial+" "+via1)
	// A join that fails (SUB_CLOSED without SUB_ESTABLISHED) adds nothing.
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 7, Local: sub2, Remote: relay2, Error: 111})
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 7, Local: sub1, Remote: relay1})
	pl.wait(t, 7, initial)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventClosed, Token: 7})
	pl.wait(t, 7, "")
	// Connections the agent does not manage are never reported: events
	// are handled in order, so once connection 8 (after it) is reported,
	// 9 had its chance.
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventCreated, Token: 9, Local: server, Remote: client, ServerSide: 1})
	h.connect(8)
	pl.wait(t, 8, initial)
	if got := pl.get(9); got != "never" {
		t.Errorf("server-side connection reported with pairs %q", got)
	}
}

// A connection outside the selectors is not managed: OnSubflows never
// hears of it (it would get the subflow lowat), while a selected one
// that comes after it is reported.
func TestAgentSkipsUnselectedPairs(t *testing.T) {
	pl := &pairLog{last: map[uint32][]agent.SubflowPair{}}
	h := run(t, agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static, OnSubflows: pl.on,
		Selectors: []policy.Selector{{Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}}},
		static.New([]static.Entry{natDetour("r1", relay1)}))
	h.connect(7) // to server, outside 192.0.2.0/24
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 7, Local: netip.AddrPortFrom(client.Addr(), 50001), Remote: relay1})
	selected := netip.MustParseAddrPort("192.0.2.5:443")
	e := mptcppm.Event{Type: mptcppm.EventCreated, Token: 8, Local: client, Remote: selected}
	est := e
	est.Type = mptcppm.EventEstablished
	h.k.Emit(e, est)
	pl.wait(t, 8, fmt.Sprintf("%s>%s", client, selected))
	if got := pl.get(7); got != "never" {
		t.Errorf("connection outside the selectors reported with pairs %q", got)
	}
}

// Status carries the subflow lowat's own status when the mechanism runs.
func TestAgentStatusSubflowLowat(t *testing.T) {
	want := agent.LowatStatus{State: "active", Bytes: 65536, Pairs: 1, Sets: 2}
	h := run(t, agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static, SubflowLowat: func() agent.LowatStatus { return want }},
		static.New([]static.Entry{natDetour("r1", relay1)}))
	if st := h.a.Status(); st.SubflowLowat == nil || *st.SubflowLowat != want {
		t.Errorf("status subflow lowat %+v, want %+v", st.SubflowLowat, want)
	}
}
