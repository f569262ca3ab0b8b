package agentd

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

// fakeClampMap stands for the BPF program: it records the limits set
// and refuses pacing rates when refusePacing is set, as a kernel without
// SO_MAX_PACING_RATE from BPF would at the next callback.
type fakeClampMap struct {
	set    map[bpfclamp.Key]bpfclamp.Limits
	lowats map[bpfclamp.Conn]uint32 // each entry's floor
	// scaled: each entry as written; lowatWrites counts the writes.
	scaled       map[bpfclamp.Conn]bpfclamp.Lowat
	lowatWrites  int
	refusePacing bool
	refused      bpfclamp.Refusals
	refusedErr   error
	closed       bool
	// deletedAbsent counts deletions of pairs without an entry; sets is
	// what LowatSets answers.
	deletedAbsent int
	sets          uint64
	// failSets: the next this many Sets fail (a full map);
	// refusedAfter: Refused answers refused only from its call number
	// refusedAfter+1 on (the kernel refuses at a later callback).
	failSets     int
	refusedAfter int
	refusedCalls int
}

func (f *fakeClampMap) Set(k bpfclamp.Key, l bpfclamp.Limits) error {
	if f.failSets > 0 {
		f.failSets--
		return errors.New("bpfclamp: set: argument list too long")
	}
	f.set[k] = l
	if l.PacingRate != 0 && f.refusePacing {
		f.refused.Pacing = unix.EINVAL
	}
	return nil
}
func (f *fakeClampMap) SetLowatScaled(k bpfclamp.Conn, l bpfclamp.Lowat) error {
	if f.failSets > 0 {
		f.failSets--
		return errors.New("bpfclamp: set the lowat: argument list too long")
	}
	if f.lowats == nil {
		f.lowats, f.scaled = map[bpfclamp.Conn]uint32{}, map[bpfclamp.Conn]bpfclamp.Lowat{}
	}
	f.lowats[k], f.scaled[k] = l.Floor, l
	f.lowatWrites++
	return nil
}
func (f *fakeClampMap) DeleteLowat(k bpfclamp.Conn) error {
	if _, ok := f.lowats[k]; !ok {
		f.deletedAbsent++
	}
	delete(f.lowats, k)
	delete(f.scaled, k)
	return nil
}
func (f *fakeClampMap) Delete(k bpfclamp.Key) error {
	if _, ok := f.set[k]; !ok {
		f.deletedAbsent++
	}
	delete(f.set, k)
	return nil
}
func (f *fakeClampMap) Refused() (bpfclamp.Refusals, error) {
	if f.refusedCalls++; f.refusedCalls <= f.refusedAfter {
		return bpfclamp.Refusals{}, f.refusedErr
	}
	return f.refused, f.refusedErr
}
func (f *fakeClampMap) LowatSets() (uint64, error) { return f.sets, nil }
func (f *fakeClampMap) Close() error               { f.closed = true; return nil }

var (
	clampServer = netip.MustParseAddrPort("10.0.2.2:5201")
	clampTunnel = detour.Detour{Kind: detour.Tunnel, Relay: "r1", Local: netip.MustParseAddr("10.9.0.2"), Remote: clampServer}
)

func clampSources() []detour.Source {
	return []detour.Source{static.New([]static.Entry{{Detour: clampTunnel, Servers: []netip.Prefix{netip.MustParsePrefix("10.0.2.2/32")}}})}
}

// A tunnel subflow that queues gets its clamp written into the map; the
// default path's subflow does not; status lists the pair; close detaches.
func TestClampsApplied(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
	var logs bytes.Buffer
	c := startClamps(ClampSettings{}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), openBPF("", func(string) (clampMap, error) { return m, nil }))
	ms := []policy.Measurement{
		{Local: netip.MustParseAddrPort("10.0.1.1:40000"), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 30 * time.Millisecond, RTT: 90 * time.Millisecond, SndMSS: 1448},
		{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368},
	}
	c.measured(ms)
	want := map[bpfclamp.Key]bpfclamp.Limits{{Local: clampTunnel.Local, Remote: clampServer.Addr()}: {CwndSegments: 56}}
	if len(m.set) != 1 || m.set[bpfclamp.Key{Local: clampTunnel.Local, Remote: clampServer.Addr()}] != (bpfclamp.Limits{CwndSegments: 56}) {
		t.Fatalf("map %v, want %v", m.set, want)
	}
	st := c.status()
	if st.State != "active" || st.Mode != policy.ClampCwnd || st.Fallback != "" || len(st.Pairs) != 1 || st.Pairs[0].Segments != 56 {
		t.Errorf("status %+v", st)
	}
	if err := c.prog.close(); err != nil || !m.closed {
		t.Errorf("close: %v, closed %v", err, m.closed)
	}
}

