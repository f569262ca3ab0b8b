package serverrole

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"golang.org/x/sys/unix"
)

func parse(t *testing.T, y string) (Config, error) {
	t.Helper()
	var f File
	doc, err := config.Parse("server.yaml", []byte(y), &f)
	if err != nil {
		return Config{}, err
	}
	c, err := f.Build()
	if err != nil {
		return c, doc.Locate(err)
	}
	return c, nil
}

func TestConfig(t *testing.T) {
	c, err := parse(t, `
announce:
  - {name: detour1, address: 10.0.6.2:5201}
  - {name: unique, address: 10.0.31.2, id: 1}
  - {name: v6, address: "[2001:db8::1]:443"}
ports: ["5201", "8000-8100"]
deny_join_initial: true
`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Announcement{
		{Name: "detour1", Addr: netip.MustParseAddr("10.0.6.2"), Port: 5201, ID: 2},
		{Name: "unique", Addr: netip.MustParseAddr("10.0.31.2"), ID: 1},
		{Name: "v6", Addr: netip.MustParseAddr("2001:db8::1"), Port: 443, ID: 3},
	}
	if fmt.Sprint(c.Announce) != fmt.Sprint(want) {
		t.Errorf("announce = %v, want %v", c.Announce, want)
	}
	if c.DenyJoinInitial == nil || !*c.DenyJoinInitial {
		t.Errorf("deny_join_initial = %v", c.DenyJoinInitial)
	}
	if !c.selects(5201) || !c.selects(8050) || c.selects(22) {
		t.Errorf("ports selection wrong: %v", c.Ports)
	}
}

func TestConfigRefusals(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{`{}`, "announce: nothing to do"},
		{`announce: [{address: 10.0.0.1}]`, "announce[0].name: missing"},
		{`announce: [{name: a}]`, "announce[0].address: missing"},
		{`announce: [{name: a, address: 127.0.0.1}]`, "not an address a client can reach"},
		{`announce: [{name: a, address: "10.0.0.1:0"}]`, "port 0"},
		{`announce: [{name: a, address: nohost:80}]`, "is not ADDRESS or ADDRESS:PORT"},
		{`announce: [{name: a, address: 10.0.0.1, id: 256}]`, "announce[0].id: 256 out of range"},
		{"announce:\n  - {name: a, address: 10.0.0.1, id: 4}\n  - {name: b, address: 10.0.0.2, id: 4}", "server.yaml:3:38: announce[1].id: 4 is already announce[0]'s"},
		{"announce:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.1}", "announce[1].address: 10.0.0.1 is already announce[0]"},
		{`{announce: [{name: a, address: 10.0.0.1}], ports: ["9-3"]}`, "ports[0]:"},
		{`{announce: [{name: a, address: 10.0.0.1, idd: 3}]}`, `unknown key "idd"`},
		{"announce: [" + strings.Repeat("{name: a, address: 10.0.0.1},", 9) + "]", "at most 8"},
	} {
		_, err := parse(t, tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	// Only the C flag: valid.
	if _, err := parse(t, `deny_join_initial: true`); err != nil {
		t.Errorf("deny_join_initial alone: %v", err)
	}
}

// fakeKernel records ANNOUNCEs; events come from a channel.
type fakeKernel struct {
	mu      sync.Mutex
	events  chan []mptcppm.Event
	lost    chan struct{}
	sent    []string
	at      []time.Time
	refuse  map[uint32]error
	conns   []mptcppm.Connection
	dumpErr error
}

func (f *fakeKernel) Events() ([]mptcppm.Event, error) {
	select {
	case evs, ok := <-f.events:
		if !ok {
			return nil, net.ErrClosed
		}
		return evs, nil
	case <-f.lost:
		return nil, fmt.Errorf("receive: %w", mptcppm.ErrEventsLost)
	}
}

func (f *fakeKernel) Announce(token uint32, a mptcppm.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refuse[token]; err != nil {
		return err
	}
	f.sent = append(f.sent, fmt.Sprintf("%08x %s", token, a))
	f.at = append(f.at, time.Now())
	return nil
}

func (f *fakeKernel) Connections() ([]mptcppm.Connection, error) { return f.conns, f.dumpErr }

func est(token uint32, server bool, lport uint16) mptcppm.Event {
	e := mptcppm.Event{Type: mptcppm.EventEstablished, Token: token,
		Local: netip.AddrPortFrom(netip.MustParseAddr("10.0.3.2"), lport), Remote: netip.MustParseAddrPort("10.0.1.1:40000")}
	if server {
		e.Flags = 2
	}
	return e
}

func TestRoleAnnounces(t *testing.T) {
	cfg, err := parse(t, `{announce: [{name: d1, address: 10.0.6.2:5201}, {name: u, address: 10.0.31.2}], ports: ["5201"], announce_interval: 0s, announce_repeat: 0s}`)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKernel{events: make(chan []mptcppm.Event), lost: make(chan struct{}),
		refuse: map[uint32]error{7: &mptcppm.Error{Cmd: "ANNOUNCE", Token: 7, Errno: unix.EINVAL, Msg: "invalid request; userspace PM not selected"}}}
	r := New(cfg, k, nil)
	done := make(chan error)
	go func() { done <- r.Run(context.Background()) }()
	k.events <- []mptcppm.Event{
		est(1, true, 5201),  // announced to
		est(1, true, 5201),  // twice: only once
		est(2, false, 5201), // our own client connection: not touched
		est(3, true, 22),    // another service: not selected
		{Type: mptcppm.EventCreated, Token: 4, Flags: 2, Local: netip.MustParseAddrPort("10.0.3.2:5201")}, // not yet established
		est(7, true, 5201), // refused by the kernel: counted
	}
	// Lost events: the dump finds 5 (established, server side) and 6
	// (fallen back to TCP: no announcement possible); 1 is already done.
	k.conns = []mptcppm.Connection{
		{Token: 1, State: 1, ServerSide: true, Local: netip.MustParseAddrPort("10.0.3.2:5201")},
		{Token: 5, State: 1, ServerSide: true, Local: netip.MustParseAddrPort("10.0.3.2:5201")},
		{Token: 6, State: 1, ServerSide: true, Local: netip.MustParseAddrPort("10.0.3.2:5201"), Info: mptcppm.MPTCPInfo{Flags: mptcppm.InfoFlagFallback}},
	}
	k.lost <- struct{}{}
	// CLOSED forgets 1: a new connection reusing the token is announced to.
	k.events <- []mptcppm.Event{{Type: mptcppm.EventClosed, Token: 1}, est(1, true, 5201)}
	close(k.events)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []string{
		"00000001 id 1 10.0.6.2:5201", "00000001 id 2 10.0.31.2:0",
		"00000005 id 1 10.0.6.2:5201", "00000005 id 2 10.0.31.2:0",
		"00000001 id 1 10.0.6.2:5201", "00000001 id 2 10.0.31.2:0",
	}
	if strings.Join(k.sent, "\n") != strings.Join(want, "\n") {
		t.Errorf("announcements:\n%s\nwant\n%s", strings.Join(k.sent, "\n"), strings.Join(want, "\n"))
	}
	s := r.Stats()
	if s.Connections != 4 || s.Announcements != 6 || s.Errors != 2 || s.Resyncs != 1 {
		t.Errorf("stats = %+v", s)
	}
}

func TestRoleStopsOnKernelError(t *testing.T) {
	k := &fakeKernel{events: make(chan []mptcppm.Event), lost: make(chan struct{})}
	boom := errors.New("socket gone")
	r := New(Config{}, errKernel{k, boom}, nil)
	if err := r.Run(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want %v", err, boom)
	}
}

type errKernel struct {
	*fakeKernel
	err error
}

func (e errKernel) Events() ([]mptcppm.Event, error) { return nil, e.err }

// A connection's second announcement waits Interval (the kernel drops an
// ANNOUNCE issued while the previous ADD_ADDR is still pending); one whose
// connection closed meanwhile ("invalid token") is not an error.
func TestRoleSpacesAnnouncements(t *testing.T) {
	cfg, err := parse(t, `{announce: [{name: a, address: 10.0.6.2:5201}, {name: b, address: 10.0.31.2}, {name: c, address: 10.0.32.2}], announce_interval: 40ms, announce_repeat: 0s}`)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := parse(t, `announce: [{name: a, address: 10.0.6.2}]`); d.Interval != DefaultInterval {
		t.Errorf("default interval %v", d.Interval)
	}
	if _, err := parse(t, `{announce: [{name: a, address: 10.0.6.2}], announce_interval: 1m}`); err == nil || !strings.Contains(err.Error(), "announce_interval") {
		t.Errorf("announce_interval 1m: %v", err)
	}
	k := &fakeKernel{events: make(chan []mptcppm.Event), lost: make(chan struct{}),
		refuse: map[uint32]error{9: &mptcppm.Error{Cmd: "ANNOUNCE", Token: 9, Errno: unix.EINVAL, Msg: "invalid token"}}}
	r := New(cfg, k, nil)
	done := make(chan error)
	go func() { done <- r.Run(context.Background()) }()
	start := time.Now()
	k.events <- []mptcppm.Event{est(1, true, 5201), est(9, true, 5201)}
	close(k.events)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The spaced announcements go out after Run returned: wait for them.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		k.mu.Lock()
		n := len(k.sent)
		k.mu.Unlock()
		if n >= 3 {
			break
		}
	}
	time.Sleep(50 * time.Millisecond) // and for a fourth that must not come
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.sent) != 3 {
		t.Fatalf("sent %v, want 3 announcements to connection 1", k.sent)
	}
	for i, at := range k.at {
		if min := time.Duration(i) * 40 * time.Millisecond; at.Sub(start) < min-5*time.Millisecond {
			t.Errorf("announcement %d after %v, want >= %v", i, at.Sub(start), min)
		}
	}
	if s := r.Stats(); s.Errors != 0 || s.Gone != 3 || s.Announcements != 3 {
		t.Errorf("stats %+v, want 3 sent, 3 gone (closed connection), 0 errors", s)
	}
}

