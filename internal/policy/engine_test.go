package policy

import (
	"context"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// list is a fixed detour source (the agent's static config source is the
// same idea); it records Prepare and Release calls.
type list struct {
	mu       sync.Mutex
	ds       []detour.Detour
	prepared []netip.AddrPort
	released chan netip.AddrPort
}

func (l *list) Prepare(s netip.AddrPort) { l.prepared = append(l.prepared, s) }
func (l *list) Detours(netip.AddrPort) []detour.Detour {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]detour.Detour(nil), l.ds...)
}
func (l *list) Release(_ context.Context, s netip.AddrPort) error {
	if l.released != nil {
		l.released <- s
	}
	return nil
}

var (
	client = netip.MustParseAddrPort("10.0.1.1:40000")
	server = netip.MustParseAddrPort("10.0.2.2:5201")
	d1     = detour.Detour{Kind: detour.NAT, Relay: "r1", Remote: netip.MustParseAddrPort("10.0.3.2:4000")}
	d2     = detour.Detour{Kind: detour.NAT, Relay: "r2", Remote: netip.MustParseAddrPort("10.0.4.2:4000")}
	d3     = detour.Detour{Kind: detour.Tunnel, Relay: "r3", Local: netip.MustParseAddr("10.9.0.2"), Remote: server}
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newStatic(n int, ds ...detour.Detour) (*Engine, *list, *clock) {
	src := &list{ds: ds, released: make(chan netip.AddrPort, 4)}
	clk := &clock{t: time.Unix(1000, 0)}
	return NewStatic(Config{Subflows: n, Now: clk.now}, []detour.Source{src}), src, clk
}

func up(in Intent, port uint16) Subflow {
	return Subflow{Token: in.Token, Local: netip.AddrPortFrom(in.Local.Addr(), port), Remote: in.Remote}
}

func TestStaticOpensNDetourSubflows(t *testing.T) {
	p, src, _ := newStatic(2, d1, d2, d3)
	c := Conn{Token: 1, Local: client, Remote: server}
	if got := p.Created(c); got != nil {
		t.Fatalf("Created returned intents %v: subflows must wait for ESTABLISHED", got)
	}
	if len(src.prepared) != 1 || src.prepared[0] != server {
		t.Fatalf("Prepare calls = %v, want one for %s", src.prepared, server)
	}
	ins := p.Established(c)
	if len(ins) != 2 || ins[0].Remote != d1.Remote || ins[1].Remote != d2.Remote {
		t.Fatalf("intents = %v, want subflows to %s and %s", ins, d1.Remote, d2.Remote)
	}
	for _, in := range ins {
		if in.Action != CreateSubflow || in.Token != 1 || in.Local != netip.AddrPortFrom(client.Addr(), 0) || in.LocalID != 0 || in.Detour == nil {
			t.Errorf("NAT detour intent %+v: want a create from the client's own address, id 0", in)
		}
	}
	// N=3 reaches the tunnel detour, which leaves from the tunnel address.
	p3, _, _ := newStatic(3, d1, d2, d3)
	ins = p3.Established(c)
	if len(ins) != 3 || ins[2].Local.Addr() != d3.Local || ins[2].Remote != server || ins[2].LocalID == 0 {
		t.Fatalf("tunnel intent = %+v, want %s -> %s with a local id of its own", ins, d3.Local, server)
	}
	// The same tunnel address keeps its id on other connections.
	again := p3.Established(Conn{Token: 2, Local: netip.MustParseAddrPort("10.0.1.1:40001"), Remote: server})
	if len(again) != 3 || again[2].LocalID != ins[2].LocalID {
		t.Fatalf("tunnel id changed between connections: %+v", again)
	}
}

func TestStaticSelectors(t *testing.T) {
	sels := []Selector{{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}, Ports: []PortRange{{5201, 5202}}}}
	for dst, want := range map[string]bool{
		"10.0.2.2:5201": true, "10.0.2.2:80": false, "10.0.3.2:5201": false,
		"127.0.0.1:5201": false, "[fe80::1]:5201": false, "[::ffff:10.0.2.9]:5202": true,
	} {
		if got := Selected(sels, netip.MustParseAddrPort(dst)); got != want {
			t.Errorf("Selected(%s) = %v, want %v", dst, got, want)
		}
	}
	if Selected(nil, netip.MustParseAddrPort("127.0.0.1:1")) || !Selected(nil, server) {
		t.Error("without selectors everything but loopback/link-local must be selected")
	}
	p := NewStatic(Config{Selectors: sels}, []detour.Source{&list{ds: []detour.Detour{d1}}})
	if ins := p.Established(Conn{Token: 1, Local: client, Remote: netip.MustParseAddrPort("10.0.2.2:22")}); len(ins) != 0 {
		t.Fatalf("unselected connection got %v", ins)
	}
	if _, err := ParsePortRange("9-3"); err == nil {
		t.Error("ParsePortRange accepted 9-3")
	}
	if r, err := ParsePortRange("80-90"); err != nil || r != (PortRange{80, 90}) {
		t.Errorf("ParsePortRange(80-90) = %v %v", r, err)
	}
}

