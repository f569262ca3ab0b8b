package fairshare

import (
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

func TestLedgerTunnelDeltas(t *testing.T) {
	l := NewLedger("")
	k := testKey(t)
	now := time.Now()
	for _, cur := range []uint64{100, 250, 250, 40} { // 40: the peer was re-added
		l.TunnelPeer(k, "t", cur, now, false)
	}
	if got := l.Members[k].Consumed; got != 250+40 {
		t.Fatalf("consumed %d, want 290", got)
	}
}

func TestCreditSaturates(t *testing.T) {
	var nilEntry *Entry
	if nilEntry.Credit() != collective.StartCredit {
		t.Fatal("unknown member does not start at StartCredit")
	}
	e := &Entry{Consumed: 1<<64 - 1}
	if c := e.Credit(); c >= 0 || c < -1<<62 {
		t.Fatalf("huge consumption: %d", c)
	}
	e = &Entry{Earned: 1<<64 - 1}
	if c := e.Credit(); c <= 0 {
		t.Fatalf("huge earnings: %d", c)
	}
}

func testKey(t *testing.T) proto.Key {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}
