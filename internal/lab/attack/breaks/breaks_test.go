package breaks

import (
	"errors"
	"math"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// The forged message must be what memberlist decodes as a dead message:
// otherwise forged-gossip would pass against any build without testing
// anything.
func TestDeadMessageDecodes(t *testing.T) {
	b := deadMessage(math.MaxUint32, "server", "detour2")
	if b[0] != 5 {
		t.Fatalf("message type %d, want 5 (dead)", b[0])
	}
	var d struct {
		Incarnation uint32
		Node        string
		From        string
	}
	if err := codec.NewDecoderBytes(b[1:], &codec.MsgpackHandle{}).Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.Incarnation != math.MaxUint32 || d.Node != "server" || d.From != "detour2" {
		t.Fatalf("decoded %+v", d)
	}
	long := "a-relay-name-longer-than-thirty-one-bytes"
	if err := codec.NewDecoderBytes(deadMessage(1, long, "x")[1:], &codec.MsgpackHandle{}).Decode(&d); err != nil || d.Node != long {
		t.Fatalf("long name: %+v, %v", d, err)
	}
}

// TestResultFailed: a case that cannot run records why (and returns).
func TestResultFailed(t *testing.T) {
	r := Result{Case: "forged-gossip"}.failed(errors.New("the build refuses secret_file"))
	if r.Error != "the build refuses secret_file" || r.Case != "forged-gossip" {
		t.Fatalf("failed: %+v", r)
	}
}
