package relay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// newTestServer builds a relay the way the daemon does (New), from fakes:
// a UDP control socket on loopback, the in-memory data plane, tun (nil:
// no tunnels) and log (nil: discarded). The event loop does not run: the
// test calls the handlers.
func newTestServer(t *testing.T, static Static, set *Reloadable, tun Tunnels, log *slog.Logger) (*Server, *dataplane.Fake) {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dp := dataplane.NewFake()
	s, err := New(static, set, Deps{PacketConn: conn, DataPlane: dp, Tunnels: tun, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.attr.Close() })
	return s, dp
}

// loopRelay is a whole relay (its event loop running) on loopback with
// the fake data plane: the control protocol, sessions, leases, trust and
// the attribution log run as in the daemon, without root. Namespace tests
// keep what needs the kernel (forwarding through the mappings, the
// nftables table, kill -9 and restart of the process).
type loopRelay struct {
	s       *Server
	dp      *dataplane.Fake
	k       keys
	logs    *syncBuffer
	dir     string // the attribution log is dir/attribution.jsonl
	attrLog string
}

// startLoopRelay runs a relay configured as writeConfig's (member alice,
// destinations 10.0.2.0/24 allowed, the file's defaults), changed by tune
// (nil: none), on 127.0.0.1.
func startLoopRelay(t *testing.T, tune func(*Reloadable)) *loopRelay {
	t.Helper()
	l := &loopRelay{k: newKeys(t), logs: &syncBuffer{}, dir: t.TempDir()}
	l.attrLog = filepath.Join(l.dir, "attribution.jsonl")
	set := &Reloadable{PrivateKey: l.k.relay, PortLo: 40000, PortHi: 40999, Lease: 2 * time.Minute,
		Members: map[proto.Key]string{l.k.member.Public(): "alice"}, Allow: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")},
		DenyPorts: map[uint16]bool{25: true}, QuotaPerMember: 256, QuotaGlobal: 100000, Rate: 50, Burst: 100,
		AttributionLog: l.attrLog, AttributionFlush: time.Minute, Fair: FairConfig{ReceiptEvery: 10 * time.Minute}}
	if tune != nil {
		tune(set)
	}
	static := Static{Listen: netip.MustParseAddrPort("127.0.0.1:0")}
	log := slog.New(slog.NewTextHandler(l.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l.s, l.dp = newTestServer(t, static, set, nil, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if t.Failed() {
			t.Logf("relay log:\n%s", l.logs.String())
		}
	})
	return l
}

// dial opens a control session with priv (and a certificate).
func (l *loopRelay) dial(t *testing.T, priv proto.Key, cert []byte) *relayconn.Conn {
	t.Helper()
	c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: l.s.Addr(), PublicKey: l.k.relay.Public()}, priv,
		relayconn.Options{Certificate: cert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// status is the relay's status snapshot.
func (l *loopRelay) status(t *testing.T) *Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := l.s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
