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
)

// scaledLowat is a scaled mechanism (floor 128 KiB, ceiling 4 MiB) on a
// fake program.
func scaledLowat(t *testing.T) (*subflowLowat, *fakeClampMap) {
	t.Helper()
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
	l := startLowat(128<<10, 4<<20, false, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	return l, m
}

func lwMeasure(tok uint32, local, remote netip.AddrPort, rtt time.Duration) policy.Measurement {
	return policy.Measurement{Token: tok, Local: local, Remote: remote, RTT: rtt}
}

// Scaled: a new subflow's entry is the floor (T = 0: one write, as
// fixed); at a probe round every measured subflow of the connection gets
// the connection's largest RTT; a round whose largest RTT moved by 1/8 or
// less writes nothing, one that moved by more rewrites every entry; a
// join without a measurement keeps the floor until it has one; a second
// connection's RTTs stay out of the first's entries; the entries go with
// the subflows.
func TestLowatScaledEntries(t *testing.T) {
	l, m := scaledLowat(t)
	initial := bpfclamp.Conn{Local: lwClient, Remote: lwServer}
	join := bpfclamp.Conn{Local: lwJoin, Remote: lwRelay}
	fixed := bpfclamp.Lowat{Floor: 128 << 10, Ceil: 4 << 20}
	scaled := func(T time.Duration) bpfclamp.Lowat { v := fixed; v.MaxRTT = T; return v }

	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}, {Local: lwJoin, Remote: lwRelay}})
	if m.lowatWrites != 2 || m.scaled[initial] != fixed || m.scaled[join] != fixed {
		t.Fatalf("new subflows: %d writes, entries %v; want both at the floor (T 0)", m.lowatWrites, m.scaled)
	}
	// Only the initial subflow is measured yet: T is its RTT, the join
	// keeps the floor.
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 27*time.Millisecond)})
	if m.scaled[initial] != scaled(27*time.Millisecond) || m.scaled[join] != fixed || m.lowatWrites != 3 {
		t.Fatalf("first round: %d writes, entries %v", m.lowatWrites, m.scaled)
	}
	// The join's first measurement: T is the largest RTT, both rewritten.
	l.measured([]policy.Measurement{
		lwMeasure(1, lwClient, lwServer, 27*time.Millisecond),
		lwMeasure(1, lwJoin, lwRelay, 365*time.Millisecond),
	})
	if m.scaled[initial] != scaled(365*time.Millisecond) || m.scaled[join] != scaled(365*time.Millisecond) || m.lowatWrites != 5 {
		t.Fatalf("join measured: %d writes, entries %v; want both at T 365ms", m.lowatWrites, m.scaled)
	}
	// Within 1/8 of 365 ms (either way): nothing written.
	for _, rtt := range []time.Duration{400 * time.Millisecond, 320 * time.Millisecond, 365 * time.Millisecond} {
		l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 30*time.Millisecond), lwMeasure(1, lwJoin, lwRelay, rtt)})
	}
	if m.lowatWrites != 5 {
		t.Fatalf("RTTs within 1/8: %d writes, want 5 (none)", m.lowatWrites)
	}
	// A second connection with a longer RTT on the same round: its own
	// entries only.
	other := bpfclamp.Conn{Local: netip.MustParseAddrPort("10.0.1.1:40001"), Remote: lwServer}
	l.subflows(2, []agent.SubflowPair{{Local: other.Local, Remote: other.Remote}})
	l.measured([]policy.Measurement{
		lwMeasure(1, lwClient, lwServer, 30*time.Millisecond),
		lwMeasure(1, lwJoin, lwRelay, 370*time.Millisecond),
		lwMeasure(2, other.Local, other.Remote, 2*time.Second),
	})
	if m.scaled[initial] != scaled(365*time.Millisecond) || m.scaled[other] != scaled(2*time.Second) || m.lowatWrites != 7 {
		t.Fatalf("second connection: %d writes, entries %v", m.lowatWrites, m.scaled)
	}
	// More than 1/8 down: both of connection 1's entries.
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 30*time.Millisecond), lwMeasure(1, lwJoin, lwRelay, 300*time.Millisecond)})
	if m.scaled[initial] != scaled(300*time.Millisecond) || m.scaled[join] != scaled(300*time.Millisecond) || m.scaled[other] != scaled(2*time.Second) || m.lowatWrites != 9 {
		t.Fatalf("T down by 18%%: %d writes, entries %v", m.lowatWrites, m.scaled)
	}
	if st := l.status(); st.State != "active" || st.Scale != "rtt" || st.Ceil != 4<<20 || st.Bytes != 128<<10 || st.Pairs != 3 || st.Rewrites != 6 {
		t.Errorf("status %+v", st)
	}
	// A join comes back after it closed: the floor again until measured.
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	if _, ok := m.scaled[join]; ok {
		t.Fatalf("the join closed: entries %v", m.scaled)
	}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}, {Local: lwJoin, Remote: lwRelay}})
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 290*time.Millisecond)})
	if m.scaled[join] != fixed || m.scaled[initial] != scaled(300*time.Millisecond) {
		t.Fatalf("join back, not measured: entries %v", m.scaled)
	}
	l.subflows(1, nil)
	l.subflows(2, nil)
	if len(m.scaled) != 0 || m.deletedAbsent != 0 || l.status().Pairs != 0 {
		t.Fatalf("after both connections: entries %v, %d deletions of absent entries", m.scaled, m.deletedAbsent)
	}
	// Measurements of connections the mechanism does not manage (not
	// selected, or gone): nothing.
	n := m.lowatWrites
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, time.Second), lwMeasure(9, lwClient, lwServer, time.Second)})
	if m.lowatWrites != n {
		t.Errorf("measurements of unmanaged connections wrote %d entries", m.lowatWrites-n)
	}
}

