package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/kerneltest"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// These tests run the agent's loop against kerneltest.Fake: no root, no
// namespaces. The kernel path has its namespace tests
// (agent_integration_test.go).

var (
	client = netip.MustParseAddrPort("10.0.1.1:40000")
	server = netip.MustParseAddrPort("10.0.2.2:5201")
	relay1 = netip.MustParseAddrPort("10.0.3.2:4000")
	relay2 = netip.MustParseAddrPort("10.0.4.2:4000")
)

func natDetour(name string, at netip.AddrPort) static.Entry {
	return static.Entry{Detour: detour.Detour{Kind: detour.NAT, Relay: name, Remote: at},
		Servers: []netip.Prefix{netip.PrefixFrom(server.Addr(), 32)}, Port: server.Port()}
}

type harness struct {
	t    *testing.T
	k    *kerneltest.Fake
	a    *agent.Agent
	stop func()
}

func start(t *testing.T, mode policy.Mode, detours ...static.Entry) *harness {
	t.Helper()
	return run(t, agent.Options{Subflows: 1, AnnouncedSubflows: 2, MaxConnections: 100, CommandWorkers: 1,
		Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: mode}, static.New(detours))
}

func (h *harness) connect(token uint32) {
	e := mptcppm.Event{Token: token, Local: client, Remote: server}
	e.Type = mptcppm.EventCreated
	c := e
	e.Type = mptcppm.EventEstablished
	h.k.Emit(c, e)
}

func (h *harness) wait(from int, what string, match func(policy.Intent) bool) (policy.Intent, int) {
	h.t.Helper()
	in, i, ok := h.k.WaitCommand(from, 3*time.Second, match)
	if !ok {
		h.t.Fatalf("no %s; commands: %v", what, h.k.Commands())
	}
	return in, i
}

func creates(to netip.AddrPort) func(policy.Intent) bool {
	return func(in policy.Intent) bool { return in.Action == policy.CreateSubflow && in.Remote == to }
}

func TestAgentOpensDetourSubflowAndReportsIt(t *testing.T) {
	h := start(t, policy.Static, natDetour("r1", relay1))
	h.connect(7)
	in, _ := h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	if in.Token != 7 || in.Local.Addr() != client.Addr() {
		t.Fatalf("create %v", in)
	}
	sub := netip.AddrPortFrom(client.Addr(), 50001)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 7, Local: sub, Remote: relay1})
	var st agent.Status
	roles := map[string]string{}
	for range 50 {
		st = h.a.Status()
		if len(st.Connections) == 1 {
			for _, s := range st.Connections[0].Subflows {
				roles[s.Path] = s.Role
			}
			if roles["nat:r1"] == "active" {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if roles["default"] != "active" || roles["nat:r1"] != "active" {
		t.Fatalf("roles %v, want default and nat:r1 active", roles)
	}
	// Closed connections disappear from status.
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventClosed, Token: 7})
	for range 50 {
		if st = h.a.Status(); len(st.Connections) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("closed connection still in status: %+v", st.Connections)
}

func TestAgentAdaptiveFailsOverDeadDetour(t *testing.T) {
	h := start(t, policy.Adaptive, natDetour("r1", relay1), natDetour("r2", relay2))
	h.connect(8)
	h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	sub := netip.AddrPortFrom(client.Addr(), 50001)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 8, Local: sub, Remote: relay1})
	// Data flows on both paths for a while, then r1 goes silent with data
	// outstanding: bytes_acked stops, a retransmission timeout fires.
	acked := uint64(0)
	for range 10 {
		acked += 100000
		h.k.SetSubflows([]mptcppm.Subflow{
			{Token: 8, Local: client, Remote: server, State: 1, RTT: 30 * time.Millisecond, BytesAcked: acked},
			{Token: 8, Local: sub, Remote: relay1, State: 1, RTT: 30 * time.Millisecond, BytesAcked: acked},
		})
		time.Sleep(50 * time.Millisecond)
	}
	dead := time.Now()
	for range 20 {
		acked += 100000
		h.k.SetSubflows([]mptcppm.Subflow{
			{Token: 8, Local: client, Remote: server, State: 1, RTT: 30 * time.Millisecond, BytesAcked: acked},
			{Token: 8, Local: sub, Remote: relay1, State: 1, RTT: 30 * time.Millisecond, BytesAcked: 1000000, Unacked: 20, Retransmits: 1},
		})
		time.Sleep(50 * time.Millisecond)
		if _, _, ok := h.k.WaitCommand(0, 0, func(in policy.Intent) bool { return in.Action == policy.DestroySubflow }); ok {
			break
		}
	}
	_, i := h.wait(0, "SUBFLOW_DESTROY of the dead r1 subflow", func(in policy.Intent) bool {
		return in.Action == policy.DestroySubflow && in.Remote == relay1
	})
	t.Logf("dead detour closed %s after it went silent", time.Since(dead).Round(time.Millisecond))
	h.wait(i, "replacement SUBFLOW_CREATE via r2", creates(relay2))
}

