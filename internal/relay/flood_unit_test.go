package relay

import (
	"encoding/binary"
	"net/netip"
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