func TestStaticReplacesFailedDetourWithBackoff(t *testing.T) {
	p, _, clk := newStatic(1, d1, d2)
	c := Conn{Token: 7, Local: client, Remote: server}
	ins := p.Established(c)
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("first subflow %v, want via r1", ins)
	}
	p.SubflowEstablished(up(ins[0], 41000))
	// The path through r1 dies (reset): replaced via r2 at once.
	dead := up(ins[0], 41000)
	dead.Errno = uint8(syscall.ECONNRESET)
	ins = p.SubflowClosed(dead)
	if len(ins) != 1 || ins[0].Detour.Relay != "r2" {
		t.Fatalf("replacement %v, want via r2", ins)
	}
	if p.Backoff(d1).IsZero() {
		t.Fatal("r1 not backed off after a reset")
	}
	// r2 refuses too, a bit later: nothing is left until r1's backoff ends.
	clk.advance(600 * time.Millisecond)
	refused := up(ins[0], 0)
	refused.Errno = uint8(syscall.ECONNREFUSED)
	if ins = p.SubflowClosed(refused); len(ins) != 0 {
		t.Fatalf("retried %v while every detour backs off", ins)
	}
	if ins = p.Tick(clk.t.Add(300 * time.Millisecond)); len(ins) != 0 {
		t.Fatalf("retried before the backoff ended: %v", ins)
	}
	clk.advance(500 * time.Millisecond)
	ins = p.Tick(clk.t)
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("after backoff got %v, want a retry via r1", ins)
	}
	// A second consecutive failure of r1 doubles its backoff.
	if ins = p.Failed(ins[0], syscall.EHOSTUNREACH); len(ins) != 0 {
		t.Fatalf("Failed returned %v with r2 still backing off", ins)
	}
	if got := p.Backoff(d1).Sub(clk.t); got != 2*time.Second {
		t.Fatalf("second backoff %v, want 2s", got)
	}
}

func TestStaticCleanCloseIsNotAFailure(t *testing.T) {
	p, _, clk := newStatic(1, d1, d2)
	ins := p.Established(Conn{Token: 3, Local: client, Remote: server})
	p.SubflowEstablished(up(ins[0], 41000))
	clk.advance(5 * time.Second)
	ins = p.SubflowClosed(up(ins[0], 41000))
	if !p.Backoff(d1).IsZero() {
		t.Fatal("a clean close backed the detour off")
	}
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("after a clean close got %v, want the subflow reopened via r1", ins)
	}
}

