package legacyclient

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// originalDaemon answers like the 2017 daemon, written from the v1 wire
// format (docs: detour-evaluation, "Original NAT-request wire format"),
// not from our codec: 12 bytes, ver=1 | op (0 request, 1 response) |
// reserved u16 | rip 4 bytes | rpt u16 | dpt u16, network byte order. It
// maps the port proposed, or the next free one when the client already
// uses it for another server; an existing mapping for (client, rip, rpt)
// is returned again; a proposal of 0 is answered with 0 (and, in the
// original, a stray rule).
type originalDaemon struct {
	pc *net.UDPConn
	mu sync.Mutex
	// mappings: dpt -> server; proposed: the dpt of every request.
	mappings map[uint16]netip.AddrPort
	proposed []uint16
}

func newOriginalDaemon(t *testing.T) *originalDaemon {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	d := &originalDaemon{pc: pc, mappings: map[uint16]netip.AddrPort{}}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := pc.ReadFromUDP(b)
			if err != nil {
				return
			}
			if n != 12 || b[0] != 1 || b[1] != 0 {
				continue
			}
			rip := netip.AddrFrom4([4]byte(b[4:8]))
			rpt := binary.BigEndian.Uint16(b[8:10])
			dpt := binary.BigEndian.Uint16(b[10:12])
			srv := netip.AddrPortFrom(rip, rpt)
			d.mu.Lock()
			d.proposed = append(d.proposed, dpt)
			if dpt != 0 {
				granted := uint16(0)
				for p, s := range d.mappings {
					if s == srv {
						granted = p
					}
				}
				for granted == 0 {
					if _, taken := d.mappings[dpt]; !taken {
						granted = dpt
						d.mappings[dpt] = srv
						break
					}
					dpt++
				}
				dpt = granted
			}
			d.mu.Unlock()
			r := make([]byte, 12)
			r[0], r[1] = 1, 1
			copy(r[4:8], b[4:8])
			binary.BigEndian.PutUint16(r[8:10], rpt)
			binary.BigEndian.PutUint16(r[10:12], dpt)
			pc.WriteToUDP(r, from)
		}
	}()
	return d
}

func (d *originalDaemon) addr() netip.AddrPort { return d.pc.LocalAddr().(*net.UDPAddr).AddrPort() }

func waitFor(s *V1Source, srv netip.AddrPort, n int) []detour.Detour {
	for range 200 {
		if ds := s.Detours(srv); len(ds) == n {
			return ds
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s.Detours(srv)
}

// Issue 28: the agent proposed port 0, which the original daemon answers
// with 0 (a refusal to us, a stray rule there), so the first connection to
// each server got no detour. It proposes the server's port, as the
// original client does, and uses whatever port the daemon grants.
func TestInteropOriginalDaemon(t *testing.T) {
	d := newOriginalDaemon(t)
	s, err := New(Config{Relays: []Relay{{Name: "v1", Addr: d.addr()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := netip.MustParseAddrPort("192.0.2.10:5201")
	b := netip.MustParseAddrPort("192.0.2.11:5201") // same port: the daemon grants another
	s.Prepare(a)
	s.Prepare(b)
	da, db := waitFor(s, a, 1), waitFor(s, b, 1)
	if len(da) != 1 || len(db) != 1 {
		t.Fatalf("no detours: %v %v (errors %v %v)", da, db, s.Err(0, a), s.Err(0, b))
	}
	d.mu.Lock()
	proposed := append([]uint16(nil), d.proposed...)
	d.mu.Unlock()
	for _, p := range proposed {
		if p != 5201 {
			t.Fatalf("proposed detour ports %v, want the server's 5201", proposed)
		}
	}
	ports := map[uint16]bool{da[0].Remote.Port(): true, db[0].Remote.Port(): true}
	if !ports[5201] || !ports[5202] || da[0].Remote.Addr() != d.addr().Addr() {
		t.Fatalf("detours %v and %v, want the daemon's address with 5201 and 5202", da[0].Remote, db[0].Remote)
	}
}

// Each daemon's grant lapses after its own lease (one lease was stored for
// all daemons).
func TestPerDaemonLease(t *testing.T) {
	short, long := newOriginalDaemon(t), newOriginalDaemon(t)
	s, err := New(Config{Relays: []Relay{{Name: "short", Addr: short.addr(), Lease: 300 * time.Millisecond},
		{Name: "long", Addr: long.addr(), Lease: time.Minute}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv := netip.MustParseAddrPort("192.0.2.10:5201")
	s.Prepare(srv)
	if ds := waitFor(s, srv, 2); len(ds) != 2 {
		t.Fatalf("detours %v", ds)
	}
	time.Sleep(350 * time.Millisecond)
	ds := s.Detours(srv)
	if len(ds) != 1 || ds[0].Relay != "long" {
		t.Fatalf("after the short lease: %v, want only the long one", ds)
	}
}
