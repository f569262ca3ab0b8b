package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/convclient"
)

// TestStatusShowsConversions: a converted connection the agent manages is
// tagged with its destination and listed with its converter; counters and
// converters are printed.
func TestStatusShowsConversions(t *testing.T) {
	conv, err := json.Marshal(convclient.Status{
		Counters:   convclient.Counters{Routed: 3, Converted: 2, Direct: map[string]uint64{"unknown": 1}, Learned: 1, LearnedNoMPTCP: 1},
		Converters: []convclient.ConverterStatus{{Relay: "r2", Address: "10.0.2.2:45674", Tickets: 3, RTTms: 20.5, Used: 2}},
		Recent: []convclient.Conversion{
			{Local: "10.0.1.1:40000", Converter: "10.0.2.2:45674", Name: "r2", Destination: "10.0.3.2:5201", Since: time.Now()},
			{Local: "10.0.1.1:39000", Converter: "10.0.2.2:45674", Name: "r2", Destination: "10.0.3.2:5201", Since: time.Now()},
		},
		NoMPTCP: []convclient.DestStatus{{Destination: "10.0.3.2:5201", Expires: time.Now().Add(time.Hour), Convertible: true, Conversions: 2},
			{UID: 1000, Destination: "10.0.3.3:80", Expires: time.Now().Add(time.Hour), Convertible: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st := agent.Status{
		Connections: []agent.ConnStatus{{Token: "0000abcd", Local: "10.0.1.1:40000", Remote: "10.0.2.2:45674", Established: true}},
		Conversions: conv,
	}
	out := captureStatus(t, st)
	for _, want := range []string{"0000abcd (converted to 10.0.3.2:5201)", "2 converted of 3 connects", "direct: unknown 1",
		"r2", "20.5", "CONVERTED CONNECTION", "10.0.1.1:40000", "WITHOUT MPTCP", "everyone (root)", "uid 1000 only"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// The conversion whose connection is gone is not listed as live.
	if strings.Contains(out, "10.0.1.1:39000") {
		t.Errorf("a connection the agent no longer has is listed:\n%s", out)
	}
}

// captureStatus returns what printStatus prints for st.
func captureStatus(t *testing.T, st agent.Status) string {
	t.Helper()
	return captureStdout(t, func() { printStatus(st) })
}

// captureStdout returns what fn prints on os.Stdout (less than a pipe's
// buffer).
func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	fn()
	os.Stdout = old
	w.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

// Status says when the kernel made new connections
// plain TCP, and the fix; nothing when it did not.
func TestStatusShowsBlackhole(t *testing.T) {
	st := agent.Status{Blackhole: &agent.BlackholeStatus{State: agent.BlackholeDisabled, Since: time.Date(2026, 11, 26, 17, 0, 0, 0, time.Local),
		Until: time.Date(2026, 11, 26, 18, 0, 0, 0, time.Local), TimeoutS: 3600, Fallbacks: 12, Fix: agent.BlackholeFix(3600)}}
	out := captureStatus(t, st)
	for _, want := range []string{"WARNING: the kernel disabled MPTCP for new connections (since 17:00:00, at least until 18:00:00",
		"12 connections made plain TCP", "fix: sysctl -w net.mptcp.blackhole_timeout=3600"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	st.Blackhole = &agent.BlackholeStatus{State: agent.BlackholeOK, Disables: 3}
	if out := captureStatus(t, st); strings.Contains(out, "blackhole") || strings.Contains(out, "WARNING") {
		t.Errorf("status warns without a disable in force:\n%s", out)
	}
}

// Status names each relay's state and what to check.
func TestStatusShowsRelays(t *testing.T) {
	st := agent.Status{
		Detours: []agent.DetourStatus{{Kind: "nat", Relay: "fra1", Remote: "192.0.2.2:40000", Healthy: false, LastError: "relay revoked: removed"}},
		Relays: []agent.RelayStatus{
			{Name: "ams1", State: agent.RelayNoAnswer, Detail: "check the relay's address", LastError: "ping: no handshake response"},
			{Name: "fra1", State: agent.RelayRevoked, Detail: "the relay accepted this member earlier", Tunnel: true},
			{Name: "par1", State: agent.RelayOK, LastSuccess: time.Now()},
		},
	}
	out := captureStatus(t, st)
	for _, want := range []string{"RELAY", "ams1", "no-answer", "ping: no handshake response", "fra1: revoked: the relay accepted this member earlier",
		"unusable", "relay revoked: removed"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "par1: ok") {
		t.Errorf("a detail line for a relay that is ok:\n%s", out)
	}
}

// captureStderr returns what fn prints on os.Stderr.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	fn()
	os.Stderr = old
	w.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

// Issue 29 item 2: run says once, before the program, that no agent
// answers; a live agent socket gets no warning.
func TestRunWarnsWithoutAgent(t *testing.T) {
	dir := t.TempDir()
	none := filepath.Join(dir, "none.sock")
	out := captureStderr(t, func() { checkAgent(none, "") })
	if strings.Count(out, "warning: no mpdetour agent answers on "+none) != 1 {
		t.Fatalf("without agent: %q", out)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if out := captureStderr(t, func() { checkAgent(filepath.Join(dir, "agent.sock"), "") }); out != "" {
		t.Fatalf("with an agent: %q", out)
	}
}

// Status prints one line per address family and a connection's
// cross-family state.
func TestStatusShowsFamilies(t *testing.T) {
	st := agent.Status{
		Connections: []agent.ConnStatus{{Token: "00000007", Local: "10.0.1.1:40000", Remote: "10.0.2.2:5201", Established: true, Socket: "AF_INET6",
			CrossFamily: "IPv6 detours toward [fd00:2::2]:5201 (from mapping)",
			Subflows:    []agent.SubflowStatus{{Path: "default", Remote: "10.0.2.2:5201", State: "up"}, {Path: "nat:r6", Remote: "[fd00:3::2]:4000", State: "up"}}}},
		Detours: []agent.DetourStatus{{Name: "a", Remote: "10.0.3.2:4000", Healthy: true}, {Name: "b", Remote: "[fd00:3::2]:4000", Healthy: true},
			{Name: "c", Local: "fd09::2", Remote: "[fd00:2::2]:5201"}},
	}
	agent.Summarize(&st)
	out := captureStatus(t, st)
	for _, want := range []string{
		"IPv4: 1 connections (1 on AF_INET6), 1 subflows up (0 cross-family), 1 detours (1 healthy)",
		"IPv6: 0 connections (0 on AF_INET6), 1 subflows up (1 cross-family), 2 detours (1 healthy)",
		"[AF_INET6; IPv6 detours toward [fd00:2::2]:5201 (from mapping)]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}
