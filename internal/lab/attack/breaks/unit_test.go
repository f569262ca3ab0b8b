package breaks

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// The forged dead message is memberlist's deadMsg (type 5) with the
// msgpack map its decoder reads: fixstr keys, uint32 incarnation, and
// str8 for names of 32 bytes or more (gossip member names are 50).
func TestDeadMessage(t *testing.T) {
	got := deadMessage(0xffffffff, "v", "f")
	want, _ := hex.DecodeString("05" + "83" + "ab" + hex.EncodeToString([]byte("Incarnation")) + "ceffffffff" +
		"a4" + hex.EncodeToString([]byte("Node")) + "a176" + "a4" + hex.EncodeToString([]byte("From")) + "a166")
	if !bytes.Equal(got, want) {
		t.Fatalf("deadMessage:\n got %x\nwant %x", got, want)
	}
	long := deadMessage(1, string(bytes.Repeat([]byte("n"), 50)), "f")
	if i := bytes.Index(long, []byte{0xd9, 50}); i < 0 {
		t.Fatalf("a 50-byte name is not a str8: %x", long)
	}
}

// family6Grant must write what destinations-v6 says it sends: a grant
// whose address is family 6 on the wire. A genuine IPv6 address parses
// back as itself (so the layout is right), an IPv4 one is its mapped form,
// which the parser refuses as malformed (what the relay answers).
func TestFamily6Grant(t *testing.T) {
	b, err := family6Grant(netip.MustParseAddrPort("[2001:db8::7]:443"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := proto.ParseRequest(b)
	if err != nil || r.Body.(*proto.GrantRequest).Server != netip.MustParseAddrPort("[2001:db8::7]:443") {
		t.Fatalf("IPv6 grant parsed as %+v, %v", r.Body, err)
	}
	b, err = family6Grant(netip.MustParseAddrPort("127.0.0.1:443"))
	if err != nil {
		t.Fatal(err)
	}
	if b[8] != 6 || netip.AddrFrom16([16]byte(b[9:25])) != netip.MustParseAddr("::ffff:127.0.0.1") {
		t.Fatalf("mapped grant bytes %x", b)
	}
	if _, err := proto.ParseRequest(b); proto.ReasonOf(err) != proto.ReasonMalformed {
		t.Fatalf("mapped grant: parse error %v, want malformed", err)
	}
}
