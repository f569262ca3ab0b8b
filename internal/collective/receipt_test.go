package collective

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"filippo.io/edwards25519"

	"github.com/mpdetour/mpdetour/internal/proto"
)

func key(t testing.TB) proto.Key {
	t.Helper()
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The Edwards key XEdDSA signs with is the Curve25519 key's point: its
// Montgomery form is the X25519 public key.
func TestXEdDSAKeyConversion(t *testing.T) {
	for i := 0; i < 50; i++ {
		priv := key(t)
		A, err := EdwardsOf(priv.Public())
		if err != nil {
			t.Fatal(err)
		}
		P, err := new(edwards25519.Point).SetBytes(A)
		if err != nil {
			t.Fatal(err)
		}
		pub := priv.Public()
		if !bytes.Equal(P.BytesMontgomery(), pub[:]) {
			t.Fatalf("converted key's Montgomery form differs from the X25519 public key")
		}
		msg := []byte{byte(i)}
		sig, err := XEdSign(priv, msg)
		if err != nil {
			t.Fatal(err)
		}
		if !XEdVerify(priv.Public(), msg, sig[:]) {
			t.Fatal("own signature does not verify")
		}
		if XEdVerify(key(t).Public(), msg, sig[:]) {
			t.Fatal("signature verifies under another key")
		}
		if XEdVerify(priv.Public(), []byte{byte(i), 0}, sig[:]) {
			t.Fatal("signature verifies for another message")
		}
	}
	var minusOne proto.Key // p-1, little-endian: no Edwards point
	minusOne[0] = 0xec
	for i := 1; i < 31; i++ {
		minusOne[i] = 0xff
	}
	minusOne[31] = 0x7f
	if _, err := EdwardsOf(minusOne); err == nil {
		t.Fatal("u = -1 accepted")
	}
}

func signedReceipt(t testing.TB, relay proto.Key, served proto.Key, seq uint64, end time.Time) *Receipt {
	t.Helper()
	r := &Receipt{Served: served, Seq: seq, Start: end.Add(-time.Minute), End: end, Relayed: 123456}
	if err := SignReceipt(r, relay); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReceipt(t *testing.T) {
	relay, other, served := key(t), key(t), key(t)
	now := time.Now()
	r := signedReceipt(t, relay, served.Public(), 7, now)
	if len(r.Bytes()) != ReceiptLen {
		t.Fatalf("%d bytes, want %d", len(r.Bytes()), ReceiptLen)
	}
	back, err := ParseReceipt(r.String())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("round trip: %+v != %+v", back, r)
	}
	if err := back.Check(now); err != nil {
		t.Fatalf("valid receipt: %v", err)
	}
	// Every field is covered by the signature.
	for i := 0; i < receiptBodyLen; i++ {
		b := r.Bytes()
		b[i] ^= 0x01
		p, err := ParseReceiptBytes(b)
		if err != nil {
			continue // no longer well formed
		}
		if err := p.Check(now); !errors.Is(err, ErrReceiptForged) {
			t.Fatalf("byte %d flipped: %v, want forged", i, err)
		}
	}
	// Signed by another relay than the one it names.
	forged := *r
	sig, _ := XEdSign(other, signed(receiptDomain, forged.body()))
	forged.Signature = sig
	if err := forged.Check(now); !errors.Is(err, ErrReceiptForged) {
		t.Fatalf("another key's signature: %v", err)
	}
	self := signedReceipt(t, relay, relay.Public(), 8, now)
	if err := self.Check(now); !errors.Is(err, ErrReceiptSelfIssued) {
		t.Fatalf("self-issued: %v", err)
	}
	old := signedReceipt(t, relay, served.Public(), 9, now.Add(-ReceiptMaxAge-time.Hour))
	if err := old.Check(now); !errors.Is(err, ErrReceiptExpired) {
		t.Fatalf("old: %v", err)
	}
	future := signedReceipt(t, relay, served.Public(), 10, now.Add(time.Hour))
	if err := future.Check(now); !errors.Is(err, ErrReceiptFuture) {
		t.Fatalf("future: %v", err)
	}
	for name, b := range map[string][]byte{
		"short":       r.Bytes()[:ReceiptLen-1],
		"long":        append(r.Bytes(), 0),
		"version":     append([]byte{2}, r.Bytes()[1:]...),
		"empty":       nil,
		"zero":        make([]byte, ReceiptLen),
		"zero seq":    mutate(r.Bytes(), 1+2*proto.KeyLen+7, 0, 1+2*proto.KeyLen, 0),
		"end < start": mutate(r.Bytes(), 1+2*proto.KeyLen+8+3, 0xff), // start far beyond end (the low byte alone was flaky: +255 s could stay below end)
	} {
		if _, err := ParseReceiptBytes(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	for _, s := range []string{"", "mpdetour-receipt-v1:", "mpdetour-receipt-v1:!!", "mpdetour-cert-v1:" + r.String()[len(receiptPrefix):]} {
		if _, err := ParseReceipt(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// mutate sets b[i] = v for each (i, v) pair.
func mutate(b []byte, iv ...int) []byte {
	for j := 0; j+1 < len(iv); j += 2 {
		b[iv[j]] = byte(iv[j+1])
	}
	return b
}

func TestReplayWindow(t *testing.T) {
	var w ReplayWindow
	steps := []struct {
		seq uint64
		ok  bool
	}{
		{0, false}, {5, true}, {5, false}, {3, true}, {3, false}, {4, true}, {100, true},
		{37, true}, {36, false}, {37, false}, {99, true}, {100, false}, {1000, true}, {100, false}, {999, true},
		{1 << 63, true}, {1<<63 - 63, true}, {1<<63 - 64, false},
	}
	for i, s := range steps {
		if got := w.Accept(s.seq); got != s.ok {
			t.Fatalf("step %d: Accept(%d) = %v, want %v (window %+v)", i, s.seq, got, s.ok, w)
		}
	}
}

func FuzzParseReceipt(f *testing.F) {
	// Fixed keys: the committed seeds (testdata/fuzz) hold receipts they signed.
	relay, served := proto.Key{0: 8, 31: 64}, proto.Key{0: 16, 31: 64}
	now := time.Unix(1_800_000_000, 0)
	genuine := signedReceipt(f, relay, served.Public(), 1, now).Bytes()
	f.Add(genuine)
	f.Add(signedReceipt(f, relay, relay.Public(), 2, now).Bytes())
	f.Add(make([]byte, ReceiptLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseReceiptBytes(b)
		if err != nil {
			if r != nil {
				t.Fatal("error with a receipt")
			}
			return
		}
		if !bytes.Equal(r.Bytes(), b) {
			t.Fatalf("re-encodes differently")
		}
		back, err := ParseReceipt(r.String())
		if err != nil || !reflect.DeepEqual(back, r) {
			t.Fatalf("text round trip: %v", err)
		}
		// Only the genuine receipt verifies: a mutation is forged.
		if err := r.Check(now); err == nil && !bytes.Equal(b[:receiptBodyLen], genuine[:receiptBodyLen]) {
			t.Fatalf("a fuzzed receipt verifies: % x", b)
		}
	})
}

// A rotation statement verifies only for the successor it names, under
// the old key, unaltered.
func TestRotationStatement(t *testing.T) {
	old, _ := proto.GenerateKey()
	succ, _ := proto.GenerateKey()
	other, _ := proto.GenerateKey()
	r, err := SignRotation(old, succ.Public(), time.Unix(1764115200, 0))
	if err != nil {
		t.Fatal(err)
	}
	if r.Old != old.Public() || r.Time != 1764115200 || !VerifyRotation(r, succ.Public()) {
		t.Fatalf("genuine statement refused: %+v", r)
	}
	if VerifyRotation(r, other.Public()) {
		t.Fatal("statement accepted for another successor")
	}
	for i, alter := range []func(*proto.Rotation){
		func(r *proto.Rotation) { r.Time++ },
		func(r *proto.Rotation) { r.Signature[0] ^= 1 },
		func(r *proto.Rotation) { r.Old = other.Public() },
		func(r *proto.Rotation) { r.Old = proto.Key{} },
	} {
		a := r
		alter(&a)
		if VerifyRotation(a, succ.Public()) {
			t.Fatalf("altered statement %d accepted", i)
		}
	}
	self, _ := SignRotation(old, old.Public(), time.Now())
	if VerifyRotation(self, old.Public()) {
		t.Fatal("a key named as its own successor")
	}
}
