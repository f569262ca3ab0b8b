package legacyclient

import (
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

var server = netip.MustParseAddrPort("192.0.2.10:5201")

// daemon is a v1 daemon on loopback that grants port 4000+n, or answers
// from another socket when spoof is set.
type daemon struct {
	pc       *net.UDPConn
	requests atomic.Int32
	silent   atomic.Bool
	spoof    atomic.Pointer[net.UDPConn]
}

func newDaemon(t *testing.T) *daemon {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{pc: pc}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			m, err := proto.ParseLegacy(buf[:n])
			if err != nil || m.Response {
				continue
			}
			c := d.requests.Add(1)
			if d.silent.Load() {
				continue
			}
			b, _ := proto.MarshalLegacy(proto.LegacyMsg{Response: true, Server: m.Server, Port: 4000 + uint16(c)})
			if sp := d.spoof.Load(); sp != nil {
				sp.WriteToUDP(b, from)
				continue
			}
			pc.WriteToUDP(b, from)
		}
	}()
	return d
}

func (d *daemon) addr() netip.AddrPort { return d.pc.LocalAddr().(*net.UDPAddr).AddrPort() }

func waitDetours(s *V1Source, n int) bool {
	for range 100 {
		if len(s.Detours(server)) == n {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func TestGrantAndRenewAfterLease(t *testing.T) {
	d := newDaemon(t)
	s, err := New(Config{Relays: []Relay{{Name: "v1", Addr: d.addr()}}, Lease: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Prepare(server)
	if !waitDetours(s, 1) {
		t.Fatal("no detour after Prepare")
	}
	got := s.Detours(server)[0]
	if got.Remote != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 4001) || got.Relay != "v1" || got.Kind.String() != "nat" {
		t.Fatalf("detour %v", got)
	}
	// A fresh grant is not asked again.
	s.Prepare(server)
	time.Sleep(50 * time.Millisecond)
	if n := d.requests.Load(); n != 1 {
		t.Fatalf("%d requests for one fresh grant", n)
	}
	// After the assumed lease the grant lapses and is asked again.
	time.Sleep(300 * time.Millisecond)
	if len(s.Detours(server)) != 0 {
		t.Fatal("lapsed grant still handed out")
	}
	s.Prepare(server)
	if !waitDetours(s, 1) || s.Detours(server)[0].Remote.Port() != 4002 {
		t.Fatalf("no new grant after the lease: %v", s.Detours(server))
	}
}

func TestSilentDaemonBackoff(t *testing.T) {
	d := newDaemon(t)
	d.silent.Store(true)
	s, _ := New(Config{Relays: []Relay{{Name: "v1", Addr: d.addr()}}, Timeout: 300 * time.Millisecond, RetryAfter: time.Hour})
	defer s.Close()
	s.Prepare(server)
	// The 300 ms timeout with its retransmission: wait for its verdict
	// (a fixed 500 ms can be too short on a loaded machine).
	err := s.Err(0, server)
	for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); err = s.Err(0, server) {
		time.Sleep(20 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "no response") {
		t.Fatalf("err %v", err)
	}
	n := d.requests.Load()
	if n < 2 {
		t.Fatalf("%d requests: no retransmission", n)
	}
	s.Prepare(server) // within RetryAfter: not asked again
	time.Sleep(100 * time.Millisecond)
	if d.requests.Load() != n {
		t.Fatal("asked again within RetryAfter")
	}
}

// A response from another address (v1 is unauthenticated; anyone can send
// one) is ignored.
func TestSpoofedResponseIgnored(t *testing.T) {
	d := newDaemon(t)
	sp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	d.spoof.Store(sp)
	s, _ := New(Config{Relays: []Relay{{Name: "v1", Addr: d.addr()}}, Timeout: 300 * time.Millisecond})
	defer s.Close()
	s.Prepare(server)
	time.Sleep(500 * time.Millisecond)
	if ds := s.Detours(server); len(ds) != 0 {
		t.Fatalf("spoofed grant accepted: %v", ds)
	}
}

func TestConfigRefusals(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("no relays accepted")
	}
	if _, err := New(Config{Relays: []Relay{{Name: "x", Addr: netip.MustParseAddrPort("[::1]:45672")}}}); err == nil {
		t.Error("IPv6 daemon accepted")
	}
}