// A program that cannot be attached: one warning naming the reason, no
// clamps, status says failed with the reason; the agent carries on.
func TestClampsAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	prog := openBPF("/nonexistent", func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: load sock_ops program: operation not permitted")
	})
	c := startClamps(ClampSettings{}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), prog)
	c.measured([]policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}})
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "operation not permitted") || !strings.Contains(logs.String(), "running without them") {
		t.Errorf("log %q: want one line with the reason", logs.String())
	}
	if st := c.status(); st.State != "failed" || !strings.Contains(st.Error, "operation not permitted") {
		t.Errorf("status %+v", st)
	}
	if err := prog.close(); err != nil {
		t.Error(err)
	}
}

// The real program on a path that is no cgroup v2 directory fails the
// same way (an error naming the path; as non-root, the BPF load fails).
func TestClampsRealAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	prog := openBPF(t.TempDir(), func(cg string) (clampMap, error) { return attachClamp(cg, "", bpfclamp.Options{}) })
	c := startClamps(ClampSettings{}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), prog)
	if st := c.status(); st.State != "failed" || st.Error == "" {
		t.Fatalf("status %+v, want failed with a reason", st)
	}
	prog.close()
}

func TestClampConfig(t *testing.T) {
	c, err := ParseConfig([]byte("cwnd_clamp:\n  enabled: true\n"))
	if err != nil || c.CwndClamp == nil || c.BPFCgroup != "" || c.Agent.ProbeInterval != 100*time.Millisecond {
		t.Fatalf("enabled: %+v, probe %s, %v", c.CwndClamp, c.Agent.ProbeInterval, err)
	}
	if c, err := ParseConfig([]byte("cwnd_clamp:\n  enabled: false\n")); err != nil || c.CwndClamp != nil {
		t.Fatalf("disabled: %+v %v", c.CwndClamp, err)
	}
	if c, err := ParseConfig([]byte("policy: static\n")); err != nil || c.CwndClamp != nil || c.Agent.ProbeInterval != time.Second {
		t.Fatalf("default: %+v %v", c.CwndClamp, err)
	}
	for in, want := range map[string]string{
		"cwnd_clamp:\n  enabled: true\n  cgroup: sys/fs/cgroup\n":       "cwnd_clamp.cgroup",
		"cwnd_clamp:\n  enabled: true\n  cgroup: /sys/fs/cgroup/../x\n": "cwnd_clamp.cgroup",
		"cwnd_clamp:\n  cgroup: /sys/fs/cgroup\n":                       "without cwnd_clamp.enabled",
		"cwnd_clamp:\n  enabled: true\n  gain: 2\n":                     "gain",
		"cwnd_clamp:\n  enabled: true\n  mode: rate\n":                  "cwnd_clamp.mode: \"rate\" is not a clamp mode (cwnd, pacing or both)",
		"cwnd_clamp:\n  mode: pacing\n":                                 "cwnd_clamp.mode: set without cwnd_clamp.enabled",
		"cwnd_clamp:\n  cgroup: /sys/fs/cgroup\n  mode: pacing\n":       "cwnd_clamp.cgroup: set without cwnd_clamp.enabled",
		"cwnd_clamp:\n  enabled: true\nprobe_interval: 0s\n":            "cwnd_clamp: needs measurements",
	} {
		_, err := ParseConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "config:") {
			t.Errorf("%q: error %v, want one naming %q with its position", in, err, want)
		}
	}
}

// The modes from the config: cwnd by default, pacing and both as
// written.
func TestClampConfigMode(t *testing.T) {
	for in, want := range map[string]policy.ClampMode{
		"cwnd_clamp:\n  enabled: true\n":                 policy.ClampCwnd,
		"cwnd_clamp:\n  enabled: true\n  mode: cwnd\n":   policy.ClampCwnd,
		"cwnd_clamp:\n  enabled: true\n  mode: pacing\n": policy.ClampPacing,
		"cwnd_clamp:\n  enabled: true\n  mode: both\n":   policy.ClampBoth,
	} {
		c, err := ParseConfig([]byte(in))
		if err != nil || c.CwndClamp == nil || c.CwndClamp.Mode != want {
			t.Errorf("%q: %+v, %v; want mode %s", in, c.CwndClamp, err, want)
		}
	}
}