// A backup subflow's RTT (the scheduler sends on it only when no active
// subflow exists) and an unmanaged subflow's of the same connection do
// not count toward T: the active subflows' entries keep their own
// largest RTT; the backup's entry still gets the connection's T.
func TestLowatScaledIgnoresBackup(t *testing.T) {
	l, m := scaledLowat(t)
	initial := bpfclamp.Conn{Local: lwClient, Remote: lwServer}
	join := bpfclamp.Conn{Local: lwJoin, Remote: lwRelay}
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}, {Local: lwJoin, Remote: lwRelay}})
	backup := lwMeasure(1, lwJoin, lwRelay, 400*time.Millisecond)
	backup.Backup = true
	unmanaged := lwMeasure(1, netip.MustParseAddrPort("10.0.9.9:40009"), lwServer, 900*time.Millisecond)
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 30*time.Millisecond), backup, unmanaged})
	if m.scaled[initial].MaxRTT != 30*time.Millisecond || m.scaled[join].MaxRTT != 30*time.Millisecond {
		t.Fatalf("entries %v: want T 30ms (the active subflow's), not the backup's 400ms or the unmanaged 900ms", m.scaled)
	}
	// Once active, its RTT counts.
	backup.Backup = false
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 30*time.Millisecond), backup})
	if m.scaled[initial].MaxRTT != 400*time.Millisecond {
		t.Fatalf("entries %v: want T 400ms once the join is active", m.scaled)
	}
}

// A failed rewrite (a full map) is tried again at the next round.
func TestLowatScaledRetriesRewrite(t *testing.T) {
	l, m := scaledLowat(t)
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	m.failSets = 1
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 50*time.Millisecond)})
	k := bpfclamp.Conn{Local: lwClient, Remote: lwServer}
	if m.scaled[k].MaxRTT != 0 {
		t.Fatalf("a failed write took effect: %v", m.scaled)
	}
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, 52*time.Millisecond)})
	if m.scaled[k].MaxRTT != 50*time.Millisecond {
		t.Fatalf("the next round: %v, want T 50ms (within 1/8 of the T decided)", m.scaled)
	}
}

