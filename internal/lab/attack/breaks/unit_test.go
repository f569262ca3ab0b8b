package breaks

import (
	"bytes"
	"encoding/hex"
	"testing"
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