// The pacing mode writes rates (no cwnd clamp) into the map; both
// writes both; status shows the mode and each pair's rate.
func TestClampsPacingApplied(t *testing.T) {
	for mode, segs := range map[policy.ClampMode]uint32{policy.ClampPacing: 0, policy.ClampBoth: 56} {
		m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
		var logs bytes.Buffer
		c := startClamps(ClampSettings{Mode: mode}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), openBPF("", func(string) (clampMap, error) { return m, nil }))
		c.measured([]policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}})
		k := bpfclamp.Key{Local: clampTunnel.Local, Remote: clampServer.Addr()}
		if want := (bpfclamp.Limits{CwndSegments: segs, PacingRate: 1250000}); len(m.set) != 1 || m.set[k] != want {
			t.Errorf("%s: map %v, want %v", mode, m.set, want)
		}
		if st := c.status(); st.State != "active" || st.Mode != mode || len(st.Pairs) != 1 || st.Pairs[0].PacingRate != 1250000 || st.Pairs[0].Segments != segs {
			t.Errorf("%s: status %+v", mode, st)
		}
	}
}

// A kernel that refuses pacing rates from BPF: one warning naming the
// refusal, the pairs get cwnd clamps instead, status shows cwnd with the
// reason.
func TestClampsPacingRefused(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refusePacing: true}
	var logs bytes.Buffer
	c := startClamps(ClampSettings{Mode: policy.ClampPacing}, clampSources(), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), openBPF("", func(string) (clampMap, error) { return m, nil }))
	meas := []policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}}
	k := bpfclamp.Key{Local: clampTunnel.Local, Remote: clampServer.Addr()}
	for range 3 {
		c.measured(meas)
	}
	if want := (bpfclamp.Limits{CwndSegments: 56}); m.set[k] != want {
		t.Errorf("after the refusal: map %v, want %v", m.set, want)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "refused SO_MAX_PACING_RATE") || !strings.Contains(logs.String(), "invalid argument") {
		t.Errorf("log %q: want one warning with the refusal", logs.String())
	}
	if st := c.status(); st.State != "active" || st.Mode != policy.ClampCwnd || !strings.Contains(st.Fallback, "refused SO_MAX_PACING_RATE") || len(st.Pairs) != 1 || st.Pairs[0].Segments != 56 || st.Pairs[0].PacingRate != 0 {
		t.Errorf("status %+v", st)
	}
}

// Refusals that cannot be read are one warning (the fallback cannot
// work without them), not silence; the pacing clamps go on.
func TestClampsRefusalsUnreadable(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refusedErr: errors.New("map lookup: bad file descriptor")}
	var logs bytes.Buffer
	c := startClamps(ClampSettings{Mode: policy.ClampPacing}, clampSources(), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), openBPF("", func(string) (clampMap, error) { return m, nil }))
	meas := []policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}}
	for range 3 {
		c.measured(meas)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "cannot be read") || !strings.Contains(logs.String(), "bad file descriptor") {
		t.Errorf("log %q: want one warning naming the error", logs.String())
	}
	if st := c.status(); st.Mode != policy.ClampPacing || len(m.set) != 1 {
		t.Errorf("status %+v, map %v: want pacing clamps going on", st, m.set)
	}
}

// A refused cwnd clamp cannot fall back: one warning, and status says
// the clamps are not in effect (they were listed as if they were).
func TestClampsCwndRefused(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Cwnd: unix.EINVAL}}
	var logs bytes.Buffer
	c := startClamps(ClampSettings{}, clampSources(), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), openBPF("", func(string) (clampMap, error) { return m, nil }))
	meas := []policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}}
	for range 3 {
		c.measured(meas)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "cwnd clamps refused") || !strings.Contains(logs.String(), "invalid argument") {
		t.Errorf("log %q: want one warning with the refusal", logs.String())
	}
	if st := c.status(); st.State != "active" || st.Mode != policy.ClampCwnd || !strings.Contains(st.Refused, "TCP_BPF_SNDCWND_CLAMP") || !strings.Contains(st.Refused, "not in effect") {
		t.Errorf("status %+v: want the refusal shown", st)
	}
}

// In mode both a refused cwnd clamp leaves the pacing rates (the program
// sets them after the refusal): the warning does not say unclamped.
func TestClampsCwndRefusedBoth(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}, refused: bpfclamp.Refusals{Cwnd: unix.EINVAL}}
	var logs bytes.Buffer
	c := startClamps(ClampSettings{Mode: policy.ClampBoth}, clampSources(), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), openBPF("", func(string) (clampMap, error) { return m, nil }))
	meas := []policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}}
	for range 3 {
		c.measured(meas)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || strings.Contains(logs.String(), "unclamped") || !strings.Contains(logs.String(), "keep only their pacing-rate clamps") {
		t.Errorf("log %q: want one warning saying the pacing rates stay", logs.String())
	}
	if st := c.status(); st.Mode != policy.ClampBoth || !strings.Contains(st.Refused, "TCP_BPF_SNDCWND_CLAMP") {
		t.Errorf("status %+v: want mode both with the cwnd refusal shown", st)
	}
}