// A connection with fewer joins than announced addresses gets its
// announcements again after Repeat, 2 x Repeat, 4 x Repeat; one whose
// client joined every address, or that closed, does not.
func TestRoleRepeatsUntilJoined(t *testing.T) {
	cfg, err := parse(t, `{announce: [{name: a, address: 10.0.6.2:5201}, {name: b, address: 10.0.31.2}], announce_interval: 0s, announce_repeat: 30ms}`)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := parse(t, `announce: [{name: a, address: 10.0.6.2}]`); d.Repeat != DefaultRepeat {
		t.Errorf("default repeat %v", d.Repeat)
	}
	k := &fakeKernel{events: make(chan []mptcppm.Event), lost: make(chan struct{})}
	r := New(cfg, k, nil)
	done := make(chan error)
	go func() { done <- r.Run(context.Background()) }()
	sub := func(token uint32) mptcppm.Event {
		return mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: token}
	}
	// 1: never joined -> 1 + 3 rounds; 2: joined both -> 1 round;
	// 3: joined one -> repeated until closed.
	counts := func() map[string]int {
		k.mu.Lock()
		defer k.mu.Unlock()
		count := map[string]int{}
		for _, s := range k.sent {
			count[s[:8]]++
		}
		return count
	}
	// Wait for the rounds instead of sleeping a fixed time (a loaded
	// machine runs the 30 ms timers late): 3 is closed right after its
	// first repeat (30 ms), well before the second (90 ms).
	until := func(token string, n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); counts()[token] < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("announcements per connection %v: %s never got %d", counts(), token, n)
			}
		}
	}
	k.events <- []mptcppm.Event{est(1, true, 5201), est(2, true, 5201), sub(2), sub(2), est(3, true, 5201), sub(3)}
	until("00000003", 4)
	k.events <- []mptcppm.Event{{Type: mptcppm.EventClosed, Token: 3}}
	until("00000001", 8)               // 30 + 60 + 120 ms: all repeats of 1 done
	time.Sleep(100 * time.Millisecond) // none after them
	close(k.events)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	count := counts()
	if count["00000001"] != 8 || count["00000002"] != 2 || count["00000003"] != 4 {
		t.Errorf("announcements per connection %v, want 1: 8 (4 rounds), 2: 2 (joined), 3: 4 (closed after one repeat)", count)
	}
	if s := r.Stats(); s.Repeats != 4 {
		t.Errorf("repeats %d, want 4", s.Repeats)
	}
}
