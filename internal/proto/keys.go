package proto

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"golang.org/x/crypto/curve25519"
)

// KeyLen is the length of a Curve25519 key.
const KeyLen = 32

// Key is a Curve25519 private or public key. Its text form is standard
// base64 (44 characters), as WireGuard writes keys, so operators can use the
// tools and habits they already have.
type Key [KeyLen]byte

// ParseKey decodes a base64 key.
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return k, fmt.Errorf("key %q is not base64: %w", abbreviate(s), err)
	}
	if len(b) != KeyLen {
		return k, fmt.Errorf("key %q decodes to %d bytes, want %d", abbreviate(s), len(b), KeyLen)
	}
	copy(k[:], b)
	if k.IsZero() {
		return k, fmt.Errorf("key is all zeros")
	}
	return k, nil
}

func abbreviate(s string) string {
	if len(s) > 12 {
		return s[:12] + "..."
	}
	return s
}

// GenerateKey returns a new random private key, clamped as X25519 expects.
func GenerateKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return k, err
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, nil
}

// Public derives the public key from a private key.
func (k Key) Public() Key {
	var pub Key
	b, err := curve25519.X25519(k[:], curve25519.Basepoint)
	if err != nil {
		// Only a low-order input makes X25519 fail; with the base point it
		// cannot happen.
		panic(err)
	}
	copy(pub[:], b)
	return pub
}

// String returns the base64 form.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// IsZero reports whether k is unset.
func (k Key) IsZero() bool { return k == Key{} }

// ID is a short, stable identifier of a public key for logs and metrics: it
// names a member without printing its whole key.
func (k Key) ID() string {
	h := sha256.Sum256(k[:])
	return base64.RawURLEncoding.EncodeToString(h[:6])
}

// MarshalText implements encoding.TextMarshaler.
func (k Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (k *Key) UnmarshalText(b []byte) error {
	v, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}
