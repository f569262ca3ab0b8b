package relayclient

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// rotRelay is a fake relay's rotation logic: one member's state (its
// detours) is held under one key and moves only by a statement of the key
// holding it, as the relay's carry-over does (a statement of another key
// of the member is answered ok and moves nothing).
type rotRelay struct {
	mu     sync.Mutex
	holder proto.Key
	// refuse: how many OpRotate requests to answer with this reason first.
	refuse  int
	reason  proto.Reason
	rotates map[uint32]bool // request IDs (a retransmission keeps its ID)
}

func (rr *rotRelay) answer(req proto.Request, peer proto.Key) proto.Reply {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if req.Op != proto.OpRotate {
		return proto.Reply{}
	}
	if rr.rotates == nil {
		rr.rotates = map[uint32]bool{}
	}
	rr.rotates[req.ID] = true
	if rr.refuse > 0 {
		rr.refuse--
		return proto.Reply{Reason: rr.reason}
	}
	rot := req.Body.(*proto.RotateRequest).Rotate
	if !collective.VerifyRotation(rot, peer) {
		return proto.Reply{Reason: proto.ReasonUnauthorized}
	}
	if rr.holder == rot.Old {
		rr.holder = peer
	}
	return proto.Reply{}
}

func (rr *rotRelay) held() proto.Key {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.holder
}

func rotationRelay(t *testing.T, keys ...proto.Key) (*fakeRelay, *rotRelay) {
	r := newFakeRelay(t, keys[0].Public())
	rr := &rotRelay{holder: keys[0].Public()}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members = map[proto.Key]bool{}
	for _, k := range keys {
		r.members[k.Public()] = true
	}
	r.answerFrom = rr.answer
	return r, rr
}

// Two Rotates in a row, the first one's answer lost although the relay
// applied it: the relay holds the state under the second key, and the
// third key must still get it (the Conn sends a statement for every key
// not confirmed, not only for the first).
func TestRotateAfterLostAnswer(t *testing.T) {
	a, b, c := memberKey(t), memberKey(t), memberKey(t)
	r, rr := rotationRelay(t, a, b, c)
	r.mu.Lock()
	r.swallow = func(req proto.Request, peer proto.Key) bool {
		return req.Op == proto.OpRotate && peer == b.Public() // B's answers are lost
	}
	r.mu.Unlock()
	conn, ctx := dialFake(t, r, a, relayconn.Options{Retransmit: 50 * time.Millisecond})
	if _, err := conn.Do(ctx, proto.NewRequest(0, &proto.PingRequest{})); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	err := conn.Rotate(short, b, nil)
	cancel()
	if err == nil {
		t.Fatal("rotation to B answered although its answers are lost")
	}
	if got := rr.held(); got != b.Public() {
		t.Fatalf("the relay holds the state under %s, want B (it applied A->B)", got.ID())
	}
	if err := conn.Rotate(ctx, c, nil); err != nil {
		t.Fatalf("rotation to C: %v", err)
	}
	if got := rr.held(); got != c.Public() {
		t.Fatalf("after the rotation to C the relay holds the state under %s, want C (A %s, B %s)", got.ID(), a.Public().ID(), b.Public().ID())
	}
	if got := conn.SessionKey(); got != c.Public() {
		t.Fatalf("session in use made with %s when Rotate returned, want C", got.ID())
	}
}

// A refusal that says "later" (rate limited, the relay's own failure) is
// tried again, not taken as the end of the rotation.
func TestRotateRetriesTemporaryRefusal(t *testing.T) {
	for _, reason := range []proto.Reason{proto.ReasonRateLimited, proto.ReasonInternal} {
		t.Run(reason.String(), func(t *testing.T) {
			a, b := memberKey(t), memberKey(t)
			r, rr := rotationRelay(t, a, b)
			rr.mu.Lock()
			rr.refuse, rr.reason = 1, reason
			rr.mu.Unlock()
			conn, ctx := dialFake(t, r, a, relayconn.Options{Retransmit: 50 * time.Millisecond})
			if _, err := conn.Do(ctx, proto.NewRequest(0, &proto.PingRequest{})); err != nil {
				t.Fatal(err)
			}
			if err := conn.Rotate(ctx, b, nil); err != nil {
				t.Fatalf("rotation after one %s refusal: %v", reason, err)
			}
			if got := rr.held(); got != b.Public() {
				t.Fatalf("the relay holds the state under %s, want the new key", got.ID())
			}
			if got := conn.SessionKey(); got != b.Public() {
				t.Fatalf("session in use made with %s when Rotate returned, want the new key", got.ID())
			}
		})
	}
}

// A final refusal (say, a forged statement) is returned; the new key is
// used anyway (docs/collective.md).
func TestRotateFinalRefusal(t *testing.T) {
	a, b := memberKey(t), memberKey(t)
	r, rr := rotationRelay(t, a, b)
	rr.mu.Lock()
	rr.refuse, rr.reason = 1000, proto.ReasonUnauthorized
	rr.mu.Unlock()
	conn, ctx := dialFake(t, r, a, relayconn.Options{Retransmit: 50 * time.Millisecond})
	if _, err := conn.Do(ctx, proto.NewRequest(0, &proto.PingRequest{})); err != nil {
		t.Fatal(err)
	}
	if err := conn.Rotate(ctx, b, nil); proto.ReasonOf(err) != proto.ReasonUnauthorized {
		t.Fatalf("rotation refused as unauthorized returned %v", err)
	}
	rr.mu.Lock()
	rotates := len(rr.rotates)
	rr.mu.Unlock()
	if rotates != 1 {
		t.Fatalf("%d rotation requests (not counting retransmissions) for a final refusal, want 1", rotates)
	}
	if got := conn.SessionKey(); got != b.Public() {
		t.Fatalf("session in use made with %s, want the new key", got.ID())
	}
}