func TestStaticConnectionGoneIsNotAFailure(t *testing.T) {
	p, _, clk := newStatic(1, d1)
	ins := p.Established(Conn{Token: 3, Local: client, Remote: server})
	if got := p.Failed(ins[0], syscall.ENOENT); len(got) != 0 || !p.Backoff(d1).IsZero() {
		t.Fatalf("ENOENT (connection gone): intents %v, backoff %v", got, p.Backoff(d1))
	}
	clk.advance(time.Second)
	if got := p.Tick(clk.t); len(got) != 0 {
		t.Fatalf("retried a connection that is gone: %v", got)
	}
	// ENOTCONN: not fully established yet; retried soon, detour not blamed.
	ins = p.Established(Conn{Token: 4, Local: client, Remote: server})
	if got := p.Failed(ins[0], syscall.ENOTCONN); len(got) != 0 || !p.Backoff(d1).IsZero() {
		t.Fatalf("ENOTCONN: intents %v, backoff %v", got, p.Backoff(d1))
	}
	clk.advance(300 * time.Millisecond)
	if got := p.Tick(clk.t); len(got) != 1 || got[0].Token != 4 {
		t.Fatalf("after ENOTCONN got %v, want a retry", got)
	}
}

func TestStaticDropsStateAndReleases(t *testing.T) {
	p, src, _ := newStatic(2, d1, d2)
	for tok := uint32(1); tok <= 3; tok++ {
		p.Created(Conn{Token: tok, Local: client, Remote: server})
		p.Established(Conn{Token: tok, Local: client, Remote: server})
	}
	for tok := uint32(1); tok <= 3; tok++ {
		p.Closed(tok)
	}
	if p.Conns() != 0 || len(p.servers) != 0 {
		t.Fatalf("state left after close: %d conns, %d servers", p.Conns(), len(p.servers))
	}
	select {
	case s := <-src.released:
		if s != server {
			t.Fatalf("released %s", s)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("last connection closed but the source was not released")
	}
	// Events for a closed connection are ignored.
	if ins := p.SubflowClosed(Subflow{Token: 1, Local: client, Remote: d1.Remote, Errno: 104}); ins != nil {
		t.Fatalf("closed connection got %v", ins)
	}
}

func TestStaticBoundedUnderChurn(t *testing.T) {
	src := &list{ds: []detour.Detour{d1, d2}}
	clk := &clock{t: time.Unix(0, 0)}
	p := NewStatic(Config{MaxConns: 100, Now: clk.now}, []detour.Source{src})
	for tok := uint32(1); tok <= 20000; tok++ {
		c := Conn{Token: tok, Local: client, Remote: server}
		p.Created(c)
		for _, in := range p.Established(c) {
			p.SubflowEstablished(up(in, uint16(tok)))
		}
		if tok > 50 {
			p.Closed(tok - 50)
		}
		clk.advance(time.Millisecond)
		p.Tick(clk.t)
	}
	// Wakeups: one connect-timeout check per connection lives 3 s, at one
	// connection per (simulated) millisecond.
	if p.Conns() > 100 || len(p.wake) > 3000+100 {
		t.Fatalf("after churn: %d conns, %d wakeups", p.Conns(), len(p.wake))
	}
	// Beyond MaxConns new connections are left alone.
	for tok := uint32(200000); tok < 200200; tok++ {
		p.Established(Conn{Token: tok, Local: client, Remote: server})
	}
	if p.Conns() != 100 || p.Untracked == 0 {
		t.Fatalf("MaxConns not enforced: %d conns, %d untracked", p.Conns(), p.Untracked)
	}
}

func TestStaticAnnouncements(t *testing.T) {
	p, _, _ := newStatic(1, d1)
	c := Conn{Token: 9, Local: client, Remote: server}
	// An announcement before ESTABLISHED is honoured once established.
	p.Created(c)
	if ins := p.Announced(9, 5, netip.MustParseAddrPort("10.0.2.3:0")); ins != nil {
		t.Fatalf("acted before ESTABLISHED: %v", ins)
	}
	ins := p.Established(c)
	want := netip.MustParseAddrPort("10.0.2.3:5201")
	if len(ins) != 2 || ins[1].Remote != want || ins[1].Detour != nil || ins[1].Local.Addr() != client.Addr() {
		t.Fatalf("intents %v, want a detour subflow and one to %s", ins, want)
	}
	// Within the limit (2 by default); loopback never.
	if ins = p.Announced(9, 6, netip.MustParseAddrPort("10.0.2.4:443")); len(ins) != 1 || ins[0].Remote.Port() != 443 {
		t.Fatalf("second announcement: %v", ins)
	}
	if ins = p.Announced(9, 7, netip.MustParseAddrPort("10.0.2.5:443")); len(ins) != 0 {
		t.Fatalf("announcement beyond the limit: %v", ins)
	}
	if ins = p.Announced(9, 8, netip.MustParseAddrPort("127.0.0.1:443")); len(ins) != 0 {
		t.Fatalf("loopback announcement: %v", ins)
	}
	// An announced subflow that closes is not retried.
	if ins = p.SubflowClosed(Subflow{Token: 9, Local: client, Remote: want, Errno: 111}); len(ins) != 0 {
		t.Fatalf("announced subflow retried: %v", ins)
	}
}

func TestStaticAdopt(t *testing.T) {
	p, src, _ := newStatic(2, d1, d2, d3)
	c := Conn{Token: 11, Local: client, Remote: server}
	ins := p.Adopt(c, []Subflow{
		{Token: 11, Local: client, Remote: server},                                                  // initial
		{Token: 11, Local: netip.AddrPortFrom(client.Addr(), 42000), Remote: d2.Remote, LocalID: 0}, // via r2
	})
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("adopted connection with a subflow via r2 got %v, want exactly one more via r1", ins)
	}
	if again := p.Adopt(c, nil); len(again) != 0 {
		t.Fatalf("adopting twice opened more subflows: %v", again)
	}
	// Relays are asked for grants as for a new connection.
	if len(src.prepared) != 1 || src.prepared[0] != server {
		t.Fatalf("Prepare calls %v, want one for %s", src.prepared, server)
	}
}

