package roster

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"strings"
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
	str := func(s string) { b = msgpackStr(b, s) }
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

// TestHostileGossipPeer (issue 30, bad input): a peer that holds the
// gossip secret sends, as sealed memberlist alive messages over loopback
// to a real relay node: garbage metadata, metadata longer than an entry,
// another relay's valid entry under a name of its own (claiming it), a
// relay's older entry at a higher incarnation (replayed), and a flood of
// invented relays. Every one is refused and counted by reason, the node's
// memberlist table and roster do not grow, and the other relays are not
// affected.
func TestHostileGossipPeer(t *testing.T) {
	f := newFixture(t)
	var logs syncBuf
	nodes := startCluster(t, f, 3, &logs)
	waitFor(t, 10*time.Second, "three relays in every roster", func() bool {
		for _, nd := range nodes {
			if nd.Count() != 3 || nd.Members() != 3 {
				return false
			}
		}
		return true
	})
	target := nodes[0]
	c, err := net.Dial("udp", target.list.LocalNode().Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(node string, inc uint32, meta []byte) {
		t.Helper()
		if _, err := c.Write(seal(t, testSecret, aliveMessage(inc, node, meta))); err != nil {
			t.Fatal(err)
		}
	}
	victim := nodes[1]
	victim.mu.Lock()
	good := victim.self
	older := *victim.entries[victim.Name()].entry
	victim.mu.Unlock()
	older.Issued = older.Issued.Add(-time.Minute)
	older.Load = 999
	if err := older.Sign(victim.cfg.Key); err != nil {
		t.Fatal(err)
	}
	old, _ := older.Bytes()
	send("relay-garbage", 1, []byte("not an entry"))
	send("relay-big", 1, make([]byte, 600))
	send("relay-impostor", 1, good) // another relay's entry under its own name
	send(victim.Name(), 1<<20, old) // replayed older entry, higher incarnation
	for i := range 2000 {
		send(fmt.Sprintf("relay-flood-%d", i), 1, []byte(fmt.Sprintf("flood %d", i)))
	}
	want := map[string]uint64{"malformed": 2001, ReasonOversized: 1, "name-mismatch": 1, ReasonStale: 1}
	waitFor(t, 10*time.Second, "every hostile message refused and counted", func() bool {
		r := target.Refused()
		for k, v := range want {
			if r[k] < v {
				return false
			}
		}
		return true
	})
	t.Logf("refused: %v", target.Refused())
	time.Sleep(time.Second) // gossip rounds
	for _, nd := range nodes {
		if nd.Members() != 3 || nd.Size() != 3 {
			t.Fatalf("%s: memberlist %d members, roster %d entries after the hostile peer", nd.Name(), nd.Members(), nd.Size())
		}
		for _, e := range nd.Entries() {
			if e.Load == 999 {
				t.Fatalf("%s: the replayed older entry replaced the newer", nd.Name())
			}
		}
	}
	if n := strings.Count(logs.String(), "reason=malformed"); n > 3 {
		t.Errorf("%d log lines for malformed entries: the flood is not rate-limited", n)
	}
}

// aliveMessage is memberlist's alive message (type 4, msgpack map of the
// struct's fields) as a packet carries it.
func aliveMessage(inc uint32, node string, meta []byte) []byte {
	b := []byte{4, 0x86}
	str := func(s string) { b = msgpackStr(b, s) }
	bin := func(v []byte) {
		if len(v) < 256 {
			b = append(b, 0xc4, byte(len(v)))
		} else {
			b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(len(v)))
		}
		b = append(b, v...)
	}
	str("Incarnation")
	b = binary.BigEndian.AppendUint32(append(b, 0xce), inc)
	str("Node")
	str(node)
	str("Addr")
	bin([]byte{127, 0, 0, 1})
	str("Port")
	b = binary.BigEndian.AppendUint16(append(b, 0xcd), 9)
	str("Meta")
	bin(meta)
	str("Vsn")
	bin([]byte{1, 5, 2, 2, 5, 4})
	return b
}

// msgpackStr appends s as a msgpack string (fixstr or str8).
func msgpackStr(b []byte, s string) []byte {
	if len(s) < 32 {
		b = append(b, 0xa0|byte(len(s)))
	} else {
		b = append(b, 0xd9, byte(len(s)))
	}
	return append(b, s...)
}
