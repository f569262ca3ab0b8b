package proto

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
)

// Denial-of-service protection, as in WireGuard (whitepaper sec. 5.4.4 and
// 5.4.7): every initiation ends with two 16-byte MACs.
//
//	mac1 = MAC(HASH("mac1----" || relay public key), init up to mac1)
//	mac2 = MAC(cookie, init up to mac2), or zeros without a cookie
//
// mac1 lets the relay drop datagrams from senders that do not even know its
// public key before spending a Diffie-Hellman on them. Under load, the relay
// processes only initiations whose mac2 proves the sender received a cookie
// at its source address (a spoofed source never does); the others get a
// cookie reply instead (64 bytes, smaller than the 200-byte initiation, so
// it amplifies nothing):
//
//	cookie reply: type:u8 version:u8 reserved:u16 receiver:u32 nonce[24] sealed_cookie[32]
//	cookie = MAC(secret, source address || source port), secret rotated every 2 minutes
//	sealed_cookie = XChaCha20Poly1305(HASH("cookie--" || relay public key), nonce, cookie, ad = mac1)
//
// The client that gets a cookie reply for its pending initiation sends a new
// initiation at once, with mac2. Binding the seal to mac1 means only the
// sender of that initiation (or someone who saw it) can open the cookie.
// MAC is keyed BLAKE2s-128, HASH BLAKE2s-256, as WireGuard.
const (
	macLen          = 16
	CookieReplyLen  = 8 + chacha20poly1305.NonceSizeX + macLen + chacha20poly1305.Overhead
	CookieLifetime  = 120 * time.Second // how long a relay's secret (and a client's cookie) is good for
	cookieMACOffset = InitLen - 2*macLen
)

// Cookie is what a relay hands a source address under load.
type Cookie [macLen]byte

func labelHash(label string, pub Key) [32]byte {
	return blake2s.Sum256(append([]byte(label), pub[:]...))
}

func mac(key []byte, msg []byte) [macLen]byte {
	h, err := blake2s.New128(key)
	if err != nil {
		panic(err) // keys here are always 16 or 32 bytes
	}
	h.Write(msg)
	var out [macLen]byte
	copy(out[:], h.Sum(nil))
	return out
}

// setMAC1 fills in an initiation's mac1 (and clears mac2).
func setMAC1(pkt []byte, relayPub Key) {
	k := labelHash("mac1----", relayPub)
	m := mac(k[:], pkt[:cookieMACOffset])
	copy(pkt[cookieMACOffset:], m[:])
	clear(pkt[cookieMACOffset+macLen:])
}

// mac1 returns the initiation's mac1 field.
func mac1(pkt []byte) []byte { return pkt[cookieMACOffset : cookieMACOffset+macLen] }

// WithCookie returns a copy of the initiation packet carrying mac2 for
// cookie. The Noise part is unchanged, so Finish still works.
func (in *Initiation) WithCookie(c Cookie) []byte {
	pkt := append([]byte(nil), in.Packet...)
	m := mac(c[:], pkt[:InitLen-macLen])
	copy(pkt[InitLen-macLen:], m[:])
	return pkt
}

// OpenCookieReply returns the cookie in a reply to this initiation.
func (in *Initiation) OpenCookieReply(relayPub Key, r CookieReply) (Cookie, error) {
	var c Cookie
	if r.Receiver != in.Index {
		return c, fmt.Errorf("cookie reply for index %d, want %d", r.Receiver, in.Index)
	}
	k := labelHash("cookie--", relayPub)
	aead, err := chacha20poly1305.NewX(k[:])
	if err != nil {
		return c, err
	}
	plain, err := aead.Open(nil, r.Nonce[:], r.Sealed[:], mac1(in.Packet))
	if err != nil || len(plain) != macLen {
		return c, errors.New("cookie reply does not authenticate")
	}
	copy(c[:], plain)
	return c, nil
}

// CookieReply is a parsed cookie reply.
type CookieReply struct {
	Receiver uint32
	Nonce    [chacha20poly1305.NonceSizeX]byte
	Sealed   [macLen + chacha20poly1305.Overhead]byte
}

