package relay

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

func testKey(t *testing.T) proto.Key {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestPolicy(t *testing.T) {
	p := &destination.Policy{
		Allow:     []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Deny:      []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		DenyPorts: map[uint16]bool{25: true},
	}
	p.SetOwn([]netip.Addr{netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("10.1.0.1")},
		[]netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.1.0.0/24")})
	ok := []string{"8.8.8.8:443", "10.1.2.3:80", "10.1.0.9:80", "203.0.114.1:80"}
	refused := []string{"8.8.8.8:25", "127.0.0.1:80", "10.2.0.1:80", "192.168.1.1:80", "172.16.0.1:80", "169.254.0.1:80",
		"224.0.0.1:80", "255.255.255.255:80", "0.0.0.0:80", "203.0.113.5:80", "203.0.113.9:80", "10.1.0.1:80",
		"198.51.100.1:80", "100.64.0.1:80", "[2001:db8::1]:80"}
	for _, s := range ok {
		if err := p.Check(netip.MustParseAddrPort(s)); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	for _, s := range refused {
		if err := p.Check(netip.MustParseAddrPort(s)); err == nil {
			t.Errorf("%s allowed", s)
		}
	}
}

func TestBucket(t *testing.T) {
	var b bucket
	now := time.Unix(1000, 0)
	for i := 0; i < 3; i++ {
		if !b.take(now, 1, 3) {
			t.Fatalf("burst request %d refused", i)
		}
	}
	if b.take(now, 1, 3) {
		t.Fatal("beyond burst accepted")
	}
	if !b.take(now.Add(1100*time.Millisecond), 1, 3) {
		t.Fatal("refill not applied")
	}
}

// Metric labels never take values from the wire beyond fixed sets.
func TestMetricLabelsBounded(t *testing.T) {
	for _, c := range []struct {
		op      string
		r       proto.Reason
		op2, r2 string
	}{
		{"grant", proto.OK, "grant", "ok"},
		{"handshake", proto.ReasonReplay, "handshake", "replay"},
		{proto.Op(77).String(), proto.ReasonQuota, "other", "quota"},
		{"transport", proto.Reason(200), "transport", "other"},
	} {
		if op, r := metricLabels(c.op, c.r); op != c.op2 || r != c.r2 {
			t.Errorf("metricLabels(%q, %d) = %q, %q; want %q, %q", c.op, c.r, op, r, c.op2, c.r2)
		}
	}
}

// Refused handshakes: the first of a window is logged, the rest summarised
// in one line per window (a flood must not flood the log).
func TestRefusalLogBounded(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var r refusalLog
	t0 := time.Unix(1000, 0)
	from := netip.MustParseAddrPort("192.0.2.1:1000")
	for i := 0; i < 5000; i++ {
		r.note(log, t0.Add(time.Duration(i)*time.Millisecond), proto.ReasonUnauthorized, from, "unknown key")
		r.flush(log, t0.Add(time.Duration(i)*time.Millisecond))
	}
	r.flush(log, t0.Add(11*time.Second))
	lines := strings.Count(buf.String(), "\n")
	if lines != 2 || !strings.Contains(buf.String(), "unauthorized=4999") {
		t.Fatalf("%d log lines for 5000 refusals:\n%s", lines, buf.String())
	}
}

// Every relay metric the dashboard shows exists (a renamed metric would
// leave an empty panel).
func TestDashboardRelayMetrics(t *testing.T) {
	m := newMetrics()
	m.requests.WithLabelValues("grant", "ok")
	m.memberBytes.WithLabelValues("x")
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fams {
		have[f.GetName()] = true
	}
	names := testenv.DashboardMetrics(t, "../../deploy/grafana-mpdetour.json", "mpdetour_relay_")
	if len(names) < 5 {
		t.Fatalf("dashboard queries only %v", names)
	}
	for n := range names {
		if !have[n] {
			t.Errorf("the dashboard queries %s, which the relay does not export (it has %v)", n, have)
		}
	}
}