func TestStaticConnectTimeout(t *testing.T) {
	p, _, clk := newStatic(1, d1, d2)
	c := Conn{Token: 5, Local: client, Remote: server}
	ins := p.Established(c)
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("first %v", ins)
	}
	clk.advance(time.Second)
	if got := p.Tick(clk.t); len(got) != 0 {
		t.Fatalf("gave up before the connect timeout: %v", got)
	}
	// r1 swallows the SYN: after 3 s r2 is tried and r1 backs off.
	clk.advance(2100 * time.Millisecond)
	ins = p.Tick(clk.t)
	if len(ins) != 1 || ins[0].Detour.Relay != "r2" || p.Backoff(d1).IsZero() {
		t.Fatalf("after the connect timeout: %v, r1 backoff %v", ins, p.Backoff(d1))
	}
	p.SubflowEstablished(up(ins[0], 43000))
	// The kernel finally gives up on r1's SYN: no second penalty, no new subflow.
	fails := p.fails(d1)
	late := Subflow{Token: 5, Local: client, Remote: d1.Remote, Errno: 110}
	if got := p.SubflowClosed(late); len(got) != 0 || p.fails(d1) != fails {
		t.Fatalf("late close of a timed-out subflow: %v, fails %d -> %d", got, fails, p.fails(d1))
	}
}

func TestStaticStalledSubflowIsReplaced(t *testing.T) {
	p, _, _ := newStatic(1, d1, d2)
	ins := p.Established(Conn{Token: 6, Local: client, Remote: server})
	sf := up(ins[0], 44000)
	p.SubflowEstablished(sf)
	ins = p.Measured(time.Unix(1001, 0), []Measurement{stalledM(sf, 3)})
	if len(ins) != 2 || ins[0].Action != DestroySubflow || ins[0].Local != sf.Local || ins[1].Detour.Relay != "r2" || p.Backoff(d1).IsZero() {
		t.Fatalf("stalled: %v (r1 backoff %v), want destroy + create via r2", ins, p.Backoff(d1))
	}
	if again := p.Measured(time.Unix(1002, 0), []Measurement{stalledM(sf, 4)}); len(again) != 0 {
		t.Fatalf("stalled twice: %v", again)
	}
	fails := p.fails(d1)
	if got := p.SubflowClosed(sf); len(got) != 0 || p.fails(d1) != fails {
		t.Fatalf("close after destroy: %v, fails %d -> %d", got, fails, p.fails(d1))
	}
}

