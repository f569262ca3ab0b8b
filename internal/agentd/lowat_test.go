package agentd

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

var (
	lwClient = netip.MustParseAddrPort("10.0.1.1:40000")
	lwServer = netip.MustParseAddrPort("10.0.2.2:5201")
	lwJoin   = netip.MustParseAddrPort("10.0.1.1:50001")
	lwRelay  = netip.MustParseAddrPort("10.0.3.2:45673")
)

// Every subflow of a managed connection gets the lowat under its 4-tuple;
// a 4-tuple reported by two connections keeps it until both are done
// with it; a join's goes when the join does; nothing is left after the
// last connection.
func TestLowatEntriesFollowSubflows(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, sets: 3}
	var logs bytes.Buffer
	l := startLowat(128<<10, 0, false, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, nil)))
	initial := bpfclamp.Conn{Local: lwClient, Remote: lwServer}
	join := bpfclamp.Conn{Local: lwJoin, Remote: lwRelay}
	const want = 128 << 10
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	// An IPv4-mapped address is the same 4-tuple.
	l.subflows(2, []agent.SubflowPair{{Local: netip.AddrPortFrom(netip.AddrFrom16(lwClient.Addr().As16()), lwClient.Port()), Remote: lwServer}})
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}, {Local: lwJoin, Remote: lwRelay}, {Local: lwJoin, Remote: lwRelay}})
	if len(m.lowats) != 2 || m.lowats[initial] != want || m.lowats[join] != want || len(m.set) != 0 {
		t.Fatalf("lowats %v (pairs %v), want the initial subflow and the join with %d", m.lowats, m.set, want)
	}
	if st := l.status(); st.State != "active" || st.Pairs != 2 || st.Bytes != 128<<10 || st.Sets != 3 {
		t.Errorf("status %+v", st)
	}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}}) // the join closed
	if _, ok := m.lowats[join]; ok || m.lowats[initial] != want {
		t.Fatalf("after the join closed: lowats %v", m.lowats)
	}
	l.subflows(1, nil)
	if m.lowats[initial] != want {
		t.Fatalf("connection 2 still reports the initial subflow: lowats %v", m.lowats)
	}
	l.subflows(2, nil)
	l.subflows(3, nil) // never seen: nothing to do
	if len(m.lowats) != 0 || m.deletedAbsent != 0 {
		t.Fatalf("after every connection: lowats %v, %d deletions of absent entries", m.lowats, m.deletedAbsent)
	}
	if st := l.status(); st.Pairs != 0 {
		t.Errorf("status %+v, want no pairs", st)
	}
}

// cwnd_clamp and subflow_lowat share the program: the tunnel subflow
// gets the clamp under its address pair and the lowat under its 4-tuple;
// losing the lowat leaves the clamp.
func TestLowatSharesProgramWithClamps(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	prog := openBPF("", func(string) (clampMap, error) { return m, nil })
	c := startClamps(ClampSettings{}, clampSources(), log, prog)
	l := startLowat(64<<10, 0, false, prog, log)
	tun := bpfclamp.Key{Local: clampTunnel.Local, Remote: clampServer.Addr()}
	tunSub := bpfclamp.Conn{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer}
	def := bpfclamp.Conn{Local: lwClient, Remote: clampServer}
	l.subflows(1, []agent.SubflowPair{{Local: def.Local, Remote: def.Remote}, {Local: tunSub.Local, Remote: tunSub.Remote}})
	c.measured([]policy.Measurement{{Local: tunSub.Local, Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}})
	if got := m.set[tun]; got != (bpfclamp.Limits{CwndSegments: 56}) || m.lowats[tunSub] != 64<<10 || m.lowats[def] != 64<<10 {
		t.Fatalf("tunnel pair %+v, lowats %v: want the clamp and both subflows' lowat", got, m.lowats)
	}
	l.subflows(1, nil)
	if got := m.set[tun]; got != (bpfclamp.Limits{CwndSegments: 56}) || len(m.lowats) != 0 {
		t.Fatalf("after the connection: tunnel pair %+v, lowats %v: want the clamp alone", got, m.lowats)
	}
	if err := prog.close(); err != nil || !m.closed {
		t.Errorf("close: %v, closed %v", err, m.closed)
	}
}

// A program that cannot be attached: one warning naming the reason,
// status failed; subflows come and go without errors.
func TestLowatAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	l := startLowat(128<<10, 0, false, openBPF("", func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: load sock_ops program: operation not permitted")
	}), slog.New(slog.NewTextHandler(&logs, nil)))
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	l.subflows(1, nil)
	st := l.status()
	wantStartFailure(t, logs.String(), st.State, st.Error, "operation not permitted")
}

