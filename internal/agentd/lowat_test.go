package agentd

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

var (
	lwClient = netip.MustParseAddr("10.0.1.1")
	lwServer = netip.MustParseAddr("10.0.2.2")
	lwRelay  = netip.MustParseAddr("10.0.3.2")
)

// Every subflow pair of a managed connection gets the lowat; a pair two
// connections share keeps it until both are done with it; a join's pair
// goes when the join does; nothing is left after the last connection.
func TestLowatEntriesFollowSubflows(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, sets: 3}
	var logs bytes.Buffer
	l := startLowat(128<<10, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, nil)))
	initial := bpfclamp.Key{Local: lwClient, Remote: lwServer}
	join := bpfclamp.Key{Local: lwClient, Remote: lwRelay}
	want := bpfclamp.Limits{NotsentLowat: 128 << 10}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	// An IPv4-mapped address is the same pair.
	l.subflows(2, []agent.SubflowPair{{Local: netip.AddrFrom16(lwClient.As16()), Remote: lwServer}})
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}, {Local: lwClient, Remote: lwRelay}, {Local: lwClient, Remote: lwRelay}})
	if len(m.set) != 2 || m.set[initial] != want || m.set[join] != want {
		t.Fatalf("map %v, want the initial and the join pair with %+v", m.set, want)
	}
	if st := l.status(); st.State != "active" || st.Pairs != 2 || st.Bytes != 128<<10 || st.Sets != 3 {
		t.Errorf("status %+v", st)
	}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}}) // the join closed
	if _, ok := m.set[join]; ok || m.set[initial] != want {
		t.Fatalf("after the join closed: map %v", m.set)
	}
	l.subflows(1, nil)
	if m.set[initial] != want {
		t.Fatalf("connection 2 still uses the initial pair: map %v", m.set)
	}
	l.subflows(2, nil)
	l.subflows(3, nil) // never seen: nothing to do
	if len(m.set) != 0 || m.deletedAbsent != 0 {
		t.Fatalf("after every connection: map %v, %d deletions of absent pairs", m.set, m.deletedAbsent)
	}
	if st := l.status(); st.Pairs != 0 {
		t.Errorf("status %+v, want no pairs", st)
	}
}

// cwnd_clamp and subflow_lowat share the program: a pair with both keeps
// both in its one entry, and losing the lowat leaves the clamp.
func TestLowatSharesProgramWithClamps(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	prog := openBPF("", func(string) (clampMap, error) { return m, nil })
	c := startClamps(ClampSettings{}, clampSources(), log, prog)
	l := startLowat(64<<10, prog, log)
	tun := bpfclamp.Key{Local: clampTunnel.Local, Remote: clampServer.Addr()}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: clampServer.Addr()}, {Local: tun.Local, Remote: tun.Remote}})
	c.measured([]policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}})
	if got := m.set[tun]; got != (bpfclamp.Limits{CwndSegments: 56, NotsentLowat: 64 << 10}) {
		t.Fatalf("tunnel pair %+v, want the clamp and the lowat", got)
	}
	l.subflows(1, nil)
	if got := m.set[tun]; got != (bpfclamp.Limits{CwndSegments: 56}) {
		t.Fatalf("tunnel pair after the connection: %+v, want the clamp alone", got)
	}
	if _, ok := m.set[bpfclamp.Key{Local: lwClient, Remote: clampServer.Addr()}]; ok {
		t.Errorf("default pair kept an entry: %v", m.set)
	}
	if err := prog.close(); err != nil || !m.closed {
		t.Errorf("close: %v, closed %v", err, m.closed)
	}
}

// A program that cannot be attached: one warning naming the reason,
// status failed; subflows come and go without errors.
func TestLowatAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	l := startLowat(128<<10, openBPF("", func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: load sock_ops program: operation not permitted")
	}), slog.New(slog.NewTextHandler(&logs, nil)))
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	l.subflows(1, nil)
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "operation not permitted") || !strings.Contains(logs.String(), "running without it") {
		t.Errorf("log %q: want one line with the reason", logs.String())
	}
	if st := l.status(); st.State != "failed" || !strings.Contains(st.Error, "operation not permitted") {
		t.Errorf("status %+v", st)
	}
}

// A kernel that refuses TCP_NOTSENT_LOWAT from BPF: one warning however
// many subflows come, and status says refused.
func TestLowatRefused(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Lowat: unix.ENOPROTOOPT}}
	var logs bytes.Buffer
	l := startLowat(128<<10, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	for tok := range uint32(3) {
		l.subflows(tok, []agent.SubflowPair{{Local: lwClient, Remote: netip.AddrFrom4([4]byte{10, 0, 2, byte(tok)})}})
	}
	if n := strings.Count(logs.String(), "refused"); n != 1 {
		t.Errorf("log %q: want one refusal warning", logs.String())
	}
	if st := l.status(); st.State != "refused" || !strings.Contains(st.Refused, "TCP_NOTSENT_LOWAT") {
		t.Errorf("status %+v", st)
	}
}