// Fixed (subflow_lowat_scale: none): probe rounds write nothing.
func TestLowatFixedIgnoresRTT(t *testing.T) {
	m := &fakeClampMap{set: map[bpfclamp.Key]bpfclamp.Limits{}}
	l := startLowat(128<<10, 0, false, openBPF("", func(string) (clampMap, error) { return m, nil }), slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	l.subflows(1, []agent.SubflowPair{{Local: lwClient, Remote: lwServer}})
	l.measured([]policy.Measurement{lwMeasure(1, lwClient, lwServer, time.Second)})
	if m.lowatWrites != 1 || m.scaled[bpfclamp.Conn{Local: lwClient, Remote: lwServer}] != (bpfclamp.Lowat{Floor: 128 << 10}) {
		t.Fatalf("%d writes, entries %v", m.lowatWrites, m.scaled)
	}
	if st := l.status(); st.Scale != "" || st.Ceil != 0 {
		t.Errorf("status %+v", st)
	}
}

// The ceiling is the namespace's tcp_wmem maximum, at least the floor;
// unreadable or malformed, Linux's default 4 MiB with one warning.
func TestLowatCeil(t *testing.T) {
	for _, tc := range []struct {
		v    string
		err  error
		want uint32
		warn bool
	}{
		{"4096\t16384\t6291456\n", nil, 6291456, false},
		{"4096 16384 65536", nil, 128 << 10, false}, // below the floor
		{"4096 16384 99999999999", nil, 1<<31 - 1, false},
		{"", errors.New("open /proc/sys/net/ipv4/tcp_wmem: no such file or directory"), 4 << 20, true},
		{"4096 16384", nil, 4 << 20, true},
		{"4096 16384 x", nil, 4 << 20, true},
	} {
		var logs bytes.Buffer
		got := lowatCeil("", 128<<10, func(string) (string, error) { return tc.v, tc.err }, slog.New(slog.NewTextHandler(&logs, nil)))
		if got != tc.want || strings.Contains(logs.String(), "unreadable") != tc.warn || strings.Count(logs.String(), "\n") > 1 {
			t.Errorf("%q, %v: ceiling %d, log %q; want %d, a warning %v", tc.v, tc.err, got, logs.String(), tc.want, tc.warn)
		}
	}
	// This host's, read for real.
	if v, err := readWmem(""); err != nil || len(strings.Fields(v)) != 3 {
		t.Errorf("readWmem: %q, %v", v, err)
	}
}

// subflow_lowat_scale: accepted values, the probes it turns on, and
// errors naming the key and the line.
func TestLowatScaleConfig(t *testing.T) {
	base := "socket: /tmp/a.sock\n"
	c, err := ParseConfig([]byte(base))
	if err != nil || c.SubflowLowatScale != LowatScaleNone {
		t.Fatalf("unset: %+v, %v", c.SubflowLowatScale, err)
	}
	c, err = ParseConfig([]byte(base + "subflow_lowat: 131072\nsubflow_lowat_scale: rtt\n"))
	if err != nil || c.SubflowLowatScale != LowatScaleRTT || c.SubflowLowat != 131072 || c.Agent.ProbeInterval != decidingProbeInterval {
		t.Fatalf("rtt: %q, lowat %d, probe %v, %v", c.SubflowLowatScale, c.SubflowLowat, c.Agent.ProbeInterval, err)
	}
	// subflow_lowat unset: the default is the floor.
	c, err = ParseConfig([]byte(base + "subflow_lowat_scale: rtt\n"))
	if err != nil || c.SubflowLowatScale != LowatScaleRTT || c.SubflowLowat != DefaultSubflowLowat || !c.SubflowLowatDefault {
		t.Fatalf("rtt, lowat unset: %q, lowat %d, %v", c.SubflowLowatScale, c.SubflowLowat, err)
	}
	c, err = ParseConfig([]byte(base + "probe_interval: 250ms\nsubflow_lowat: 131072\nsubflow_lowat_scale: rtt\n"))
	if err != nil || c.Agent.ProbeInterval != 250*time.Millisecond {
		t.Fatalf("rtt with probe_interval: %v, %v", c.Agent.ProbeInterval, err)
	}
	c, err = ParseConfig([]byte(base + "subflow_lowat_scale: none\n"))
	if err != nil || c.SubflowLowatScale != LowatScaleNone || c.Agent.ProbeInterval != agent.DefaultOptions().ProbeInterval {
		t.Fatalf("none: %q, probe %v, %v", c.SubflowLowatScale, c.Agent.ProbeInterval, err)
	}
	for in, want := range map[string]string{
		"subflow_lowat: 131072\nsubflow_lowat_scale: RTT\n":                     `config:3:22: subflow_lowat_scale: "RTT" is not none`,
		"subflow_lowat: 131072\nsubflow_lowat_scale: cwnd\n":                    `config:3:22: subflow_lowat_scale: "cwnd" is not none`,
		"subflow_lowat: 131072\nsubflow_lowat_scale: 1\n":                       `subflow_lowat_scale: "1" is not none`,
		"subflow_lowat: 131072\nsubflow_lowat_scale: [rtt]\n":                   "config:3",
		"subflow_lowat: 131072\nsubflow_lowat_scale:\n":                         "config:3:21: subflow_lowat_scale: want none or rtt, got null",
		"subflow_lowat: 131072\nsubflow_lowat_scale: ~\n":                       "config:3:22: subflow_lowat_scale: want none or rtt, got null",
		"subflow_lowat: 0\nsubflow_lowat_scale: rtt\n":                          "config:3:22: subflow_lowat_scale: rtt needs subflow_lowat > 0",
		"probe_interval: 0s\nsubflow_lowat: 131072\nsubflow_lowat_scale: rtt\n": "config:2:17: probe_interval: 0s turns off the measurements subflow_lowat_scale: rtt scales by",
	} {
		_, err := ParseConfig([]byte(base + in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", in, err, want)
		}
	}
}
