package collective

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"errors"

	"filippo.io/edwards25519"
	"filippo.io/edwards25519/field"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// XEdDSA (Signal's specification, https://signal.org/docs/specifications/xeddsa/)
// lets a relay sign with the Curve25519 key it already has: its control-
// protocol key, the one its collective certificate names. A second
// (Ed25519) key would need its own certificate binding it to the member,
// which the certificate format does not carry. No maintained Go package
// implements XEdDSA; it is a few lines over filippo.io/edwards25519 (the
// Go standard library's own curve code, published as a module), and the
// signatures it makes are plain Ed25519 signatures under the converted
// public key, so verification is crypto/ed25519's.

var errXEdDSAKey = errors.New("not a valid Curve25519 public key for XEdDSA")

// XEdSign signs msg with the Curve25519 private key priv (XEdDSA).
func XEdSign(priv proto.Key, msg []byte) ([ed25519.SignatureSize]byte, error) {
	var sig [ed25519.SignatureSize]byte
	k, err := edwards25519.NewScalar().SetBytesWithClamping(priv[:])
	if err != nil {
		return sig, err
	}
	// calculate_key_pair: A = kB with its sign bit cleared, a = ±k to match.
	E := new(edwards25519.Point).ScalarBaseMult(k)
	A := E.Bytes()
	a := k
	if A[31]&0x80 != 0 {
		a = edwards25519.NewScalar().Negate(k)
		A[31] &= 0x7f
	}
	var Z [64]byte
	if _, err := rand.Read(Z[:]); err != nil {
		return sig, err
	}
	// r = hash1(a || M || Z): hash_1 prefixes 0xFE followed by 31 0xFF bytes.
	h := sha512.New()
	prefix := [32]byte{0: 0xfe}
	for i := 1; i < 32; i++ {
		prefix[i] = 0xff
	}
	h.Write(prefix[:])
	h.Write(a.Bytes())
	h.Write(msg)
	h.Write(Z[:])
	r, err := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))
	if err != nil {
		return sig, err
	}
	R := new(edwards25519.Point).ScalarBaseMult(r).Bytes()
	h.Reset()
	h.Write(R)
	h.Write(A)
	h.Write(msg)
	hs, err := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))
	if err != nil {
		return sig, err
	}
	s := edwards25519.NewScalar().MultiplyAdd(hs, a, r)
	copy(sig[:32], R)
	copy(sig[32:], s.Bytes())
	return sig, nil
}

// EdwardsOf converts a Curve25519 (Montgomery u) public key to the Edwards
// public key XEdDSA verifies against: y = (u-1)/(u+1), sign bit 0.
func EdwardsOf(pub proto.Key) ([]byte, error) {
	if pub[31]&0x80 != 0 {
		return nil, errXEdDSAKey
	}
	u, err := new(field.Element).SetBytes(pub[:])
	if err != nil {
		return nil, errXEdDSAKey
	}
	if [32]byte(u.Bytes()) != [32]byte(pub) { // not canonical (u >= p)
		return nil, errXEdDSAKey
	}
	one := new(field.Element).One()
	den := new(field.Element).Add(u, one)
	if den.Equal(new(field.Element).Zero()) == 1 { // u = -1 has no Edwards point
		return nil, errXEdDSAKey
	}
	y := new(field.Element).Multiply(new(field.Element).Subtract(u, one), new(field.Element).Invert(den))
	A := y.Bytes()
	if _, err := new(edwards25519.Point).SetBytes(A); err != nil {
		return nil, errXEdDSAKey // not on the curve
	}
	return A, nil
}

// XEdVerify checks an XEdDSA signature by the Curve25519 public key pub.
func XEdVerify(pub proto.Key, msg []byte, sig []byte) bool {
	A, err := EdwardsOf(pub)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return false
	}
	return ed25519.Verify(ed25519.PublicKey(A), msg, sig)
}