// subflow_lowat and bpf_cgroup: accepted values, and errors naming the
// field and the line.
func TestLowatConfig(t *testing.T) {
	base := "socket: /tmp/a.sock\n"
	c, err := ParseConfig([]byte(base + "subflow_lowat: 131072\nbpf_cgroup: /sys/fs/cgroup/x\n"))
	if err != nil || c.SubflowLowat != 131072 || c.BPFCgroup != "/sys/fs/cgroup/x" {
		t.Fatalf("%+v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(base + "subflow_lowat: 0\n")); err != nil || c.SubflowLowat != 0 {
		t.Fatalf("lowat 0: %+v, %v", c, err)
	}
	c, err = ParseConfig([]byte(base + "probe_interval: 100ms\ncwnd_clamp:\n  enabled: true\n  cgroup: /sys/fs/cgroup/y\nsubflow_lowat: 65536\n"))
	if err != nil || c.BPFCgroup != "/sys/fs/cgroup/y" || c.SubflowLowat != 65536 {
		t.Fatalf("cwnd_clamp's cgroup: %+v, %v", c, err)
	}
	for in, want := range map[string]string{
		"subflow_lowat: 100\n":                   "config:2:16: subflow_lowat: 100 bytes is not 0 (off) or 16384-2147483647",
		"subflow_lowat: 4294967296\n":            "subflow_lowat: 4294967296 bytes",
		"subflow_lowat: 128KiB\n":                "config:2",
		"subflow_lowat: 131072\nbpf_cgroup: x\n": "bpf_cgroup: \"x\" is not a clean absolute path",
		"bpf_cgroup: /sys/fs/cgroup/x\n":         "bpf_cgroup: set without subflow_lowat or cwnd_clamp",
		"probe_interval: 100ms\nsubflow_lowat: 131072\nbpf_cgroup: /a\ncwnd_clamp:\n  enabled: true\n  cgroup: /b\n": "differs from cwnd_clamp.cgroup",
	} {
		_, err := ParseConfig([]byte(base + in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", in, err, want)
		}
	}
}

// A pair whose entry could not be written (a full map) is not counted:
// the next connection on it writes it, and status counts it then.
func TestLowatRetriesFailedWrite(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, failSets: 1}
	var logs bytes.Buffer
	l := startLowat(128<<10, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, nil)))
	k := bpfclamp.Key{Local: lwClient, Remote: lwServer}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if _, ok := m.set[k]; ok || l.status().Pairs != 0 || !strings.Contains(logs.String(), "not set") {
		t.Fatalf("after a failed write: map %v, status %+v, log %q", m.set, l.status(), logs.String())
	}
	l.subflows(2, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if m.set[k] != (bpfclamp.Limits{NotsentLowat: 128 << 10}) || l.status().Pairs != 1 {
		t.Fatalf("a second connection on the pair: map %v, status %+v", m.set, l.status())
	}
	// The first connection's next report counts it again; both gone:
	// nothing left.
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	l.subflows(2, nil)
	if _, ok := m.set[k]; !ok {
		t.Fatalf("connection 1 still uses the pair: map %v", m.set)
	}
	l.subflows(1, nil)
	if len(m.set) != 0 || l.status().Pairs != 0 {
		t.Fatalf("after both connections: map %v, status %+v", m.set, l.status())
	}
}

// The kernel refuses the lowat at a callback after the pair was added:
// with no new subflow, the periodic check still warns, once.
func TestLowatRefusedLater(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Lowat: unix.ENOPROTOOPT}, refusedAfter: 1}
	var logs syncBuffer
	l := startLowat(128<<10, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if s := logs.String(); s != "" {
		t.Fatalf("log %q right after the add: the refusal comes later", s)
	}
	stop := l.watch(5 * time.Millisecond)
	defer stop()
	for end := time.Now().Add(3 * time.Second); !strings.Contains(logs.String(), "refused"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("log %q: no refusal warning without a new subflow", logs.String())
		}
	}
	time.Sleep(30 * time.Millisecond) // several more checks
	stop()
	if n := strings.Count(logs.String(), "refused"); n != 1 {
		t.Errorf("log %q: want one refusal warning", logs.String())
	}
}

// syncBuffer is a log buffer written by one goroutine and read by another.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