func TestAgentServerRefusingJoinsIsBackedOff(t *testing.T) {
	h := start(t, policy.Static, natDetour("r1", relay1), natDetour("r2", relay2))
	h.connect(9)
	// Every join is reset by the server right after it comes up.
	deadline := time.Now().Add(3 * time.Second)
	port := uint16(50000)
	from := 0
	for time.Now().Before(deadline) {
		in, i, ok := h.k.WaitCommand(from, 100*time.Millisecond, func(in policy.Intent) bool { return in.Action == policy.CreateSubflow })
		if !ok {
			continue
		}
		from = i + 1
		port++
		sf := netip.AddrPortFrom(client.Addr(), port)
		h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 9, Local: sf, Remote: in.Remote},
			mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 9, Local: sf, Remote: in.Remote})
	}
	n := 0
	for _, in := range h.k.Commands() {
		if in.Action == policy.CreateSubflow {
			n++
		}
	}
	if n > 6 {
		t.Fatalf("%d SUBFLOW_CREATE in 3 s against a server refusing every join", n)
	}
	st := h.a.Status()
	if len(st.Connections) != 1 || len(st.Connections[0].Refusals) == 0 || st.Connections[0].HoldUntil.IsZero() {
		t.Fatalf("status does not show the refusals and the hold: %+v", st.Connections)
	}
}

// A short connection that is gone by the time its SUBFLOW_CREATE runs (the
// kernel answers EINVAL "invalid token") says nothing about the detour: the
// next connection gets a detour subflow at once, not after a backoff.
func TestAgentClosedConnectionDoesNotBlameDetour(t *testing.T) {
	h := start(t, policy.Static, natDetour("r1", relay1))
	h.k.Reply(func(in policy.Intent) error {
		if in.Token == 11 {
			return &mptcppm.Error{Cmd: "SUBFLOW_CREATE", Token: 11, Errno: unix.EINVAL, Msg: "invalid token"}
		}
		return nil
	})
	h.connect(11)
	_, i := h.wait(0, "SUBFLOW_CREATE for the short connection", creates(relay1))
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventClosed, Token: 11})
	h.connect(12)
	in, _ := h.wait(i+1, "SUBFLOW_CREATE for the next connection", creates(relay1))
	if in.Token != 12 {
		t.Fatalf("create %v, want token 12", in)
	}
	for _, d := range h.a.Status().Detours {
		if d.Failed != 0 {
			t.Fatalf("detour %s counts %d failures for a connection that was gone: %s", d.Relay, d.Failed, d.LastError)
		}
	}
}

// The metrics come from the same snapshot as status, with bounded labels.
func TestAgentMetrics(t *testing.T) {
	h := start(t, policy.Static, natDetour("r1", relay1))
	h.connect(21)
	h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 21, Local: netip.AddrPortFrom(client.Addr(), 50021), Remote: relay1})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(agent.NewMetrics(h.a))
	want := map[string]bool{}
	for range 50 {
		want = gather(t, reg)
		if want["mpdetour_agent_subflows{path=nat,role=active} 1"] {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, k := range []string{
		"mpdetour_agent_connections{} 1",
		"mpdetour_agent_subflows{path=nat,role=active} 1",
		"mpdetour_agent_detour_subflows_established_total{detour=nat:r1} 1",
	} {
		if !want[k] {
			t.Errorf("missing %s in %v", k, want)
		}
	}
}

// The SUBFLOW_CREATE counters count the creates the agent sent and the
// ones the kernel refused, apart from other commands (the churn case of
// the attack suite reads them to tell a retry storm).
func TestAgentSubflowCreateMetrics(t *testing.T) {
	h := run(t, agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1,
		Backoff: time.Minute, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: policy.Static},
		static.New([]static.Entry{natDetour("r1", relay1), natDetour("r2", relay2)}))
	h.k.Reply(func(in policy.Intent) error {
		if in.Action == policy.CreateSubflow && in.Remote == relay2 {
			return &mptcppm.Error{Cmd: "subflow_create", Token: in.Token, Errno: unix.ECONNREFUSED}
		}
		return nil
	})
	h.connect(31)
	h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	h.wait(0, "SUBFLOW_CREATE via r2", creates(relay2))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(agent.NewMetrics(h.a))
	var have map[string]bool
	want := []string{"mpdetour_agent_subflow_creates_total{} 2", "mpdetour_agent_subflow_create_errors_total{} 1"}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		have = gather(t, reg)
		if have[want[0]] && have[want[1]] {
			break
		}
	}
	for _, k := range want {
		if !have[k] {
			t.Errorf("missing %s in %v", k, have)
		}
	}
	if st := h.a.Status().Counters; st.SubflowCreates > st.Commands || st.SubflowCreateErrors > st.CommandErrors {
		t.Errorf("creates %d/%d errors not within commands %d/%d errors", st.SubflowCreates, st.SubflowCreateErrors, st.Commands, st.CommandErrors)
	}
}

