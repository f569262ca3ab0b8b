package relay

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/fairshare"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
	"github.com/mpdetour/mpdetour/internal/relay/trust"
)

const mib = collective.CreditUnit

func TestPickVictim(t *testing.T) {
	at := func(s int) *lease.Mapping { return &lease.Mapping{Granted: time.Unix(int64(s), 0)} }
	h := func(credit int64, granted int) holder { return holder{credit: credit, newest: at(granted)} }
	cases := []struct {
		name string
		req  int64
		hs   []holder
		want int
	}{
		{"nobody holds anything", 10 * mib, nil, -1},
		{"the least credit gives way", 10 * mib, []holder{h(3*mib, 1), h(-2*mib, 2), h(0, 3)}, 1},
		{"negative requester, holders above", -1 * mib, []holder{h(5*mib, 1), h(0, 2)}, -1},
		{"equal credit: no preemption", 5 * mib, []holder{h(5*mib, 1)}, -1},
		{"within the margin: no preemption", 5 * mib, []holder{h(5*mib-mib/2, 1)}, -1},
		{"exactly the margin below", 5 * mib, []holder{h(4*mib, 1)}, 0},
		{"tie: the most recent grant goes", 10 * mib, []holder{h(0, 1), h(0, 5), h(0, 3)}, 1},
		{"legacy (no credit) first", -100 * mib, []holder{h(-50*mib, 9), h(-1<<63, 1)}, 1},
		{"extreme credits do not overflow", 1<<63 - 1, []holder{h(-1<<63, 1)}, 0},
		{"lowest requester takes nothing", -1 << 63, []holder{h(-1<<63, 1)}, -1},
	}
	for _, c := range cases {
		if got := pickVictim(c.req, c.hs); got != c.want {
			t.Errorf("%s: pickVictim = %d, want %d", c.name, got, c.want)
		}
	}
}

// fairConfig is enough configuration for the grant path, admission and
// the ledger.
func fairConfig(t *testing.T, capacity int, ledgerFile string) *Reloadable {
	// The tests' servers are in a documentation range, refused unless allowed.
	return &Reloadable{PrivateKey: testKey(t), PortLo: 40000, PortHi: 40100, Lease: time.Minute, Members: map[proto.Key]string{},
		Allow:          []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		QuotaPerMember: 100, QuotaGlobal: 1000, Rate: 50, Burst: 100, Fair: FairConfig{Capacity: capacity, LedgerFile: ledgerFile, ReceiptEvery: time.Minute}}
}

// newFairServer is a relay with a fake data plane, enough for the grant
// path, admission and the ledger.
func newFairServer(t *testing.T, capacity int, ledgerFile string) (*Server, *dataplane.Fake) {
	t.Helper()
	return newTestServer(t, Static{}, fairConfig(t, capacity, ledgerFile), nil, nil)
}

// admission at capacity, in the order members ask: a member with more
// credit takes the newest mapping of the one with the least; one with less
// is refused "capacity"; a repeated grant is always answered.
func TestAdmitAtCapacity(t *testing.T) {
	s, _ := newFairServer(t, 2, "")
	rich, poor, newcomer := testKey(t).Public(), testKey(t).Public(), testKey(t).Public()
	s.fair.led.Entry(rich, "rich").Earned = 100 * mib
	s.fair.led.Entry(poor, "poor").Consumed = 50 * mib
	o := func(k proto.Key, n string) lease.Owner { return lease.Owner{Key: k, Name: n} }
	client := netip.MustParseAddr("10.0.1.1")
	srv := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("198.51.100.1"), p) }
	ask := func(ow lease.Owner, port uint16) proto.Reason {
		t.Helper()
		if r := s.admit(ow, client, srv(port)); r != proto.OK {
			return r
		}
		_, r := s.grant(ow, client, srv(port), 0, time.Minute, 100)
		s.flush()
		return r
	}
	steps := []struct {
		who  lease.Owner
		port uint16
		want proto.Reason
		held map[string]int // mappings per member name afterwards
	}{
		{o(poor, "poor"), 1, proto.OK, map[string]int{"poor": 1}},
		{o(poor, "poor"), 2, proto.OK, map[string]int{"poor": 2}},
		{o(poor, "poor"), 3, proto.ReasonCapacity, map[string]int{"poor": 2}},  // its own do not give way
		{o(poor, "poor"), 1, proto.OK, map[string]int{"poor": 2}},              // repeated grant: answered
		{o(newcomer, "new"), 1, proto.OK, map[string]int{"poor": 1, "new": 1}}, // 5 MiB start > -45 MiB
		{o(rich, "rich"), 1, proto.OK, map[string]int{"new": 1, "rich": 1}},    // takes poor's last
		{o(poor, "poor"), 4, proto.ReasonCapacity, map[string]int{"new": 1, "rich": 1}},
		{o(rich, "rich"), 2, proto.OK, map[string]int{"rich": 2}},
		{o(newcomer, "new"), 2, proto.ReasonCapacity, map[string]int{"rich": 2}},
	}
	for i, st := range steps {
		if got := ask(st.who, st.port); got != st.want {
			t.Fatalf("step %d (%s port %d): %v, want %v", i, st.who.Name, st.port, got, st.want)
		}
		held := map[string]int{}
		for _, m := range s.leases.ByKey {
			held[m.Owner.Name]++
		}
		if len(held) != len(st.held) {
			t.Fatalf("step %d: held %v, want %v", i, held, st.held)
		}
		for n, c := range st.held {
			if held[n] != c {
				t.Fatalf("step %d: held %v, want %v", i, held, st.held)
			}
		}
	}
	// Without capacity every grant is answered as before.
	s.set.Fair.Capacity = 0
	if r := ask(o(poor, "poor"), 9); r != proto.OK {
		t.Fatalf("no capacity: %v", r)
	}
}

