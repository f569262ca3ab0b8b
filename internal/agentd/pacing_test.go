package agentd

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

// Every subflow's address pair gets the largest pacing rate (and no cwnd
// clamp); a pair two subflows or two connections share keeps it until
// the last is done with it; nothing is left after the last connection.
func TestPacingEntriesFollowSubflows(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
	p := startPacing(openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	def := bpfclamp.Key{Local: lwClient.Addr(), Remote: lwServer.Addr()}
	det := bpfclamp.Key{Local: lwJoin.Addr(), Remote: lwRelay.Addr()}
	want := bpfclamp.Limits{PacingRate: bpfclamp.MaxPacingRate}
	p.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	// Another connection on the same pair, from an IPv4-mapped address.
	p.subflows(2, []agent.SubflowPair{{Local: netip.AddrPortFrom(netip.AddrFrom16(lwClient.Addr().As16()), 40001), Remote: lwServer}})
	p.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}, {Local: lwJoin, Remote: lwRelay}})
	if len(m.set) != 2 || m.set[def] != want || m.set[det] != want || len(m.lowats) != 0 {
		t.Fatalf("pairs %v (lowats %v), want both pairs with %+v", m.set, m.lowats, want)
	}
	if st := p.status(); st.State != "active" || st.Pairs != 2 || st.MaxRate != bpfclamp.MaxPacingRate {
		t.Errorf("status %+v", st)
	}
	p.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}}) // the detour subflow closed
	if _, ok := m.set[det]; ok || m.set[def] != want {
		t.Fatalf("after the detour subflow closed: %v", m.set)
	}
	p.subflows(1, nil)
	if m.set[def] != want {
		t.Fatalf("connection 2 still has the default pair: %v", m.set)
	}
	p.subflows(2, nil)
	p.subflows(3, nil)
	if len(m.set) != 0 || m.deletedAbsent != 0 || p.status().Pairs != 0 {
		t.Fatalf("after every connection: %v, %d deletions of absent entries, status %+v", m.set, m.deletedAbsent, p.status())
	}
}

// subflow_lowat and subflow_pacing share the program and the
// subflow reports: each subflow gets its lowat under its 4-tuple and its
// pair the pacing rate; measurements reach both.
func TestPacingBesideLowat(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Pacing: unix.EINVAL}, refusedAfter: 2}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	prog := openBPF("", func(string) (clampMap, error) { return m, nil })
	lw := startLowat(64<<10, 0, false, prog, log)
	opts := agent.Options{OnSubflows: lw.subflows, OnMeasured: lw.measured}
	wirePacing(&opts, prog, log)
	opts.OnSubflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if m.lowats[bpfclamp.Conn{Local: lwClient, Remote: lwServer}] != 64<<10 || m.set[bpfclamp.Key{Local: lwClient.Addr(), Remote: lwServer.Addr()}].PacingRate != bpfclamp.MaxPacingRate {
		t.Fatalf("lowats %v, pairs %v: want both", m.lowats, m.set)
	}
	// The refusal shows up at a later probe round: one warning.
	for range 3 {
		opts.OnMeasured([]policy.Measurement{})
	}
	if n := strings.Count(logs.String(), "subflow pacing refused"); n != 1 {
		t.Errorf("log %q: want one pacing refusal warning", logs.String())
	}
	if st := opts.SubflowPacing(); st.State != "refused" || !strings.Contains(st.Refused, "SO_MAX_PACING_RATE") {
		t.Errorf("status %+v", st)
	}
	opts.OnSubflows(1, nil)
	if len(m.set) != 0 || len(m.lowats) != 0 {
		t.Fatalf("after the connection: pairs %v, lowats %v", m.set, m.lowats)
	}
}

// A program that cannot be attached: one warning, status failed,
// subflows come and go without errors.
func TestPacingAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	p := startPacing(openBPF("", func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: load sock_ops program: operation not permitted")
	}), slog.New(slog.NewTextHandler(&logs, nil)))
	p.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	p.measured(nil)
	p.subflows(1, nil)
	st := p.status()
	wantStartFailure(t, logs.String(), st.State, st.Error, "operation not permitted")
}