func stalledM(sf Subflow, rto uint8) Measurement {
	return Measurement{Token: sf.Token, Local: sf.Local, Remote: sf.Remote, Retransmits: rto, Unacked: 10}
}

// A join that times out while the same detour carries another connection
// is the connection's problem (typically a short transfer that closed
// before its joins completed), not the detour's: no backoff for everyone.
func TestTimeoutOnWorkingDetourIsNotHeldAgainstIt(t *testing.T) {
	p, _, clk := newStatic(1, d1)
	a := Conn{Token: 1, Local: client, Remote: server}
	ins := p.Established(a)
	if len(ins) != 1 {
		t.Fatalf("first connection: %v", ins)
	}
	p.SubflowEstablished(up(ins[0], 43000))
	b := Conn{Token: 2, Local: netip.MustParseAddrPort("10.0.1.1:40001"), Remote: server}
	if ins = p.Established(b); len(ins) != 1 {
		t.Fatalf("second connection: %v", ins)
	}
	clk.advance(3100 * time.Millisecond)
	p.Tick(clk.t)
	if !p.Backoff(d1).IsZero() || p.fails(d1) != 0 {
		t.Fatalf("detour carrying connection 1 was penalised for connection 2's timeout: backoff %v fails %d", p.Backoff(d1), p.fails(d1))
	}
	// Once connection 1 is gone, a timeout counts again.
	p.Closed(1)
	c := Conn{Token: 3, Local: netip.MustParseAddrPort("10.0.1.1:40002"), Remote: server}
	if ins = p.Established(c); len(ins) != 1 {
		t.Fatalf("third connection: %v", ins)
	}
	clk.advance(3100 * time.Millisecond)
	p.Tick(clk.t)
	if p.Backoff(d1).IsZero() {
		t.Fatal("a timeout on a detour that carries nothing did not count")
	}
}

// A join refused in its handshake (a reset answered the SYN: a middlebox
// redirecting joins to another peer, a closed port) is not retried for the
// same connection at the detour's 1, 2, 4 s backoff: each refused join
// makes the kernel re-send the connection's unacknowledged data (a receive
// stall of about half a second at 10 Mbit/s, docs/results/join-redirect).
// The connection tries that detour again after MaxBackoff; a new
// connection still tries it once the detour's backoff ends.
func TestStaticRefusedJoinNotRetriedForTheConnection(t *testing.T) {
	p, _, clk := newStatic(1, d1)
	ins := p.Established(Conn{Token: 21, Local: client, Remote: server})
	if len(ins) != 1 || ins[0].Detour.Relay != "r1" {
		t.Fatalf("first subflow %v, want via r1", ins)
	}
	refused := up(ins[0], 0)
	refused.Errno = uint8(syscall.ECONNREFUSED)
	if got := p.SubflowClosed(refused); len(got) != 0 {
		t.Fatalf("retried at once: %v", got)
	}
	// Past the detour's backoff (1 s, 2 s, ...): no retry for this
	// connection for a minute.
	for range 59 {
		clk.advance(time.Second)
		if got := p.Tick(clk.t); len(got) != 0 {
			t.Fatalf("connection retried the refused detour after %v: %v", clk.t.Sub(time.Unix(1000, 0)), got)
		}
	}
	// Another connection tries r1 (its backoff is over).
	if got := p.Established(Conn{Token: 22, Local: netip.MustParseAddrPort("10.0.1.1:40001"), Remote: server}); len(got) != 1 || got[0].Detour.Relay != "r1" {
		t.Fatalf("new connection got %v, want a subflow via r1", got)
	}
	clk.advance(1500 * time.Millisecond)
	var again []Intent
	for _, in := range p.Tick(clk.t) {
		if in.Token == 21 {
			again = append(again, in)
		}
	}
	if len(again) != 1 || again[0].Detour.Relay != "r1" {
		t.Fatalf("after a minute the connection got %v, want one retry via r1", again)
	}
}