// ParseCookieReply parses a cookie reply datagram.
func ParseCookieReply(b []byte) (CookieReply, error) {
	var r CookieReply
	if len(b) != CookieReplyLen || b[0] != TypeCookieReply || b[1] != Version {
		return r, fmt.Errorf("cookie reply of %d bytes (type %d), want %d bytes", len(b), typeOf(b), CookieReplyLen)
	}
	r.Receiver = binary.BigEndian.Uint32(b[4:])
	copy(r.Nonce[:], b[8:])
	copy(r.Sealed[:], b[8+len(r.Nonce):])
	return r, nil
}

// CookieJar is the relay's side: it checks mac1 and mac2 and writes cookie
// replies. Safe for concurrent use.
type CookieJar struct {
	mac1Key   [32]byte
	sealKey   [32]byte
	mu        sync.Mutex
	secret    [32]byte
	prev      [32]byte
	hasPrev   bool
	rotatedAt time.Time
}

// NewCookieJar makes a jar for the relay with public key pub.
func NewCookieJar(pub Key) *CookieJar {
	j := &CookieJar{mac1Key: labelHash("mac1----", pub), sealKey: labelHash("cookie--", pub)}
	return j
}

// CheckMAC1 reports whether an initiation's mac1 is right; a packet that
// fails was not made by someone who knows the relay's public key.
func (j *CookieJar) CheckMAC1(pkt []byte) bool {
	if len(pkt) != InitLen {
		return false
	}
	m := mac(j.mac1Key[:], pkt[:cookieMACOffset])
	return hmac.Equal(m[:], mac1(pkt))
}

// secrets returns the current and previous secret, rotating at now.
func (j *CookieJar) secrets(now time.Time) (cur, prev [32]byte, hasPrev bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.rotatedAt.IsZero() || now.Sub(j.rotatedAt) >= CookieLifetime {
		// The old secret still counts only if it was in use up to now: a
		// jar idle for longer (no load for a while) forgets it, so a
		// cookie from an earlier episode never proves a current address.
		j.prev, j.hasPrev = j.secret, !j.rotatedAt.IsZero() && now.Sub(j.rotatedAt) < 2*CookieLifetime
		if _, err := rand.Read(j.secret[:]); err != nil {
			panic(err) // crypto/rand does not fail on Linux
		}
		j.rotatedAt = now
	}
	return j.secret, j.prev, j.hasPrev
}

func cookieFor(secret [32]byte, src netip.AddrPort) Cookie {
	a := src.Addr().Unmap().As16()
	var b [18]byte
	copy(b[:], a[:])
	binary.BigEndian.PutUint16(b[16:], src.Port())
	return mac(secret[:], b[:])
}

// CheckMAC2 reports whether an initiation carries a valid mac2 for a
// cookie this relay gave src within the last CookieLifetime or so.
func (j *CookieJar) CheckMAC2(pkt []byte, src netip.AddrPort, now time.Time) bool {
	if len(pkt) != InitLen {
		return false
	}
	cur, prev, hasPrev := j.secrets(now)
	got := pkt[InitLen-macLen:]
	for i, s := range [][32]byte{cur, prev} {
		if i == 1 && !hasPrev {
			break
		}
		c := cookieFor(s, src)
		m := mac(c[:], pkt[:InitLen-macLen])
		if hmac.Equal(m[:], got) {
			return true
		}
	}
	return false
}

// Reply writes a cookie reply to the initiation pkt (whose mac1 was checked)
// from src.
func (j *CookieJar) Reply(pkt []byte, src netip.AddrPort, now time.Time) ([]byte, error) {
	if len(pkt) != InitLen {
		return nil, errors.New("not an initiation")
	}
	cur, _, _ := j.secrets(now)
	c := cookieFor(cur, src)
	aead, err := chacha20poly1305.NewX(j.sealKey[:])
	if err != nil {
		return nil, err
	}
	var nonce [chacha20poly1305.NonceSizeX]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	out := make([]byte, 8, CookieReplyLen)
	out[0], out[1] = TypeCookieReply, Version
	copy(out[4:8], pkt[4:8]) // the initiation's sender index
	out = append(out, nonce[:]...)
	return aead.Seal(out, nonce[:], c[:], mac1(pkt)), nil
}