// A pair whose entry could not be written (a full map) is written at the
// connection's next report.
func TestPacingRetriesFailedWrite(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, failSets: 1}
	var logs bytes.Buffer
	p := startPacing(openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&logs, nil)))
	k := bpfclamp.Key{Local: lwClient.Addr(), Remote: lwServer.Addr()}
	p.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if _, ok := m.set[k]; ok || p.status().Pairs != 0 || !strings.Contains(logs.String(), "not set") {
		t.Fatalf("after a failed write: %v, status %+v, log %q", m.set, p.status(), logs.String())
	}
	p.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if m.set[k].PacingRate != bpfclamp.MaxPacingRate || p.status().Pairs != 1 {
		t.Fatalf("the next report: %v, status %+v", m.set, p.status())
	}
	p.subflows(1, nil)
	if len(m.set) != 0 {
		t.Fatalf("after the connection: %v", m.set)
	}
}

// subflow_pacing: accepted values, its bpf_cgroup, and errors naming the
// field and the line.
func TestPacingConfig(t *testing.T) {
	base := "socket: /tmp/a.sock\n"
	if c, err := ParseConfig([]byte(base)); err != nil || c.SubflowPacing {
		t.Fatalf("unset: %+v, %v", c, err)
	}
	if c, err := ParseConfig([]byte(base + "subflow_pacing: false\n")); err != nil || c.SubflowPacing {
		t.Fatalf("false: %+v, %v", c, err)
	}
	c, err := ParseConfig([]byte(base + "subflow_pacing: true\nsubflow_lowat: 0\nbpf_cgroup: /sys/fs/cgroup/x\n"))
	if err != nil || !c.SubflowPacing || c.SubflowLowat != 0 || c.BPFCgroup != "/sys/fs/cgroup/x" {
		t.Fatalf("pacing alone with bpf_cgroup: %+v, %v", c, err)
	}
	// subflow_lowat unset: the default limit beside it, in the same cgroup.
	c, err = ParseConfig([]byte(base + "subflow_pacing: true\nbpf_cgroup: /sys/fs/cgroup/x\n"))
	if err != nil || !c.SubflowPacing || c.SubflowLowat != DefaultSubflowLowat || c.BPFCgroup != "/sys/fs/cgroup/x" {
		t.Fatalf("pacing with the default lowat and bpf_cgroup: %+v, %v", c, err)
	}
	c, err = ParseConfig([]byte(base + "subflow_pacing: true\nsubflow_lowat: 131072\nbpf_cgroup: /sys/fs/cgroup/x\n"))
	if err != nil || !c.SubflowPacing || c.SubflowLowat != 131072 || c.BPFCgroup != "/sys/fs/cgroup/x" {
		t.Fatalf("pacing and lowat: %+v, %v", c, err)
	}
	var sum bytes.Buffer
	Summary(&sum, "a.yaml", c)
	if !strings.Contains(sum.String(), "subflow pacing on") {
		t.Errorf("summary %q", sum.String())
	}
	for in, want := range map[string]string{
		"subflow_pacing: fast\n":                "config:2",
		"subflow_pacing:\n":                     "config:2:16: subflow_pacing: want true or false, got null",
		"subflow_pacing: true\nbpf_cgroup: x\n": "bpf_cgroup: \"x\" is not a clean absolute path",
		"subflow_pacing: false\nsubflow_lowat: 0\nbpf_cgroup: /sys/fs/cgroup/x\n":     "nothing attaches a BPF program",
		"probe_interval: 100ms\nsubflow_pacing: true\ncwnd_clamp:\n  enabled: true\n": "config:3:17: subflow_pacing: cannot be combined with cwnd_clamp",
	} {
		_, err := ParseConfig([]byte(base + in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", in, err, want)
		}
	}
}
