package relay

import (
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// The keyring finds the key an initiation is addressed to by its mac1, and
// a key kept across a reload keeps its cookie jar.
func TestKeyringMatch(t *testing.T) {
	gen := func() proto.Key {
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	cur, prev, other, member := gen(), gen(), gen(), gen()
	kr := newKeyring(cur, prev, nil)
	if len(kr.ids) != 2 || kr.ids[0].priv != cur {
		t.Fatalf("keyring %+v", kr.ids)
	}
	init := func(to proto.Key) []byte {
		in, err := proto.NewInitiation(member, to.Public(), 7, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return in.Packet
	}
	if id := kr.match(init(cur)); id == nil || id.priv != cur {
		t.Fatal("initiation to the current key not matched to it")
	}
	if id := kr.match(init(prev)); id == nil || id.priv != prev {
		t.Fatal("initiation to the previous key not matched to it")
	}
	if id := kr.match(init(other)); id != nil {
		t.Fatal("initiation to another key matched")
	}
	// The matched key completes the handshake; the other does not.
	pin, _ := proto.ParseInit(init(prev))
	if _, err := proto.ConsumeInitiation(kr.match(init(prev)).priv, pin); err != nil {
		t.Fatalf("handshake with the previous key: %v", err)
	}
	if _, err := proto.ConsumeInitiation(cur, pin); err == nil {
		t.Fatal("the current key accepted an initiation to the previous one")
	}
	// Rotation: prev dropped, cur becomes previous of a new key; cur's jar stays.
	next := gen()
	kr2 := newKeyring(next, cur, kr)
	if kr2.ids[1] != kr.ids[0] || kr2.ids[0].priv != next {
		t.Fatal("a kept key got a new identity")
	}
	if kr2.match(init(prev)) != nil {
		t.Fatal("the dropped key still matches")
	}
	if len(newKeyring(next, proto.Key{}, kr2).ids) != 1 {
		t.Fatal("no previous key: one identity expected")
	}
}
