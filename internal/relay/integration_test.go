package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

type relayProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error
}

// syncBuffer collects the relay's log while tests read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startRelay runs the relay (this test binary, see TestMain) in ns and waits
// for its table.
func startRelay(t testing.TB, ns, cfgPath string) *relayProc {
	t.Helper()
	return startRelayBin(t, ns, cfgPath, os.Args[0])
}

// startRelayBin is startRelay with the relay run by bin, a test binary of
// this package (of another build, for before/after comparisons).
func startRelayBin(t testing.TB, ns, cfgPath, bin string) *relayProc {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "MPDETOUR_TEST_RELAY_CONFIG="+cfgPath)
	p := &relayProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("relay log:\n%s", p.stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := nftList(t, ns, "list", "table", "ip", TableName); err == nil {
			// The table exists before the socket is bound: give it a moment.
			time.Sleep(100 * time.Millisecond)
			return p
		}
		select {
		case err := <-p.done:
			t.Fatalf("relay exited: %v\n%s", err, p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("relay did not come up:\n%s", p.stderr.String())
	return nil
}

func (p *relayProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	// ip netns exec execs the binary, so the pid is the relay's.
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func (p *relayProc) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("relay did not exit")
	}
	return nil
}

type keys struct{ relay, member, stranger proto.Key }

func newKeys(t testing.TB) keys {
	var k keys
	for _, p := range []*proto.Key{&k.relay, &k.member, &k.stranger} {
		var err error
		if *p, err = proto.GenerateKey(); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

func writeConfig(t testing.TB, path string, k keys, extra string) {
	t.Helper()
	allow := "allow_destinations: [10.0.2.0/24]\n"
	if strings.Contains(extra, "allow_destinations:") {
		allow = "" // extra has its own
	}
	cfg := fmt.Sprintf(`listen: %s:%d
private_key: %s
ports: 40000-40999
members:
  - name: alice
    public_key: %s
%sattribution_log: %s
%s`, fxRelay, DefaultPort, k.relay, k.member.Public(), allow, filepath.Join(filepath.Dir(path), "attribution.jsonl"), extra)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

func relayAddr() netip.AddrPort {
	return netip.MustParseAddrPort(fmt.Sprintf("%s:%d", fxRelay, DefaultPort))
}

// udpIn creates a UDP socket inside ns, bound to bind (may be "").
func udpIn(t testing.TB, ns, bind string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	var err error
	in(t, ns, func() {
		var la *net.UDPAddr
		if bind != "" {
			la = net.UDPAddrFromAddrPort(netip.MustParseAddrPort(bind))
		}
		c, err = net.ListenUDP("udp4", la)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dialRelay(t *testing.T, ns string, k keys, priv proto.Key) *relayconn.Conn {
	t.Helper()
	c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: relayAddr(), PublicKey: k.relay.Public()}, priv,
		relayconn.Options{ListenPacket: func() (net.PacketConn, error) { return udpIn(t, ns, ""), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// elements counts the mappings in the relay's IPv4 DNAT map.
func elements(t testing.TB, ns string) int {
	t.Helper()
	return elementsOf(t, ns, "ip")
}

// elementsOf counts the mappings in the DNAT map of family fam (ip, ip6).
func elementsOf(t testing.TB, ns, fam string) int {
	t.Helper()
	out, err := nftList(t, ns, "-j", "list", "map", fam, TableName, dataplane.DNATMapName)
	if err != nil {
		t.Fatalf("nft list map: %v\n%s", err, out)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("nft json: %v\n%s", err, out)
	}
	for _, o := range doc.Nftables {
		if m, ok := o["map"]; ok {
			var mm struct {
				Elem []json.RawMessage `json:"elem"`
			}
			_ = json.Unmarshal(m, &mm)
			return len(mm.Elem)
		}
	}
	t.Fatalf("no map in nft output:\n%s", out)
	return 0
}

// rawSession performs a handshake by hand from sock, for tests that forge
// and replay packets.
func rawSession(t *testing.T, sock *net.UDPConn, k keys, priv proto.Key) (*proto.Session, []byte) {
	t.Helper()
	s, pkt, err := rawSessionErr(sock, k, priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, pkt
}

func rawSessionErr(sock *net.UDPConn, k keys, priv proto.Key) (*proto.Session, []byte, error) {
	in, err := proto.NewInitiation(priv, k.relay.Public(), 77, time.Now())
	if err != nil {
		return nil, nil, err
	}
	if _, err := sock.WriteToUDPAddrPort(in.Packet, relayAddr()); err != nil {
		return nil, nil, err
	}
	buf := make([]byte, 2048)
	_ = sock.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _, err := sock.ReadFromUDPAddrPort(buf)
	if err != nil {
		return nil, nil, fmt.Errorf("no answer from relay: %w", err)
	}
	r, err := proto.ParseResponse(buf[:n])
	if err != nil {
		return nil, nil, fmt.Errorf("handshake: %v (% x)", err, buf[:n])
	}
	s, err := in.Finish(r)
	return s, in.Packet, err
}

func exchange(t *testing.T, sock *net.UDPConn, pkt []byte) []byte {
	t.Helper()
	return exchangeFrom(t, sock, sock, pkt)
}

// exchangeFrom sends from one socket and reads the answer on another.
func exchangeFrom(t *testing.T, send, recv *net.UDPConn, pkt []byte) []byte {
	t.Helper()
	if _, err := send.WriteToUDPAddrPort(pkt, relayAddr()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	_ = recv.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _, err := recv.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer from relay: %v", err)
	}
	return buf[:n]
}

func errorReason(t *testing.T, b []byte) proto.Reason {
	t.Helper()
	e, err := proto.ParseError(b)
	if err != nil {
		t.Fatalf("want a cleartext refusal, got % x (%v)", b, err)
	}
	return e.Reason
}

func readAttribution(t *testing.T, path string) []attrEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var evs []attrEvent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev attrEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("attribution line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// eventually polls cond for up to 5 s and says whether it came true: for
// what a test checks after waiting for something else (a relay's stderr
// reaches the test through a pipe, behind the kernel state it changed).
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(8 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRelayIntegration(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	k := newKeys(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "relay.yaml")
	attrPath := filepath.Join(dir, "attribution.jsonl")
	const metricsAddr = "127.0.0.1:9464"
	writeConfig(t, cfgPath, k, "quota: {per_member: 3}\nlegacy_v1: {enabled: true, per_client: 1}\nmetrics: {listen: '"+metricsAddr+"'}\n")
	startSink(t, f.Server, fxServer+":5201")
	for _, p := range []string{"5202", "5203", "5204"} {
		startSink(t, f.Server, fxServer+":"+p)
	}
	p := startRelay(t, f.Relay, cfgPath)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := netip.MustParseAddrPort(fxServer + ":5201")

	c := dialRelay(t, f.Client, k, k.member)
	d, lease, err := c.Grant(ctx, server, 40500)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	if d != netip.MustParseAddrPort(fxRelay+":40500") || lease <= 0 {
		t.Fatalf("grant = %v lease %v, want the proposed port on %s", d, lease, fxRelay)
	}
	if n := elements(t, f.Relay); n != 1 {
		t.Fatalf("%d elements after one grant", n)
	}
	t.Run("tcp through the detour", func(t *testing.T) {
		conn, err := dialFrom(t, f.Client, d.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := echo(conn, 50000); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("repeated grant is idempotent", func(t *testing.T) {
		d2, _, err := c.Grant(ctx, server, 0)
		if err != nil || d2 != d {
			t.Fatalf("second grant = %v, %v; want %v", d2, err, d)
		}
		if n := elements(t, f.Relay); n != 1 {
			t.Fatalf("%d elements", n)
		}
	})
	t.Run("never on a listening port", func(t *testing.T) {
		var ln net.Listener
		var err error
		in(t, f.Relay, func() { ln, err = net.Listen("tcp4", "0.0.0.0:40700") })
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		time.Sleep(1100 * time.Millisecond) // the relay caches its listeners for 1 s
		srv := netip.MustParseAddrPort(fxServer + ":5202")
		d2, _, err := c.Grant(ctx, srv, 40700)
		if err != nil {
			t.Fatal(err)
		}
		if d2.Port() == 40700 {
			t.Fatal("granted the port the relay listens on")
		}
		if err := c.Release(ctx, d2.Port()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		u := dialRelay(t, f.Client, k, k.stranger)
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		defer scancel()
		_, _, err := u.Grant(sctx, netip.MustParseAddrPort(fxServer+":5202"), 0)
		if r := proto.ReasonOf(err); r != proto.ReasonUnauthorized {
			t.Fatalf("unknown key: reason %v (%v), want unauthorized", r, err)
		}
		if n := elements(t, f.Relay); n != 1 {
			t.Fatalf("%d elements", n)
		}
	})
	t.Run("denied destinations", func(t *testing.T) {
		for _, dst := range []string{"127.0.0.1:80", "192.168.1.1:80", "169.254.1.1:80", "224.0.0.1:80", fxRelayServer + ":80", fxServer + ":25", "10.9.9.9:80"} {
			_, _, err := c.Grant(ctx, netip.MustParseAddrPort(dst), 0)
			if r := proto.ReasonOf(err); r != proto.ReasonPolicyDenied {
				t.Errorf("%s: reason %v (%v), want policy-denied", dst, r, err)
			}
		}
		if n := elements(t, f.Relay); n != 1 {
			t.Fatalf("%d elements", n)
		}
	})
	t.Run("quota", func(t *testing.T) {
		for _, port := range []string{"5202", "5203"} {
			if _, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":"+port), 0); err != nil {
				t.Fatalf("grant within quota: %v", err)
			}
		}
		_, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5204"), 0)
		if r := proto.ReasonOf(err); r != proto.ReasonQuota {
			t.Fatalf("over quota: reason %v (%v)", r, err)
		}
		if n := elements(t, f.Relay); n != 3 {
			t.Fatalf("%d elements, want 3", n)
		}
	})
	t.Run("replays", func(t *testing.T) {
		sock := udpIn(t, f.Client, "")
		s, initPkt := rawSession(t, sock, k, k.member)
		if r := errorReason(t, exchange(t, sock, initPkt)); r != proto.ReasonReplay {
			t.Fatalf("replayed initiation: %v", r)
		}
		req, _ := proto.MarshalRequest(proto.NewRequest(1, &proto.ReleaseRequest{Port: d.Port()}))
		pkt, _ := s.Seal(req)
		tp, _ := proto.ParseTransport(exchange(t, sock, pkt))
		msg, err := s.Open(tp)
		if err != nil {
			t.Fatal(err)
		}
		if rep, _ := proto.ParseReply(msg); rep.Reason != proto.ReasonNotFound {
			// Another session's member may release (same key and client
			// address own the mapping), so this is found. Re-grant.
			if rep.Reason != proto.OK {
				t.Fatalf("release: %v", rep.Reason)
			}
		}
		if r := errorReason(t, exchange(t, sock, pkt)); r != proto.ReasonReplay {
			t.Fatalf("replayed request: %v", r)
		}
		if n := elements(t, f.Relay); n != 2 {
			t.Fatalf("%d elements after one release and a replayed release, want 2", n)
		}
		// The released port stays reserved until its counter is read, so
		// the new grant may get another one.
		if d, _, err = c.Grant(ctx, server, d.Port()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("spoofed source", func(t *testing.T) {
		netnstest.MustRun(t, "ip", "-n", f.Client, "addr", "add", "10.0.1.3/24", "dev", "c0")
		real := udpIn(t, f.Client, fxClient+":0")
		spoof := udpIn(t, f.Client, "10.0.1.3:0")
		s, _ := rawSession(t, real, k, k.member)
		req, _ := proto.MarshalRequest(proto.NewRequest(2, &proto.ReleaseRequest{Port: d.Port()}))
		pkt, _ := s.Seal(req)
		if r := errorReason(t, exchangeFrom(t, spoof, spoof, pkt)); r != proto.ReasonAddressChanged {
			t.Fatalf("request from another address: %v", r)
		}
		// The genuine packet still works afterwards (its counter was not burnt).
		tp, _ := proto.ParseTransport(exchange(t, real, pkt))
		if msg, err := s.Open(tp); err != nil {
			t.Fatal(err)
		} else if rep, _ := proto.ParseReply(msg); rep.Reason != proto.OK {
			t.Fatalf("genuine release: %v", rep.Reason)
		}
		// An initiation from an address that never confirms gets no mapping.
		in, _ := proto.NewInitiation(k.member, k.relay.Public(), 5, time.Now())
		if _, err := spoof.WriteToUDPAddrPort(in.Packet, relayAddr()); err != nil {
			t.Fatal(err)
		}
		if n := elements(t, f.Relay); n != 2 {
			t.Fatalf("%d elements, want 2", n)
		}
		// The released port stays reserved until its counter is read, so
		// the new grant may get another one.
		if d, _, err = c.Grant(ctx, server, d.Port()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("legacy v1", func(t *testing.T) {
		sock := udpIn(t, f.Client, "")
		// The original clients expect the port they proposed back: 51234
		// is outside this relay's range (40000-40999) and still echoed.
		req, _ := proto.MarshalLegacy(proto.LegacyMsg{Server: netip.MustParseAddrPort(fxServer + ":5202"), Port: 51234})
		if _, err := sock.WriteToUDPAddrPort(req, netip.MustParseAddrPort(fmt.Sprintf("%s:%d", fxRelay, proto.LegacyPort))); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		_ = sock.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, _, err := sock.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := proto.ParseLegacy(buf[:n])
		if err != nil || !rep.Response || rep.Port != 51234 {
			t.Fatalf("v1 response %+v %v", rep, err)
		}
		conn, err := dialFrom(t, f.Client, fmt.Sprintf("%s:%d", fxRelay, rep.Port))
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(conn, 1000); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	})
	t.Run("release and attribution", func(t *testing.T) {
		conn, err := dialFrom(t, f.Client, d.String())
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(conn, 60000); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if err := c.Release(ctx, d.Port()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "release line with bytes", func() bool {
			for _, ev := range readAttribution(t, attrPath) {
				if ev.Event == "release" && ev.DetourPort == d.Port() && ev.Bytes != nil && *ev.Bytes >= 100000 && ev.Member == "alice" && ev.KeyID == k.member.Public().ID() && ev.Client == fxClient {
					return true
				}
			}
			return false
		})
	})
	t.Run("sighup keeps mappings", func(t *testing.T) {
		before := elements(t, f.Relay)
		writeConfig(t, cfgPath, k, "quota: {per_member: 10}\nlegacy_v1: {enabled: true, per_client: 1}\n")
		p.signal(t, syscall.SIGHUP)
		waitFor(t, "reload", func() bool { return strings.Contains(p.stderr.String(), "configuration reloaded") })
		if n := elements(t, f.Relay); n != before {
			t.Fatalf("%d elements after reload, want %d", n, before)
		}
		if _, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5204"), 0); err != nil {
			t.Fatalf("grant under the reloaded quota: %v", err)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
				in(t, f.Relay, func() { conn, err = net.Dial(network, addr) })
				return conn, err
			},
		}}
		resp, err := hc.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text := string(body)
		want := []string{
			fmt.Sprintf("mpdetour_relay_active_mappings %d", elements(t, f.Relay)),
			`mpdetour_relay_requests_total{op="grant",result="quota"} 1`,
			`mpdetour_relay_requests_total{op="grant",result="policy-denied"} 7`,
			`mpdetour_relay_requests_total{op="handshake",result="replay"}`,
			`mpdetour_relay_requests_total{op="transport",result="address-changed"} 1`,
			"mpdetour_relay_bytes_total ",
			`mpdetour_relay_member_bytes_total{member="alice"} `, // the released mapping above
			"mpdetour_relay_grant_seconds_count ",
			"mpdetour_relay_sessions ",
			"mpdetour_relay_cookie_replies_total 0",
		}
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("metrics lack %q:\n%s", w, text)
			}
		}
	})
	t.Run("rate limit", func(t *testing.T) {
		before := elements(t, f.Relay)
		// All at once, so that even a slow host cannot refill the bucket
		// (burst 100, 50/s) in between.
		var limited, other atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < 300; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Do(ctx, proto.NewRequest(0, &proto.PingRequest{})); proto.ReasonOf(err) == proto.ReasonRateLimited {
					limited.Add(1)
				} else if err != nil {
					other.Add(1)
				}
			}()
		}
		wg.Wait()
		if limited.Load() == 0 || other.Load() != 0 {
			t.Fatalf("300 concurrent requests against a burst of 100: %d rate-limited, %d other errors", limited.Load(), other.Load())
		}
		if n := elements(t, f.Relay); n != before {
			t.Fatalf("%d elements, want %d", n, before)
		}
	})
	t.Run("sigterm removes the table", func(t *testing.T) {
		p.signal(t, syscall.SIGTERM)
		if err := p.wait(t); err != nil {
			t.Fatalf("relay exit: %v", err)
		}
		if out, err := nftList(t, f.Relay, "list", "table", "ip", TableName); err == nil {
			t.Fatalf("table left after SIGTERM:\n%s", out)
		}
		var shutdown int
		for _, ev := range readAttribution(t, attrPath) {
			if ev.Event == "shutdown" {
				shutdown++
			}
		}
		if shutdown == 0 {
			t.Fatal("no shutdown lines in the attribution log")
		}
	})
}

// kill -9 leaves the table; the next start replaces it. Leases expire.
func TestRelayCrashAndExpiry(t *testing.T) {
	f, _, cfgPath, p, c := relayLine(t, "lease: 2s\nattribution_flush: 1s\n")
	dir := filepath.Dir(cfgPath)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := netip.MustParseAddrPort(fxServer + ":5201")
	d0, _, err := c.Grant(ctx, server, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Bytes through a mapping reach the attribution log within one
	// attribution_flush, before any release: a kill -9 loses at most that.
	conn0, err := dialFrom(t, f.Client, d0.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(conn0, 50000); err != nil {
		t.Fatal(err)
	}
	conn0.Close()
	waitFor(t, "usage line before the kill", func() bool {
		for _, ev := range readAttribution(t, filepath.Join(dir, "attribution.jsonl")) {
			if ev.Event == "usage" && ev.DetourPort == d0.Port() && ev.Bytes != nil && *ev.Bytes >= 100000 {
				return true
			}
		}
		return false
	})
	p.signal(t, syscall.SIGKILL)
	_ = p.wait(t)
	if n := elements(t, f.Relay); n != 1 {
		t.Fatalf("expected the killed relay's element to remain, got %d", n)
	}
	startRelay(t, f.Relay, cfgPath)
	if n := elements(t, f.Relay); n != 0 {
		t.Fatalf("restart left %d stale elements", n)
	}

	// The client's session died with the relay: it hand shakes again.
	d, _, err := c.Grant(ctx, server, 0)
	if err != nil {
		t.Fatalf("grant after restart: %v", err)
	}
	conn, err := dialFrom(t, f.Client, d.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, "lease expiry", func() bool { return elements(t, f.Relay) == 0 })
	if err := echo(conn, 50000); err != nil {
		t.Fatalf("established connection cut by expiry: %v", err)
	}
	if c2, err := dialFrom(t, f.Client, d.String()); err == nil {
		c2.Close()
		t.Fatal("new connection after expiry")
	}
	waitFor(t, "expiry line", func() bool {
		for _, ev := range readAttribution(t, filepath.Join(dir, "attribution.jsonl")) {
			// Traffic of the connection that outlived its mapping counts.
			if ev.Event == "expiry" && ev.DetourPort == d.Port() && ev.Bytes != nil && *ev.Bytes >= 100000 {
				return true
			}
		}
		return false
	})
}

// The Source renews leases and serves detours without blocking.
func TestSourceRenews(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	k := newKeys(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "relay.yaml")
	writeConfig(t, cfgPath, k, "lease: 2s\n")
	// Listening on the wildcard address: the detour address in grants is
	// the address the request arrived at (IP_PKTINFO).
	b, _ := os.ReadFile(cfgPath)
	_ = os.WriteFile(cfgPath, []byte(strings.Replace(string(b), "listen: "+fxRelay+":", "listen: 0.0.0.0:", 1)), 0o600)
	startSink(t, f.Server, fxServer+":5201")
	p := startRelay(t, f.Relay, cfgPath)
	src, err := relayclient.NewSource(relayclient.SourceConfig{
		PrivateKey: k.member,
		Relays:     []relayconn.Relay{{Name: "r1", Addr: relayAddr(), PublicKey: k.relay.Public()}},
		// Rekeying every second: renewals keep working across session changes.
		Options: relayconn.Options{ListenPacket: func() (net.PacketConn, error) { return udpIn(t, f.Client, ""), nil }, RekeyAfter: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	server := netip.MustParseAddrPort(fxServer + ":5201")
	if ds := src.Detours(server); len(ds) != 0 {
		t.Fatalf("detours before Prepare: %v", ds)
	}
	// That Prepare does not wait for the relay is checked against a silent
	// relay (relayclient TestSourcePrepareDoesNotBlockOnSilentRelay); here
	// the relay answers within milliseconds, so a time bound could not
	// tell blocking from not blocking.
	src.Prepare(server)
	waitFor(t, "detour", func() bool { return len(src.Detours(server)) == 1 })
	d := src.Detours(server)[0]
	if d.Relay != "r1" || d.Remote.Addr() != netip.MustParseAddr(fxRelay) {
		t.Fatalf("detour %v", d)
	}
	// Three lease lengths later the mapping is still there: renewed.
	time.Sleep(6 * time.Second)
	if ds := src.Detours(server); len(ds) != 1 || ds[0].Remote != d.Remote {
		t.Fatalf("detours after 3 leases: %v", ds)
	}
	if n := strings.Count(p.stderr.String(), "session established"); n < 4 {
		t.Fatalf("%d handshakes in 6 s with RekeyAfter 1s", n)
	}
	conn, err := dialFrom(t, f.Client, d.Remote.String())
	if err != nil {
		t.Fatalf("detour after renewals: %v", err)
	}
	conn.Close()
	if err := src.Release(context.Background(), server); err != nil {
		t.Fatal(err)
	}
	if ds := src.Detours(server); len(ds) != 0 {
		t.Fatalf("detours after release: %v", ds)
	}
	if n := elements(t, f.Relay); n != 0 {
		t.Fatalf("%d elements after release", n)
	}
}

// One relay per network namespace: a second one is refused with the first
// one's pid and leaves the first one's table alone; a table removed under a
// running relay is recreated with its mappings.
func TestRelaySecondInstanceAndTableRemoval(t *testing.T) {
	f, _, cfgPath, p, c := relayLine(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0)
	if err != nil {
		t.Fatal(err)
	}

	second := exec.Command("ip", "netns", "exec", f.Relay, os.Args[0], "-test.run=^$")
	second.Env = append(os.Environ(), "MPDETOUR_TEST_RELAY_CONFIG="+cfgPath)
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another mpdetour relay is running in this network namespace") ||
		!strings.Contains(string(out), fmt.Sprintf("pid %d", p.cmd.Process.Pid)) {
		t.Fatalf("second relay: err %v, output %s", err, out)
	}
	if n := elements(t, f.Relay); n != 1 {
		t.Fatalf("after the refused second relay: %d elements, want 1", n)
	}

	if out, err := exec.Command("ip", "netns", "exec", f.Relay, "nft", "delete", "table", "ip", TableName).CombinedOutput(); err != nil {
		t.Fatalf("nft delete table: %v %s", err, out)
	}
	waitFor(t, "table recreated with the mapping", func() bool {
		_, err := nftList(t, f.Relay, "list", "table", "ip", TableName)
		return err == nil && elements(t, f.Relay) == 1
	})
	if !eventually(func() bool { return strings.Contains(p.stderr.String(), "recreated it") }) {
		t.Errorf("no log line about the recreation:\n%s", p.stderr.String())
	}
	conn, err := dialFrom(t, f.Client, d.String())
	if err != nil {
		t.Fatalf("mapping after recreation: %v", err)
	}
	defer conn.Close()
	if err := echo(conn, 10000); err != nil {
		t.Fatalf("traffic after recreation: %v", err)
	}
	if _, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5202"), 0); err != nil {
		t.Fatalf("grant after recreation: %v", err)
	}
}

// relayLine is a client-relay-server fixture with a relay running config
// extra, a sink on the server's port 5201 and a control connection of the
// member.
func relayLine(t *testing.T, extra string) (*fixture, keys, string, *relayProc, *relayconn.Conn) {
	t.Helper()
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	k := newKeys(t)
	cfgPath := filepath.Join(t.TempDir(), "relay.yaml")
	writeConfig(t, cfgPath, k, extra)
	startSink(t, f.Server, fxServer+":5201")
	p := startRelay(t, f.Relay, cfgPath)
	return f, k, cfgPath, p, dialRelay(t, f.Client, k, k.member)
}

// An initiation captured before a relay restart (even a kill -9) is refused
// as a replay after it, because the accepted timestamps are on disk before
// any handshake response leaves; without a state file it would be answered.
func TestReplayAcrossRestart(t *testing.T) {
	for _, withState := range []bool{true, false} {
		t.Run(fmt.Sprintf("state_file=%v", withState), func(t *testing.T) {
			extra := ""
			statePath := filepath.Join(t.TempDir(), "relay-state.json")
			if withState {
				extra = "state_file: " + statePath + "\n"
			}
			f, k, cfgPath, p, c := relayLine(t, extra)
			// The connection's own handshake first: one made after the
			// captured initiation would make it an (earlier) replay.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			sock := udpIn(t, f.Client, "")
			_, captured := rawSession(t, sock, k, k.member)
			p.signal(t, syscall.SIGKILL)
			_ = p.wait(t)
			p2 := startRelay(t, f.Relay, cfgPath)
			// The killed relay's table is still there when startRelay
			// returns: wait for the new one to serve.
			waitFor(t, "relay serving", func() bool { return strings.Contains(p2.stderr.String(), "relay serving") })
			b := exchange(t, sock, captured)
			if !withState {
				if _, err := proto.ParseResponse(b); err != nil {
					t.Fatalf("without a state file the replay was expected to be answered (what the state file prevents), got % x", b)
				}
				return
			}
			if r := errorReason(t, b); r != proto.ReasonReplay {
				t.Fatalf("replayed initiation after restart: %v, want replay", r)
			}
			// A fresh initiation of the same member still works.
			if _, _, err := rawSessionErr(sock, k, k.member); err != nil {
				t.Fatalf("fresh handshake after restart: %v", err)
			}
		})
	}
}

// relay status: a running relay answers on its lock socket with members,
// sessions and mappings with live byte counts.
func TestRelayStatus(t *testing.T) {
	f, _, _, _, c := relayLine(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dialFrom(t, f.Client, d.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(conn, 40000); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	var st *Status
	in(t, f.Relay, func() { st, err = QueryStatus(5 * time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 1 || st.Mappings != 1 || !st.CounterOK {
		t.Fatalf("status %+v", st)
	}
	m := st.Members[0]
	if m.Name != "alice" || m.Sessions < 1 || !strings.HasPrefix(m.LastAddress, fxClient+":") || len(m.Mappings) != 1 {
		t.Fatalf("member %+v", m)
	}
	if mp := m.Mappings[0]; mp.Client != fmt.Sprintf("%s:%d", fxClient, d.Port()) || mp.Server != fxServer+":5201" || mp.Bytes < 80000 {
		t.Fatalf("mapping %+v, want %s:%d -> %s:5201 with >= 80000 bytes", mp, fxClient, d.Port(), fxServer)
	}
	// Outside the relay's namespace there is no relay to ask.
	if _, err := QueryStatus(time.Second); err == nil || !strings.Contains(err.Error(), "no mpdetour relay is running") {
		t.Fatalf("status outside the namespace: %v", err)
	}
}

// An initiation of another protocol generation (an agent from before the
// cookies: version 2, 168 bytes) gets a clear bad-version refusal, not
// silence.
func TestOldVersionInitiationRefused(t *testing.T) {
	f, k, _, _, _ := relayLine(t, "")
	sock := udpIn(t, f.Client, "")
	in, err := proto.NewInitiation(k.member, k.relay.Public(), 7, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	old := append([]byte(nil), in.Packet[:168]...)
	old[1] = proto.Version - 1
	if r := errorReason(t, exchange(t, sock, old)); r != proto.ReasonBadVersion {
		t.Fatalf("old initiation: %v, want bad-version", r)
	}
}