// wantStartFailure checks a BPF mechanism (lowat, pacing) whose program
// could not be loaded or attached: one log line naming the reason and
// that the agent runs without it, status failed with the reason.
func wantStartFailure(t *testing.T, logs, state, errText, reason string) {
	t.Helper()
	if n := strings.Count(logs, "\n"); n != 1 || !strings.Contains(logs, reason) || !strings.Contains(logs, "running without it") {
		t.Errorf("log %q: want one line with the reason", logs)
	}
	if state != "failed" || !strings.Contains(errText, reason) {
		t.Errorf("status %q %q: want failed with %q", state, errText, reason)
	}
}

// The default limit (subflow_lowat not set) where the program cannot be
// loaded or attached (no cgroup v2 here): one warning that names the
// reason, that the limit is the default and how to turn it off; status
// failed, the default and the cgroup it tried; subflows come and go
// without another line.
func TestLowatDefaultAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	l := startLowat(DefaultSubflowLowat, 0, true, openBPF("", func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: no cgroup v2 mount")
	}), slog.New(slog.NewTextHandler(&logs, nil)))
	for tok := range uint32(3) {
		l.subflows(tok, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
		l.subflows(tok, nil)
	}
	l.measured(nil)
	out := logs.String()
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "no cgroup v2 mount") ||
		!strings.Contains(out, "running without it") || !strings.Contains(out, "on by default") || !strings.Contains(out, "subflow_lowat: 0 turns it off") {
		t.Errorf("log %q: want one warning with the reason, the default and how to turn it off", out)
	}
	if st := l.status(); st.State != "failed" || !st.Default || st.Bytes != 131072 || st.Cgroup != "cgroup v2 root" || !strings.Contains(st.Error, "no cgroup v2") {
		t.Errorf("status %+v", st)
	}
	// Set explicitly: the same warning without the default's words.
	logs.Reset()
	l = startLowat(DefaultSubflowLowat, 0, false, openBPF("/sys/fs/cgroup/x", func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: no cgroup v2 mount")
	}), slog.New(slog.NewTextHandler(&logs, nil)))
	if out := logs.String(); strings.Count(out, "\n") != 1 || strings.Contains(out, "default") {
		t.Errorf("explicit: log %q", out)
	}
	if st := l.status(); st.Default || st.Cgroup != "/sys/fs/cgroup/x" {
		t.Errorf("explicit: status %+v", st)
	}
}

