package policy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Refresh (a source's detours changed): a detour that appears is used at
// once, without waiting for the connection's next poll; a NAT detour
// that no source offers any more has its subflow closed and replaced; a
// tunnel detour that is missing for a moment is left alone.
func TestRefreshUsesNewAndClosesWithdrawnDetours(t *testing.T) {
	p, src, clk := newStatic(2, d1)
	c := Conn{Token: 3, Local: client, Remote: server}
	p.Created(c)
	ins := p.Established(c)
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("Established: %v, want a subflow via r1", ins)
	}
	p.SubflowEstablished(up(ins[0], 41000))
	// A new detour (a discovered relay's grant) arrives 100 ms later.
	clk.advance(100 * time.Millisecond)
	src.mu.Lock()
	src.ds = []detour.Detour{d1, d2}
	src.mu.Unlock()
	if got := p.Tick(clk.now()); len(got) != 0 {
		t.Fatalf("Tick before the poll: %v", got)
	}
	ins = p.Refresh(clk.now())
	if len(ins) != 1 || ins[0].Action != CreateSubflow || ins[0].Detour.Relay != "r2" {
		t.Fatalf("Refresh after d2 appeared: %v, want a subflow via r2", ins)
	}
	p.SubflowEstablished(up(ins[0], 41001))
	if got := p.Refresh(clk.now()); len(got) != 0 {
		t.Fatalf("Refresh with nothing changed: %v", got)
	}
	// r1 leaves (its relay left the roster); r3 (a NAT detour) is offered.
	d4 := detour.Detour{Kind: detour.NAT, Relay: "r4", Remote: netip.MustParseAddrPort("10.0.5.2:4000")}
	src.mu.Lock()
	src.ds = []detour.Detour{d2, d4}
	src.mu.Unlock()
	ins = p.Refresh(clk.now())
	if len(ins) != 2 || ins[0].Action != DestroySubflow || ins[0].Remote != d1.Remote || ins[0].Local.Port() != 41000 ||
		ins[1].Action != CreateSubflow || ins[1].Detour.Relay != "r4" {
		t.Fatalf("Refresh after r1 was withdrawn: %v, want r1's subflow destroyed and one via r4", ins)
	}
	// A tunnel detour missing from the sources is not closed.
	p2, src2, _ := newStatic(1, d3)
	c2 := Conn{Token: 4, Local: client, Remote: server}
	ins = p2.Established(c2)
	if len(ins) != 1 {
		t.Fatalf("tunnel: %v", ins)
	}
	p2.SubflowEstablished(up(ins[0], 41002))
	src2.mu.Lock()
	src2.ds = nil
	src2.mu.Unlock()
	for _, in := range p2.Refresh(clk.now()) {
		if in.Action == DestroySubflow {
			t.Fatalf("tunnel subflow destroyed: %v", in)
		}
	}
}

// A detour withdrawn while its subflow is still connecting: the subflow
// that comes up afterwards is closed, not counted as active (it would take
// the place of the replacement).
func TestRefreshWithdrawnWhileConnecting(t *testing.T) {
	p, src, clk := newStatic(1, d1)
	c := Conn{Token: 5, Local: client, Remote: server}
	p.Created(c)
	ins := p.Established(c)
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("Established: %v, want a subflow via r1", ins)
	}
	pending := ins[0]
	src.mu.Lock()
	src.ds = []detour.Detour{d2}
	src.mu.Unlock()
	ins = p.Refresh(clk.now())
	if len(ins) != 1 || ins[0].Action != CreateSubflow || ins[0].Detour.Relay != "r2" {
		t.Fatalf("Refresh while r1's subflow connects: %v, want one via r2 (nothing to close yet)", ins)
	}
	got := p.SubflowEstablished(up(pending, 41010))
	if len(got) != 1 || got[0].Action != DestroySubflow || got[0].Local.Port() != 41010 {
		t.Fatalf("r1's subflow came up after its detour was withdrawn: %v, want it destroyed", got)
	}
	if got := p.SubflowEstablished(up(ins[0], 41011)); len(got) != 0 {
		t.Fatalf("the replacement via r2 came up: %v", got)
	}
}
