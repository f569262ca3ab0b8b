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
)

type fakeClampMap struct {
	set    map[bpfclamp.Key]uint32
	closed bool
}

func (f *fakeClampMap) Set(k bpfclamp.Key, segs uint32) error { f.set[k] = segs; return nil }
func (f *fakeClampMap) Close() error                          { f.closed = true; return nil }

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
	m := &fakeClampMap{set: map[bpfclamp.Key]uint32{}}
	var logs bytes.Buffer
	c := startClamps(ClampSettings{}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), func(string) (clampMap, error) { return m, nil })
	ms := []policy.Measurement{
		{Local: netip.MustParseAddrPort("10.0.1.1:40000"), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 30 * time.Millisecond, RTT: 90 * time.Millisecond, SndMSS: 1448},
		{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368},
	}
	c.measured(ms)
	want := map[bpfclamp.Key]uint32{{Local: clampTunnel.Local, Remote: clampServer.Addr()}: 56}
	if len(m.set) != 1 || m.set[bpfclamp.Key{Local: clampTunnel.Local, Remote: clampServer.Addr()}] != 56 {
		t.Fatalf("map %v, want %v", m.set, want)
	}
	st := c.status()
	if st.State != "active" || len(st.Pairs) != 1 || st.Pairs[0].Segments != 56 {
		t.Errorf("status %+v", st)
	}
	if err := c.close(); err != nil || !m.closed {
		t.Errorf("close: %v, closed %v", err, m.closed)
	}
}

// A program that cannot be attached: one warning naming the reason, no
// clamps, status says failed with the reason; the agent carries on.
func TestClampsAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	c := startClamps(ClampSettings{Cgroup: "/nonexistent"}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), func(string) (clampMap, error) {
		return nil, errors.New("bpfclamp: load sock_ops program: operation not permitted")
	})
	c.measured([]policy.Measurement{{Local: netip.AddrPortFrom(clampTunnel.Local, 41000), Remote: clampServer, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}})
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "operation not permitted") || !strings.Contains(logs.String(), "running without them") {
		t.Errorf("log %q: want one line with the reason", logs.String())
	}
	if st := c.status(); st.State != "failed" || !strings.Contains(st.Error, "operation not permitted") {
		t.Errorf("status %+v", st)
	}
	if err := c.close(); err != nil {
		t.Error(err)
	}
}

// The real program on a path that is no cgroup v2 directory fails the
// same way (an error naming the path; as non-root, the BPF load fails).
func TestClampsRealAttachFailure(t *testing.T) {
	var logs bytes.Buffer
	c := startClamps(ClampSettings{Cgroup: t.TempDir()}, clampSources(), slog.New(slog.NewTextHandler(&logs, nil)), attachClamp)
	if st := c.status(); st.State != "failed" || st.Error == "" {
		t.Fatalf("status %+v, want failed with a reason", st)
	}
	c.close()
}

func TestClampConfig(t *testing.T) {
	c, err := ParseConfig([]byte("cwnd_clamp:\n  enabled: true\n"))
	if err != nil || c.CwndClamp == nil || c.CwndClamp.Cgroup != "" || c.Agent.ProbeInterval != 100*time.Millisecond {
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
		"cwnd_clamp:\n  enabled: true\nprobe_interval: 0s\n":            "cwnd_clamp: needs measurements",
	} {
		_, err := ParseConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "config:") {
			t.Errorf("%q: error %v, want one naming %q with its position", in, err, want)
		}
	}
}
