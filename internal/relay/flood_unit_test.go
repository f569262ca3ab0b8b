package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// Junk transport packets from many spoofed source addresses (no session,
// 32 bytes) must not lock anybody out: afterwards an initiation of a
// member from an address never seen before is answered. (Refusals used to
// create a rate bucket per source address; with the table full, every new
// address was dropped for about a minute.) The sources are loopback
// addresses: the refusals the relay sends stay on this host.
func TestSpoofedJunkLocksNobodyOut(t *testing.T) {
	alice := testKey(t)
	set := fairConfig(t, 0, "")
	set.Members[alice.Public()] = "alice"
	s, _ := newTestServer(t, Static{}, set, nil, nil)
	junk := make([]byte, 32)
	junk[0], junk[1] = proto.TypeTransport, proto.Version
	now := time.Now()
	const sources = 120_000
	for i := 0; i < sources; i++ {
		binary.BigEndian.PutUint32(junk[4:], uint32(i)+1) // receiver index: no session
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(1 + i>>16), byte(i >> 8), byte(i)}), 4000)
		s.handle(packet{data: junk, from: from, at: now})
	}
	in, err := proto.NewInitiation(alice, set.PrivateKey.Public(), 7, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fresh := netip.MustParseAddrPort("127.254.0.1:5000")
	s.handle(packet{data: in.Packet, from: fresh, at: time.Now()})
	if len(s.out.responses) != 1 || len(s.ses.byMember[alice.Public()]) != 1 {
		t.Fatalf("after junk from %d spoofed sources, a member's initiation from a new address got %d responses, %d sessions",
			sources, len(s.out.responses), len(s.ses.byMember[alice.Public()]))
	}
}

// Junk from many spoofed sources gets at most the global refusal budget of
// clear-text answers, however many sources it names: each answer is a
// send, which was most of the relay's time under a 20,000/s junk flood
// (docs/results/attacks/spoofed-junk), and a packet toward an address that
// sent nothing. The sources are loopback addresses whose port is a socket
// of this test, which counts the refusals that arrive.
func TestJunkRefusalsBounded(t *testing.T) {
	s, _ := newTestServer(t, Static{}, fairConfig(t, 0, ""), nil, nil)
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	_ = sink.SetReadBuffer(4 << 20)
	port := uint16(sink.LocalAddr().(*net.UDPAddr).Port)
	var got atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 256)
		for {
			_ = sink.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := sink.Read(buf)
			if err != nil {
				return
			}
			if e, err := proto.ParseError(buf[:n]); err == nil && e.Reason == proto.ReasonNoSession {
				got.Add(1)
			}
		}
	}()
	junk := make([]byte, 32)
	junk[0], junk[1] = proto.TypeTransport, proto.Version
	const sources = 12_000
	start := time.Now()
	for i := 0; i < sources; i++ {
		binary.BigEndian.PutUint32(junk[4:], uint32(i)+1) // receiver index: no session
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(1 + i>>16), byte(i >> 8), byte(i)}), port)
		s.handle(packet{data: junk, from: from, at: time.Now()})
	}
	took := time.Since(start)
	<-done
	limit := int64(refuseBurst + refuseRate*took.Seconds() + 1)
	if n := got.Load(); n == 0 || n > limit {
		t.Fatalf("junk from %d spoofed sources in %v got %d refusals; want 1..%d (the global budget)", sources, took, n, limit)
	}
}

// The reader takes datagrams in batches into buffers it reuses: every
// datagram must reach the event loop whole, with its own bytes (not a
// buffer a later read overwrote), its source and the address it arrived at.
func TestReaderBatchesKeepEachDatagram(t *testing.T) {
	s, _ := newTestServer(t, Static{}, fairConfig(t, 0, ""), nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.readV2(ctx, s.io.reader(false))
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 3 * readBatch
	for i := 0; i < n; i++ {
		b := bytes.Repeat([]byte{byte(i)}, 16+i%200) // not an initiation: no screening
		b[0] = proto.TypeTransport
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var ps []packet
	deadline := time.After(5 * time.Second)
	for len(ps) < n {
		select {
		case p := <-s.ev.in:
			ps = append(ps, p)
		case <-deadline:
			t.Fatalf("the reader queued %d of %d datagrams", len(ps), n)
		}
	}
	from := c.LocalAddr().(*net.UDPAddr).AddrPort()
	for i, p := range ps {
		want := bytes.Repeat([]byte{byte(i)}, 16+i%200)
		want[0] = proto.TypeTransport
		if !bytes.Equal(p.data, want) || p.from != from || p.dst != netip.MustParseAddr("127.0.0.1") || p.at.IsZero() {
			t.Fatalf("datagram %d: got %d bytes %x from %v to %v, want %d bytes %x from %v to 127.0.0.1",
				i, len(p.data), p.data[:min(len(p.data), 4)], p.from, p.dst, len(want), want[:4], from)
		}
	}
}