// gather returns the registry's series as "name{label=value,...} value".
func gather(t *testing.T, reg *prometheus.Registry) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := []string{}
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			have[fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(labels, ","), v)] = true
		}
	}
	return have
}

// The kernel's blackhole fallback and each relay's state are in the status
// and the metrics; a revoked relay's detours are not healthy.
func TestAgentBlackholeMetrics(t *testing.T) {
	bh := agent.BlackholeStatus{State: agent.BlackholeDisabled, Since: time.Now(), TimeoutS: 3600, Disables: 2, Fallbacks: 7, Fix: agent.BlackholeFix(3600)}
	h := run(t, agent.Options{Subflows: 1, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static, Blackhole: func() agent.BlackholeStatus { return bh },
		RelayStatus: func() []agent.RelayStatus {
			return []agent.RelayStatus{{Name: "r1", State: agent.RelayRevoked, LastSuccess: time.Unix(1700000000, 0)}}
		}}, static.New([]static.Entry{natDetour("r1", relay1)}))
	st := h.a.Status()
	if st.Blackhole == nil || st.Blackhole.State != agent.BlackholeDisabled || len(st.Relays) != 1 {
		t.Fatalf("status: %+v %+v", st.Blackhole, st.Relays)
	}
	seen := 0
	for _, d := range st.Detours {
		if d.Relay == "r1" {
			seen++
			if d.Healthy || !strings.Contains(d.LastError, "revoked") {
				t.Fatalf("a revoked relay's detour: %+v", d)
			}
		}
	}
	if seen == 0 {
		t.Fatalf("r1's detour not in the status: %+v", st.Detours)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(agent.NewMetrics(h.a))
	have := gather(t, reg)
	for _, k := range []string{"mpdetour_agent_mptcp_blackhole_disabled{} 1", "mpdetour_agent_mptcp_blackhole_disables_total{} 2",
		"mpdetour_agent_mptcp_blackhole_fallbacks_total{} 7",
		"mpdetour_agent_relay_state{relay=r1,state=revoked} 1", "mpdetour_agent_relay_state{relay=r1,state=ok} 0",
		"mpdetour_agent_relay_last_success_timestamp_seconds{relay=r1} 1.7e+09"} {
		if !have[k] {
			t.Errorf("missing %s in %v", k, have)
		}
	}
}

// A connection the kernel no longer lists is forgotten although its CLOSED
// event never came, and its grants are released (the soak found one
// tracked forever, its NAT mapping renewed forever); one the kernel lists
// stays.
func TestAgentSweepsConnectionsWithoutClosedEvent(t *testing.T) {
	cfg := agent.Options{Subflows: 1, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static, SweepEvery: 100 * time.Millisecond}
	k := kerneltest.New()
	a := agent.New(cfg, nil, k, nil, static.New([]static.Entry{natDetour("r1", relay1)}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); k.Close(); <-done }()
	for _, tok := range []uint32{21, 22} {
		k.Emit(mptcppm.Event{Type: mptcppm.EventCreated, Token: tok, Local: client, Remote: server},
			mptcppm.Event{Type: mptcppm.EventEstablished, Token: tok, Local: client, Remote: server})
	}
	// The kernel still has 22 (in any state), not 21.
	k.SetConnections([]mptcppm.Connection{{Token: 22, State: 4, Local: client, Remote: server}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := a.Status()
		has := map[string]bool{}
		for _, c := range st.Connections {
			has[c.Token] = true
		}
		if !has[fmt.Sprintf("%08x", 21)] && has[fmt.Sprintf("%08x", 22)] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after sweeps: connections %v, want only 00000016", has)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// strippedSource stands for pathcheck.Filter: it hands out one NAT detour
// and withholds another that strips MPTCP options.
type strippedSource struct{ good, bad detour.Detour }

func (s strippedSource) Prepare(netip.AddrPort)                 {}
func (s strippedSource) Detours(netip.AddrPort) []detour.Detour { return []detour.Detour{s.good} }
func (s strippedSource) Stripped() []detour.Detour              { return []detour.Detour{s.bad} }
func (s strippedSource) Unusable(d detour.Detour) (string, bool) {
	return "mptcp-stripped: test", d == s.bad
}

// A detour withheld by the path check shows in status, unhealthy, with
// the reason; subflows go through the other one only.
func TestAgentStatusShowsStrippedDetour(t *testing.T) {
	good := detour.Detour{Kind: detour.NAT, Relay: "r1", Remote: relay1}
	bad := detour.Detour{Kind: detour.NAT, Relay: "r2", Remote: relay2}
	cfg := agent.Options{Subflows: 2, AnnouncedSubflows: 2, MaxConnections: 100, CommandWorkers: 1,
		Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: policy.Static}
	k := kerneltest.New()
	a := agent.New(cfg, nil, k, nil, strippedSource{good, bad})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); k.Close(); <-done }()
	h := &harness{t: t, k: k, a: a}
	h.connect(21)
	h.wait(0, "SUBFLOW_CREATE through the clean detour", creates(relay1))
	for _, c := range k.Commands() {
		if c.Remote == relay2 {
			t.Fatalf("subflow through the withheld detour: %v", c)
		}
	}
	found := false
	for _, d := range a.Status().Detours {
		if d.Relay == "r2" {
			found = true
			if d.Healthy || d.LastError != "mptcp-stripped: test" {
				t.Errorf("withheld detour in status: healthy %v, last error %q", d.Healthy, d.LastError)
			}
		}
	}
	if !found {
		t.Errorf("withheld detour missing from status: %+v", a.Status().Detours)
	}
}

// A metrics endpoint on a unix socket is mode 0600, and
// with a token a scrape without it gets 401.
func TestServeMetricsPrivate(t *testing.T) {
	h := start(t, policy.Static)
	path := filepath.Join(t.TempDir(), "m.sock")
	const token = "0123456789abcdef0123"
	stop, err := agent.ServeMetrics("unix:"+path, token, h.a, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("metrics socket: %v %v", fi.Mode(), err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	get := func(auth string) (int, string) {
		req, _ := http.NewRequest("GET", "http://agent/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(""); code != http.StatusUnauthorized || strings.Contains(body, "mpdetour_agent_") {
		t.Fatalf("without the token: %d %q", code, body)
	}
	if code, body := get("Bearer " + token); code != http.StatusOK || !strings.Contains(body, "mpdetour_agent_connections") {
		t.Fatalf("with the token: %d %.200q", code, body)
	}
}

// A connection doctor marked as its test is not the
// agent's: no detour, not in the status, no failed command.
func TestAgentLeavesProbesAlone(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(client.Port())), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h := run(t, agent.Options{Subflows: 1, MaxConnections: 100, CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute,
		ConnectTimeout: 3 * time.Second, Policy: policy.Static, Probes: dir}, static.New([]static.Entry{natDetour("r1", relay1)}))
	h.connect(31) // from client, whose port is marked
	other := mptcppm.Event{Token: 32, Local: netip.AddrPortFrom(client.Addr(), 40001), Remote: server}
	other.Type = mptcppm.EventEstablished
	h.k.Emit(other)
	_, i := h.wait(0, "SUBFLOW_CREATE for the unmarked connection", creates(relay1))
	for _, in := range h.k.Commands()[:i+1] {
		if in.Token == 31 {
			t.Fatalf("a command for the probe: %+v", in)
		}
	}
	for _, c := range h.a.Status().Connections {
		if c.Token == fmt.Sprintf("%08x", 31) {
			t.Fatalf("the probe is in the status: %+v", c)
		}
	}
}