// The ledger counts what each mapping's counter moved (live, closing,
// after a reset), persists it and its replay windows, and refuses a file
// it cannot read.
func TestLedgerCountsAndPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.json")
	s, dp := newFairServer(t, 0, path)
	alice := testKey(t).Public()
	s.set.Members[alice] = "alice"
	ow := lease.Owner{Key: alice, Name: "alice"}
	client := netip.MustParseAddr("10.0.1.1")
	m, r := s.grant(ow, client, netip.MustParseAddrPort("198.51.100.1:80"), 0, time.Minute, 100)
	if r != proto.OK {
		t.Fatal(r)
	}
	s.flush()
	now := time.Now()
	dp.SetCounter(m.Key, dataplane.Counter{Bytes: 1000})
	s.flushLedger(now)
	dp.SetCounter(m.Key, dataplane.Counter{Bytes: 1500})
	s.flushLedger(now)
	if got := s.fair.led.Members[alice].Consumed; got != 1500 {
		t.Fatalf("consumed %d, want 1500", got)
	}
	// Closing: counted until reaped, then forgotten.
	if err := s.close([]*lease.Mapping{m}, "release"); err != nil {
		t.Fatal(err)
	}
	dp.SetCounter(m.Key, dataplane.Counter{Bytes: 1700})
	s.reap(now, true)
	if got := s.fair.led.Members[alice].Consumed; got != 1700 {
		t.Fatalf("consumed after reap %d, want 1700", got)
	}
	if len(s.fair.led.MapSeen) != 0 {
		t.Fatalf("reaped mapping still tracked")
	}
	// A counter that went back (the table was recreated) is new bytes.
	m2, _ := s.grant(ow, client, netip.MustParseAddrPort("198.51.100.1:81"), 0, time.Minute, 100)
	s.flush()
	dp.SetCounter(m2.Key, dataplane.Counter{Bytes: 900})
	s.flushLedger(now)
	dp.SetCounter(m2.Key, dataplane.Counter{Bytes: 100})
	s.flushLedger(now)
	if got := s.fair.led.Members[alice].Consumed; got != 1700+900+100 {
		t.Fatalf("consumed after reset %d, want %d", got, 1700+900+100)
	}
	s.fair.led.Windows[alice] = &collective.ReplayWindow{Top: 7, Bits: 5}
	s.fair.led.Seq = 42
	s.fair.led.Dirty = true
	if err := s.fair.led.Save(now); err != nil {
		t.Fatal(err)
	}
	back, err := fairshare.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	e := back.Members[alice]
	if e == nil || e.Consumed != 2700 || e.Name != "alice" || back.Seq != 42 || *back.Windows[alice] != (collective.ReplayWindow{Top: 7, Bits: 5}) {
		t.Fatalf("reloaded %+v seq %d windows %v", e, back.Seq, back.Windows)
	}
	if c := e.Credit(); c != collective.StartCredit-2700 {
		t.Fatalf("credit %d", c)
	}
	for _, bad := range []string{"{", `{"version": 2}`, `{"version": 1, "members": {"x": {}}}`, `{"version": 1, "members": {"` + alice.String() + `": null}}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := fairshare.Load(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("ledger %q: %v, want an error naming the file", bad, err)
		}
	}
}

// A reload changes capacity at once and keeps the ledger file (start
// only) without writing the running value into the new configuration;
// relay certificates count until the authority changes.
func TestReloadFair(t *testing.T) {
	la := filepath.Join(t.TempDir(), "ledger-a")
	a, _ := collective.NewAuthority()
	b, _ := collective.NewAuthority()
	set := fairConfig(t, 0, la)
	set.Trust = collective.NewTrust(a.Public())
	s, _ := newTestServer(t, Static{}, set, nil, nil)
	k := testKey(t).Public()
	s.fair.relays[k] = trust.Member{Name: "r"}
	same := *set
	same.Trust = collective.NewTrust(a.Public())
	same.Fair = FairConfig{LedgerFile: la + "-b", Capacity: 3, ReceiptEvery: time.Minute}
	s.applyReload(&Config{Reloadable: same})
	if len(s.fair.relays) != 1 || s.fair.led.Path != la || s.set.Fair.Capacity != 3 || s.set.Fair.LedgerFile != la+"-b" {
		t.Fatalf("same authority: relays %d, ledger %s, settings %+v", len(s.fair.relays), s.fair.led.Path, s.set.Fair)
	}
	other := *set
	other.Trust = collective.NewTrust(b.Public())
	s.applyReload(&Config{Reloadable: other})
	if len(s.fair.relays) != 0 {
		t.Fatal("another authority: relay certificates kept")
	}
}
