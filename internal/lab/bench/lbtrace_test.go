package bench

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
)

func TestLBDiagnose(t *testing.T) {
	ap := netip.MustParseAddrPort
	ev := func(at time.Duration, e mptcppm.Event) lbEvent { return lbEvent{at: at, e: e} }
	client := &lbTrace{recs: []lbEvent{
		// 41000: announced and joined both before the first change (4 s).
		ev(100*time.Millisecond, mptcppm.Event{Type: mptcppm.EventCreated, Token: 1, Local: ap("10.0.1.1:41000"), Remote: ap("10.0.100.1:5201")}),
		ev(200*time.Millisecond, mptcppm.Event{Type: mptcppm.EventEstablished, Token: 1, Local: ap("10.0.1.1:41000"), Remote: ap("10.0.100.1:5201")}),
		ev(time.Second, mptcppm.Event{Type: mptcppm.EventAnnounced, Token: 1, Remote: ap("10.0.31.2:5201"), RemoteID: 1}),
		ev(1100*time.Millisecond, mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: ap("10.0.1.1:42000"), Remote: ap("10.0.31.2:5201")}),
		ev(1200*time.Millisecond, mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: ap("10.0.1.1:42001"), Remote: ap("10.0.4.2:6001")}),
		ev(4100*time.Millisecond, mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 1, Local: ap("10.0.1.1:41000"), Remote: ap("10.0.100.1:5201"), Error: 104}),
		// 41001: nothing announced, reset at the first change.
		ev(150*time.Millisecond, mptcppm.Event{Type: mptcppm.EventCreated, Token: 2, Local: ap("10.0.1.1:41001"), Remote: ap("10.0.100.1:5201")}),
		ev(4200*time.Millisecond, mptcppm.Event{Type: mptcppm.EventClosed, Token: 2}),
		// 41002: joined late (after the change), not broken.
		ev(160*time.Millisecond, mptcppm.Event{Type: mptcppm.EventCreated, Token: 3, Local: ap("10.0.1.1:41002"), Remote: ap("10.0.100.1:5201")}),
		ev(5*time.Second, mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 3, Local: ap("10.0.1.1:42002"), Remote: ap("10.0.31.2:5201")}),
	}}
	backend := &lbTrace{recs: []lbEvent{
		// Server side: the client's port is the remote port (masquerade keeps it).
		ev(210*time.Millisecond, mptcppm.Event{Type: mptcppm.EventEstablished, Token: 9, ServerSide: 1, Local: ap("10.0.31.2:5201"), Remote: ap("10.0.21.1:41000")}),
		ev(160*time.Millisecond, mptcppm.Event{Type: mptcppm.EventCreated, Token: 8, ServerSide: 1, Local: ap("10.0.31.2:5201"), Remote: ap("10.0.21.1:41001")}),
	}}
	errs := []error{
		errors.New("reading the receiver's summary: read tcp 10.0.1.1:41000->10.0.100.1:5201: i/o timeout"),
		errors.New("write: write tcp 10.0.1.1:41001->10.0.100.1:5201: connection reset by peer"),
		nil,
		errors.New("receiver closed without a summary"),
	}
	detail, short := lbDiagnose(client, []*lbTrace{backend}, errs, 4*time.Second, 2,
		[]string{`time=... level=WARN msg="client failed" client=10.0.21.1:41000 err="writing summary: broken pipe"`})
	if short != 2 {
		t.Errorf("short of joins = %d, want 2 (41001 none, 41002 only after the change)", short)
	}
	if len(detail) != 3 {
		t.Fatalf("detail %q, want 3 lines", detail)
	}
	want := []string{
		"port 41000 token 00000001: 2 joins before the first route change; client: ESTABLISHED at 0.20; server: token 00000009 ESTABLISHED at 0.21",
		"port 41001 token 00000002: 0 joins before the first route change; client: no ESTABLISHED; server: token 00000008 no ESTABLISHED",
		"? (no port in error)",
	}
	for _, w := range want {
		found := false
		for _, d := range detail {
			found = found || strings.HasPrefix(d, w)
		}
		if !found {
			t.Errorf("no line starting %q in\n%s", w, strings.Join(detail, "\n"))
		}
	}
	if !strings.Contains(strings.Join(detail, "\n"), `client=10.0.21.1:41000 err="writing summary: broken pipe"`) {
		t.Errorf("the receiver's line for port 41000 is missing:\n%s", strings.Join(detail, "\n"))
	}
	if !strings.Contains(strings.Join(detail, "\n"), "-10.0.1.1>10.0.100.1:5201 err 104 at 4.10") {
		t.Errorf("the reset of the balanced subflow is missing:\n%s", strings.Join(detail, "\n"))
	}
}
