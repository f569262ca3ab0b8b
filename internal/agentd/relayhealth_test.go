package agentd

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// fakeRelay answers pings with err (nil: pong).
type fakeRelay struct {
	mu    sync.Mutex
	err   error
	pings int
}

func (f *fakeRelay) Do(ctx context.Context, req proto.Request) (proto.Reply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pings++
	return proto.Reply{Op: req.Op}, f.err
}

func (f *fakeRelay) set(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func refusal(r proto.Reason) error {
	return fmt.Errorf("relay %q: %w", "r1", &proto.Error{Op: proto.OpGrant, Reason: r})
}
func noAnswer() error {
	return fmt.Errorf("relay %q: no handshake response: %w", "r1", context.DeadlineExceeded)
}
func warns(b *bytes.Buffer) int { return strings.Count(b.String(), "level=WARN") }
func stateOf(h *RelayHealth, name string) agent.RelayStatus {
	for _, r := range h.Status() {
		if r.Name == name {
			return r
		}
	}
	return agent.RelayStatus{}
}

// Every relay state the client can tell, from the
// outcomes of its requests and pings against a fake relay and a fake
// clock; one WARN per change to a bad state.
func TestRelayHealthTransitions(t *testing.T) {
	var logs bytes.Buffer
	ck := &fakeClock{t: time.Unix(100000, 0)}
	h := NewRelayHealth(RelayHealthConfig{Now: ck.now}, slog.New(slog.NewTextHandler(&logs, nil)), "r1")
	f := &fakeRelay{err: noAnswer()}
	h.SetPinger("r1", f)
	ctx := context.Background()
	srv := netip.MustParseAddrPort("198.51.100.7:443")

	if st := stateOf(h, "r1"); st.State != agent.RelayUnknown {
		t.Fatalf("before any answer: %+v", st)
	}
	// An unreachable relay: the first check pings it.
	h.check(ctx)
	st := stateOf(h, "r1")
	if st.State != agent.RelayNoAnswer || !strings.Contains(st.Detail, "UDP port") || !st.LastSuccess.IsZero() || st.LastError == "" {
		t.Fatalf("no answer: %+v", st)
	}
	if warns(&logs) != 1 {
		t.Fatalf("%d WARN lines for an unreachable relay, want 1:\n%s", warns(&logs), logs.String())
	}
	// Not pinged again before the interval; no second WARN after it.
	h.check(ctx)
	ck.add(30 * time.Second)
	h.check(ctx)
	if f.pings != 2 || warns(&logs) != 1 {
		t.Fatalf("pings %d (want 2), WARN lines %d (want 1)", f.pings, warns(&logs))
	}
	// It answers: ok, with the time of the success.
	f.set(nil)
	ck.add(30 * time.Second)
	h.check(ctx)
	if st := stateOf(h, "r1"); st.State != agent.RelayOK || st.LastSuccess != ck.t || st.Since != ck.t {
		t.Fatalf("answering: %+v", st)
	}
	if !strings.Contains(logs.String(), "relay answers again") {
		t.Fatalf("no line for the recovery:\n%s", logs.String())
	}
	// A relay that hears from the agent anyway is not pinged.
	ck.add(20 * time.Second)
	h.Observe("r1", "grant", srv, nil)
	ck.add(20 * time.Second)
	h.check(ctx)
	if f.pings != 3 {
		t.Fatalf("pinged %d times, want 3 (a grant 20 s ago is an answer)", f.pings)
	}
	// Policy: the destination is named, once; a grant toward it clears it.
	other := netip.MustParseAddrPort("10.0.0.7:443")
	h.Observe("r1", "grant", other, refusal(proto.ReasonPolicyDenied))
	h.Observe("r1", "grant", other, refusal(proto.ReasonPolicyDenied))
	st = stateOf(h, "r1")
	if st.State != agent.RelayPolicyDenied || !strings.Contains(st.Detail, "10.0.0.7:443") || !strings.Contains(st.Detail, "allow_destinations") {
		t.Fatalf("policy-denied: %+v", st)
	}
	if n := strings.Count(logs.String(), "refuses a destination by its policy"); n != 1 {
		t.Fatalf("%d lines for one refused destination, want 1", n)
	}
	ck.add(6 * time.Minute) // forgotten after DeniedFor
	if st := stateOf(h, "r1"); st.State != agent.RelayOK {
		t.Fatalf("after the refusal aged out: %+v", st)
	}
	// Refused after being accepted: revoked.
	before := warns(&logs)
	h.Observe("r1", "renew", srv, refusal(proto.ReasonUnauthorized))
	if st := stateOf(h, "r1"); st.State != agent.RelayRevoked || !strings.Contains(st.Detail, "revoked") || !strings.Contains(st.LastError, "unauthorized") {
		t.Fatalf("revoked: %+v", st)
	}
	if warns(&logs) != before+1 {
		t.Fatalf("no WARN for the revocation:\n%s", logs.String())
	}
	// Other refusals.
	h.Observe("r1", "grant", srv, refusal(proto.ReasonQuota))
	if st := stateOf(h, "r1"); st.State != agent.RelayRefused || st.Detail != "quota" {
		t.Fatalf("quota: %+v", st)
	}

	// Never accepted: unauthorized (a wrong key), not revoked.
	h2 := NewRelayHealth(RelayHealthConfig{Now: ck.now}, nil, "r2")
	h2.Observe("r2", "grant", srv, fmt.Errorf("relay %q: no session: %w", "r2", &proto.Error{Reason: proto.ReasonUnauthorized}))
	if st := stateOf(h2, "r2"); st.State != agent.RelayUnauthorized || !strings.Contains(st.Detail, "members") {
		t.Fatalf("unauthorized: %+v", st)
	}
}

// A tunnel detour whose WireGuard has no handshake is not "ok" (a
// closed UDP 51820 used to show HEALTH ok).
func TestRelayHealthTunnelHandshake(t *testing.T) {
	ck := &fakeClock{t: time.Unix(100000, 0)}
	h := NewRelayHealth(RelayHealthConfig{Now: ck.now}, nil, "r1")
	var last time.Time
	up := false
	h.SetTunnel("r1", func() (time.Time, bool, error) { return last, up, nil })
	h.Observe("r1", "grant", netip.AddrPort{}, nil)
	ctx := context.Background()
	h.check(ctx)
	if st := stateOf(h, "r1"); st.State != agent.RelayOK || !st.Tunnel {
		t.Fatalf("tunnel not up yet: %+v", st)
	}
	up = true
	h.check(ctx)
	ck.add(2 * time.Minute)
	h.check(ctx)
	if st := stateOf(h, "r1"); st.State != agent.RelayOK {
		t.Fatalf("within the first handshake's grace: %+v", st)
	}
	ck.add(2 * time.Minute)
	h.check(ctx)
	st := stateOf(h, "r1")
	if st.State != agent.RelayNoHandshake || !strings.Contains(st.Detail, "latest handshake never") || !strings.Contains(st.Detail, "51820") {
		t.Fatalf("no handshake: %+v", st)
	}
	last = ck.t.Add(-time.Second)
	h.check(ctx)
	if st := stateOf(h, "r1"); st.State != agent.RelayOK || st.LastHandshake != last {
		t.Fatalf("after a handshake: %+v", st)
	}
	ck.add(4 * time.Minute)
	h.check(ctx)
	if st := stateOf(h, "r1"); st.State != agent.RelayNoHandshake || !strings.Contains(st.Detail, "4m1s ago") {
		t.Fatalf("stale handshake: %+v", st)
	}
}

// Detours of a relay in trouble are not shown healthy.
