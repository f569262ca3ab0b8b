package roster

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"math"
	"net"
	"testing"
	"time"
)

// One forged memberlist "dead" message at the highest
// incarnation removed a live relay from the other relays' rosters for 10+
// minutes (its refutation wrapped around to incarnation 0 and was ignored
// as older). Gossip is now sealed with the cluster's secret, so a packet
// from anybody without it is dropped and counted; and a relay that holds
// the secret and forges the same message (an insider) only makes the
// victim refute, and the refutation wins (serial-number comparison of
// incarnations, third_party/memberlist/PATCHES.md).
func TestForgedDeadHighestIncarnation(t *testing.T) {
	f := newFixture(t)
	var logs syncBuf
	nodes := startCluster(t, f, 3, &logs)
	everyRosterListsAll := func() bool {
		for _, nd := range nodes {
			if nd.Count() != 3 {
				return false
			}
		}
		return true
	}
	waitFor(t, 10*time.Second, "three relays in every roster", everyRosterListsAll)
	victim := nodes[2].Name()
	msg := deadMessage(math.MaxUint32, victim, nodes[1].Name())
	send := func(pkt []byte) {
		t.Helper()
		for _, nd := range nodes[:2] {
			c, err := net.Dial("udp", nd.list.LocalNode().Address())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(pkt); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
	}
	// stays: the victim is in every roster at every check for d.
	stays := func(d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if !everyRosterListsAll() {
				return false
			}
		}
		return true
	}

	// An outsider (no secret): the forged packet, plain as memberlist
	// sends without encryption, is dropped and counted.
	for range 5 {
		send(msg)
	}
	if !stays(3 * time.Second) {
		t.Fatal("a forged dead message without the gossip secret removed a live relay")
	}
	for _, nd := range nodes[:2] {
		if nd.Refused()[ReasonUnauthenticated] == 0 {
			t.Errorf("%s: the unauthenticated packets were not counted: %v", nd.Name(), nd.Refused())
		}
	}

	// An insider (holds the secret): the relays believe it for a moment,
	// the victim refutes, and the refutation is not ignored.
	send(seal(t, testSecret, msg))
	back := time.Now()
	for !stays(2 * time.Second) {
		if time.Since(back) > 15*time.Second {
			for _, nd := range nodes {
				t.Logf("%s: %d entries", nd.Name(), nd.Count())
			}
			t.Fatal("the refuted death was ignored: the live relay stays out of the roster")
		}
	}
	t.Logf("after a sealed forged dead message at the highest incarnation, every roster lists the victim again (checked for 2 s) %v after it was sent", time.Since(back).Round(time.Millisecond))
}

// deadMessage is memberlist's dead message (type 5, msgpack map of the
// struct's fields) as a packet carries it.
func deadMessage(inc uint32, node, from string) []byte {
	b := []byte{5, 0x83}
	str := func(s string) {
		if len(s) < 32 {
			b = append(b, 0xa0|byte(len(s)))
		} else {
			b = append(b, 0xd9, byte(len(s)))
		}
		b = append(b, s...)
	}
	str("Incarnation")
	b = binary.BigEndian.AppendUint32(append(b, 0xce), inc)
	str("Node")
	str(node)
	str("From")
	str(from)
	return b
}

// seal encrypts a packet as memberlist does with a secret key (version 1:
// version byte, 12-byte nonce, AES-GCM, no label).
func seal(t *testing.T, key, msg []byte) []byte {
	t.Helper()
	blk, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(blk)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 1+12, 1+12+len(msg)+gcm.Overhead())
	out[0] = 1
	if _, err := rand.Read(out[1:13]); err != nil {
		t.Fatal(err)
	}
	return gcm.Seal(out, out[1:13], msg, nil)
}
