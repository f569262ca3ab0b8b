package roster

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"errors"

	"filippo.io/edwards25519"
	"filippo.io/edwards25519/field"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// Roster entries are signed with the relay's control-protocol key, the
// Curve25519 key its collective certificate names, so that no second key
// (and no change to the certificate format) is needed: a certificate with
// the role relay vouches for exactly the key that signs the entry and that
// the agent's Noise handshake later authenticates.
//
// A Curve25519 (X25519) key cannot sign with Ed25519 as such; XEdDSA
// (Signal's specification, https://signal.org/docs/specifications/xeddsa/)
// turns it into an Ed25519-compatible signing key: the clamped X25519
// scalar a gives the Edwards point A = aB; if A's sign bit is set, -a is
// used instead, so the public key is the Edwards form of the Montgomery u
// coordinate with sign bit 0. Verification converts u to that Edwards
// point (y = (u-1)/(u+1)) and is plain Ed25519 (crypto/ed25519.Verify).
//
// Written here (about 40 lines on filippo.io/edwards25519, the group
// arithmetic behind Go's own crypto/ed25519) because no maintained Go
// package offers XEdDSA; only the scalar arithmetic of signing is ours,
// verification is the standard library's.

// xSign signs msg with the X25519 private key priv (XEdDSA).
func xSign(priv proto.Key, msg []byte) ([]byte, error) {
	var a edwards25519.Scalar
	if _, err := a.SetBytesWithClamping(priv[:]); err != nil {
		return nil, err
	}
	A := new(edwards25519.Point).ScalarBaseMult(&a)
	ab := A.Bytes()
	if ab[31]&0x80 != 0 {
		a.Negate(&a) // -A has the same y and sign bit 0
		ab[31] &= 0x7f
	}
	var z [64]byte
	if _, err := rand.Read(z[:]); err != nil {
		return nil, err
	}
	// r = hash1(a || M || Z): XEdDSA's domain-separated nonce hash.
	h := sha512.New()
	prefix := [32]byte{0: 0xfe}
	for i := 1; i < 32; i++ {
		prefix[i] = 0xff
	}
	h.Write(prefix[:])
	h.Write(a.Bytes())
	h.Write(msg)
	h.Write(z[:])
	r, err := new(edwards25519.Scalar).SetUniformBytes(h.Sum(nil))
	if err != nil {
		return nil, err
	}
	R := new(edwards25519.Point).ScalarBaseMult(r)
	h.Reset()
	h.Write(R.Bytes())
	h.Write(ab)
	h.Write(msg)
	k, err := new(edwards25519.Scalar).SetUniformBytes(h.Sum(nil))
	if err != nil {
		return nil, err
	}
	s := new(edwards25519.Scalar).MultiplyAdd(k, &a, r)
	return append(R.Bytes(), s.Bytes()...), nil
}

var errBadKey = errors.New("public key is not a canonical Curve25519 u-coordinate")

// edwardsKey is the Ed25519 public key (sign bit 0) of the X25519 public
// key pub.
func edwardsKey(pub proto.Key) (ed25519.PublicKey, error) {
	if pub[31]&0x80 != 0 {
		return nil, errBadKey
	}
	u, err := new(field.Element).SetBytes(pub[:])
	if err != nil || [32]byte(u.Bytes()) != [32]byte(pub) {
		return nil, errBadKey // u >= p
	}
	one := new(field.Element).One()
	den := new(field.Element).Add(u, one)
	if den.Equal(new(field.Element).Zero()) == 1 {
		return nil, errBadKey // u = -1 has no Edwards image
	}
	y := new(field.Element).Multiply(new(field.Element).Subtract(u, one), new(field.Element).Invert(den))
	return ed25519.PublicKey(y.Bytes()), nil
}

// xVerify checks an XEdDSA signature by the X25519 public key pub.
func xVerify(pub proto.Key, msg, sig []byte) bool {
	if len(sig) != ed25519.SignatureSize {
		return false
	}
	A, err := edwardsKey(pub)
	if err != nil {
		return false
	}
	return ed25519.Verify(A, msg, sig)
}
