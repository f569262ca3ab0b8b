package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/convert"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

func TestTicketStore(t *testing.T) {
	ts := newTicketStore()
	k1, _ := proto.GenerateKey()
	now := time.Unix(1000, 0)
	client := netip.MustParseAddr("192.0.2.1")
	tk, err := ts.issue(k1, "alice", client, 3, now.Add(time.Minute), now)
	if err != nil || len(tk) != 3 {
		t.Fatalf("issue: %v %v", tk, err)
	}
	from := netip.AddrPortFrom(client, 40000)
	// From another address: refused and not consumed.
	if _, _, err := ts.take(tk[0][:], netip.MustParseAddrPort("192.0.2.9:40000"), now); err == nil {
		t.Fatal("ticket accepted from another address")
	}
	if m, k, err := ts.take(tk[0][:], from, now); err != nil || m != "alice" || k != k1 {
		t.Fatalf("genuine use: %q %v %v", m, k.ID(), err)
	}
	if _, _, err := ts.take(tk[0][:], from, now); err == nil {
		t.Fatal("ticket used twice")
	}
	if _, _, err := ts.take(tk[1][:], from, now.Add(2*time.Minute)); err == nil {
		t.Fatal("expired ticket accepted")
	}
	if _, _, err := ts.take([]byte("short"), from, now); err == nil {
		t.Fatal("malformed ticket accepted")
	}
	// The per-member bound counts outstanding tickets only (tk[1] has
	// expired, tk[2] is held): a request beyond it gets what is left, then
	// a quota refusal.
	if got, err := ts.issue(k1, "alice", client, maxTicketsPerMember, now.Add(time.Minute), now); err != nil || len(got) != maxTicketsPerMember-1 {
		t.Fatalf("over the per-member bound: %d tickets, %v; want the %d left", len(got), err, maxTicketsPerMember-1)
	}
	if _, err := ts.issue(k1, "alice", client, 1, now.Add(time.Minute), now); proto.ReasonOf(err) != proto.ReasonQuota {
		t.Fatalf("at the per-member bound: %v, want quota", err)
	}
	// Another member has its own bound.
	k2, _ := proto.GenerateKey()
	if got, err := ts.issue(k2, "bob", client, proto.MaxTickets, now.Add(time.Minute), now); err != nil || len(got) != proto.MaxTickets {
		t.Fatalf("another member: %d tickets, %v", len(got), err)
	}
	ts.revoke(func(proto.Key) bool { return false })
	if _, _, err := ts.take(tk[2][:], from, now); err == nil {
		t.Fatal("ticket of a removed member accepted")
	}
}

// The convert role end to end: a member gets tickets over the control
// protocol, an MPTCP connection to the converter reaches a plain TCP echo
// server, bytes are attributed; a used ticket is refused with EACCES
// before anything reaches the server.
func TestConverterRole(t *testing.T) {
	testenv.MPTCP(t)
	f, _, cfgPath, p, c := relayLine(t, fmt.Sprintf("convert: {enabled: true, listen: '%s:%d'}\n", fxRelay, DefaultConvertPort))
	for _, ns := range []string{f.Relay, f.Client} {
		in(t, ns, func() {
			if err := os.WriteFile("/proc/sys/net/ipv4/tcp_fastopen", []byte("3"), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conv, tickets, lease, err := c.Convert(ctx, 3)
	if err != nil {
		t.Fatalf("convert tickets: %v\n%s", err, p.stderr.String())
	}
	if conv != netip.MustParseAddrPort(fmt.Sprintf("%s:%d", fxRelay, DefaultConvertPort)) || len(tickets) != 3 || lease <= 0 {
		t.Fatalf("convert reply %v %d tickets lease %v", conv, len(tickets), lease)
	}
	server := netip.MustParseAddrPort(fxServer + ":5201")
	dial := func(ticket []byte) (net.Conn, error) {
		var conn net.Conn
		var err error
		in(t, f.Client, func() {
			conn, err = convert.Dial(ctx, conv, server, ticket, convert.DialOptions{Timeout: 5 * time.Second})
		})
		return conn, err
	}
	for i := 0; i < 2; i++ { // the second one may carry its message in the SYN (TFO)
		conn, err := dial(tickets[i][:])
		if err != nil {
			t.Fatalf("conversion %d: %v\n%s", i, err, p.stderr.String())
		}
		if tc, ok := conn.(*net.TCPConn); !ok {
			t.Fatalf("Dial returned %T, want *net.TCPConn (splice)", conn)
		} else if mp, err := tc.MultipathTCP(); err != nil || !mp {
			t.Fatalf("the connection to the converter is not MPTCP: %v %v", mp, err)
		}
		if err := echo(conn, 60000); err != nil {
			t.Fatalf("echo through the converter: %v", err)
		}
		conn.Close()
	}
	if _, err := dial(tickets[0][:]); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("reused ticket: %v, want EACCES", err)
	}
	waitFor(t, "convert lines in the attribution log", func() bool {
		n := 0
		for _, ev := range readAttribution(t, filepath.Join(filepath.Dir(cfgPath), "attribution.jsonl")) {
			if ev.Event == "convert" && ev.Member == "alice" && ev.Server == server.String() && ev.Result == "ok" &&
				ev.BytesUp != nil && *ev.BytesUp == 60000 && ev.BytesDown != nil && *ev.BytesDown == 60000 {
				n++
			}
		}
		return n == 2
	})
	var st *Status
	in(t, f.Relay, func() { st, err = QueryStatus(5 * time.Second) })
	if err != nil || st.Converter == nil || st.Converter.Tickets != 1 {
		t.Fatalf("relay status converter: %+v %v, want 1 ticket outstanding", st, err)
	}
	if !strings.Contains(p.stderr.String(), "converter listening") {
		t.Fatalf("no start line:\n%s", p.stderr.String())
	}
	// Batches of proto.MaxTickets over the control protocol (a reply
	// larger than proto.MaxMessageLen), the last one cut to the member's
	// 64 outstanding tickets, then refused.
	got := 1
	for got < maxTicketsPerMember {
		_, ts, _, err := c.Convert(ctx, proto.MaxTickets)
		if err != nil || len(ts) != min(proto.MaxTickets, maxTicketsPerMember-got) {
			t.Fatalf("batch after %d outstanding: %d tickets, %v", got, len(ts), err)
		}
		got += len(ts)
	}
	if _, _, _, err := c.Convert(ctx, 1); proto.ReasonOf(err) != proto.ReasonQuota {
		t.Fatalf("beyond %d outstanding: %v, want quota", maxTicketsPerMember, err)
	}
}