// A kernel that refuses TCP_NOTSENT_LOWAT from BPF: one warning however
// many subflows come, and status says refused.
func TestLowatRefused(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Lowat: unix.ENOPROTOOPT}}
	var logs bytes.Buffer
	l := startLowat(128<<10, 0, false, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	for tok := range uint32(3) {
		l.subflows(tok, []agent.SubflowPair{{Local: lwClient, Remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 2, byte(tok)}), 5201)}})
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
	if c, err := ParseConfig([]byte(base + "subflow_lowat: 0\n")); err != nil || c.SubflowLowatDefault {
		t.Fatalf("lowat 0 is not the default: %+v, %v", c, err)
	}
	// Unset: on, 128 KiB (the default), at the cgroup v2 root unless
	// bpf_cgroup names one; bpf_cgroup alone is valid.
	if c, err := ParseConfig([]byte(base)); err != nil || c.SubflowLowat != DefaultSubflowLowat || DefaultSubflowLowat != 131072 || !c.SubflowLowatDefault || c.BPFCgroup != "" {
		t.Fatalf("unset: %+v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(base + "bpf_cgroup: /sys/fs/cgroup/x\n")); err != nil || c.SubflowLowat != DefaultSubflowLowat || c.BPFCgroup != "/sys/fs/cgroup/x" {
		t.Fatalf("unset with bpf_cgroup: %+v, %v", c, err)
	}
	// A server-role-only agent (no detours, relays or legacy daemons)
	// manages no connection: off unless set; with a client role, on.
	server := "server:\n  announce: [{name: a, address: 10.0.6.2:5201}]\n"
	if c, err := ParseConfig([]byte(base + server)); err != nil || c.SubflowLowat != 0 || !c.SubflowLowatDefault {
		t.Fatalf("server role only: %+v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(base + server + "subflow_lowat: 131072\n")); err != nil || c.SubflowLowat != 131072 {
		t.Fatalf("server role only, set: %+v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(base + server + "detours:\n  - {kind: nat, relay: r1, address: 10.0.2.2:40000, server: 10.0.3.2:5201}\n")); err != nil || c.SubflowLowat != DefaultSubflowLowat || !c.SubflowLowatDefault {
		t.Fatalf("server and client role: %+v, %v", c, err)
	}
	// With cwnd_clamp or subflow_pacing and subflow_lowat unset, the
	// limit is on beside them (one program).
	if c, err := ParseConfig([]byte(base + "subflow_pacing: true\n")); err != nil || c.SubflowLowat != DefaultSubflowLowat || !c.SubflowPacing {
		t.Fatalf("pacing, lowat unset: %+v, %v", c, err)
	}
	c, err = ParseConfig([]byte(base + "probe_interval: 100ms\ncwnd_clamp:\n  enabled: true\n  cgroup: /sys/fs/cgroup/y\nsubflow_lowat: 65536\n"))
	if err != nil || c.BPFCgroup != "/sys/fs/cgroup/y" || c.SubflowLowat != 65536 {
		t.Fatalf("cwnd_clamp's cgroup: %+v, %v", c, err)
	}
	for in, want := range map[string]string{
		"subflow_lowat: 100\n":        "config:2:16: subflow_lowat: 100 bytes is not 0 (off) or 16384-2147483647",
		"subflow_lowat: 4294967296\n": "subflow_lowat: 4294967296 bytes",
		"subflow_lowat: 128KiB\n":     "config:2",
		// An explicit null is not "unset" (that would turn it on): an
		// error that names the default.
		"subflow_lowat:\n":                                 "config:2:15: subflow_lowat: want 0 (off) or 16384-2147483647 bytes, got null",
		"subflow_lowat: ~\n":                               "config:2:16: subflow_lowat: want 0 (off) or 16384-2147483647 bytes, got null",
		"subflow_lowat: null\n":                            "config:2:16: subflow_lowat: want 0 (off) or 16384-2147483647 bytes, got null (leave the key out for the default, 131072)",
		"subflow_lowat: 131072\nbpf_cgroup: x\n":           "bpf_cgroup: \"x\" is not a clean absolute path",
		"subflow_lowat: 0\nbpf_cgroup: /sys/fs/cgroup/x\n": "bpf_cgroup: set with subflow_lowat: 0 and without cwnd_clamp (nothing attaches a BPF program)",
		"server:\n  announce: [{name: a, address: 10.0.6.2:5201}]\nbpf_cgroup: /sys/fs/cgroup/x\n":                   "bpf_cgroup: set on a server-role-only agent without subflow_lowat or cwnd_clamp",
		"server:\n  announce: [{name: a, address: 10.0.6.2:5201}]\nsubflow_lowat_scale: rtt\n":                       "subflow_lowat_scale: rtt needs subflow_lowat > 0",
		"probe_interval: 100ms\nsubflow_lowat: 131072\nbpf_cgroup: /a\ncwnd_clamp:\n  enabled: true\n  cgroup: /b\n": "differs from cwnd_clamp.cgroup",
	} {
		_, err := ParseConfig([]byte(base + in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", in, err, want)
		}
	}
}

// A subflow whose entry could not be written (a full map) is not
// counted: the next report of it writes it, and status counts it then.
func TestLowatRetriesFailedWrite(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, failSets: 1}
	var logs bytes.Buffer
	l := startLowat(128<<10, 0, false, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, nil)))
	k := bpfclamp.Conn{Local: lwClient, Remote: lwServer}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if _, ok := m.lowats[k]; ok || l.status().Pairs != 0 || !strings.Contains(logs.String(), "not set") {
		t.Fatalf("after a failed write: lowats %v, status %+v, log %q", m.lowats, l.status(), logs.String())
	}
	l.subflows(2, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if m.lowats[k] != 128<<10 || l.status().Pairs != 1 {
		t.Fatalf("a second report of the subflow: lowats %v, status %+v", m.lowats, l.status())
	}
	// The first connection's next report counts it again; both gone:
	// nothing left.
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	l.subflows(2, nil)
	if _, ok := m.lowats[k]; !ok {
		t.Fatalf("connection 1 still reports the subflow: lowats %v", m.lowats)
	}
	l.subflows(1, nil)
	if len(m.lowats) != 0 || l.status().Pairs != 0 {
		t.Fatalf("after both connections: lowats %v, status %+v", m.lowats, l.status())
	}
}

// The kernel refuses the lowat at a callback after the subflow was
// added: with no new subflow, the next probe round warns, once.
func TestLowatRefusedLater(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Lowat: unix.ENOPROTOOPT}, refusedAfter: 1}
	var logs bytes.Buffer
	l := startLowat(128<<10, 0, false, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if s := logs.String(); s != "" {
		t.Fatalf("log %q right after the add: the refusal comes later", s)
	}
	for range 3 {
		l.measured(nil)
	}
	if n := strings.Count(logs.String(), "refused"); n != 1 {
		t.Errorf("log %q: want one refusal warning after the probe rounds", logs.String())
	}
}
