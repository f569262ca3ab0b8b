package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flynn/noise"
)

// The handshake is Noise IK (Noise_IK_25519_ChaChaPoly_BLAKE2s), the pattern
// WireGuard uses: the initiator knows the responder's static key, both sides
// authenticate, and message 1 already carries encrypted, authenticated data
// (our replay-protecting timestamp).
var suite = noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashBLAKE2s)

var prologue = []byte("mpdetour relay control v2")

// Limits on one session's life; after these the client hands shakes again.
const (
	// RekeyAfter is when a client starts a fresh handshake in the background.
	RekeyAfter = 120 * time.Second
	// SessionLifetime is when the relay forgets a session.
	SessionLifetime = 180 * time.Second
	// RejectAfterMessages bounds the counter far below nonce exhaustion.
	RejectAfterMessages = 1 << 60
)

// Timestamp is a TAI64N label: 8 bytes of seconds, 4 of nanoseconds. The
// relay keeps the latest one per member key and refuses initiations that do
// not move it forward, so a captured initiation cannot be replayed.
type Timestamp [12]byte

// TAI64N encodes t.
func TAI64N(t time.Time) Timestamp {
	var ts Timestamp
	binary.BigEndian.PutUint64(ts[:], uint64(1<<62)+uint64(t.Unix())+10)
	binary.BigEndian.PutUint32(ts[8:], uint32(t.Nanosecond()))
	return ts
}

// After reports whether ts is strictly later than o.
func (ts Timestamp) After(o Timestamp) bool { return bytes.Compare(ts[:], o[:]) > 0 }

func keypair(priv Key) noise.DHKey {
	pub := priv.Public()
	return noise.DHKey{Private: append([]byte(nil), priv[:]...), Public: pub[:]}
}

// Initiation is a client's handshake in progress.
type Initiation struct {
	hs     *noise.HandshakeState
	Index  uint32
	Packet []byte
}

// NewInitiation builds the first handshake message from the member's private
// key to the relay's public key.
func NewInitiation(priv, relayPub Key, index uint32, now time.Time) (*Initiation, error) {
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite:   suite,
		Pattern:       noise.HandshakeIK,
		Initiator:     true,
		Prologue:      prologue,
		StaticKeypair: keypair(priv),
		PeerStatic:    append([]byte(nil), relayPub[:]...),
	})
	if err != nil {
		return nil, err
	}
	payload := make([]byte, initPayloadLen)
	ts := TAI64N(now)
	copy(payload, ts[:])
	pkt := make([]byte, 8, InitLen)
	pkt[0], pkt[1] = TypeInit, Version
	binary.BigEndian.PutUint32(pkt[4:], index)
	pkt, _, _, err = hs.WriteMessage(pkt, payload)
	if err != nil {
		return nil, err
	}
	pkt = append(pkt, make([]byte, 2*macLen)...)
	setMAC1(pkt, relayPub)
	if len(pkt) != InitLen {
		return nil, fmt.Errorf("internal: initiation is %d bytes, want %d", len(pkt), InitLen)
	}
	return &Initiation{hs: hs, Index: index, Packet: pkt}, nil
}

// Finish consumes the relay's response and returns the session.
func (in *Initiation) Finish(resp Response) (*Session, error) {
	if resp.Receiver != in.Index {
		return nil, fmt.Errorf("handshake response for index %d, want %d", resp.Receiver, in.Index)
	}
	payload, cs1, cs2, err := in.hs.ReadMessage(nil, resp.Noise)
	if err != nil {
		return nil, fmt.Errorf("handshake response does not authenticate: %w", err)
	}
	if len(payload) != 0 || cs1 == nil {
		return nil, errors.New("handshake response: unexpected payload")
	}
	// cs1 encrypts initiator->responder, cs2 the other way.
	return newSession(in.Index, resp.Sender, cs1, cs2), nil
}

// Accepted is a relay's view of a valid initiation: who sent it and when.
// The relay checks Peer and Timestamp before calling Respond.
type Accepted struct {
	Peer      Key
	Timestamp Timestamp
	Sender    uint32
	hs        *noise.HandshakeState
}

// ConsumeInitiation authenticates an initiation with the relay's private key.
// Any key holder can produce one; the caller must check Peer membership.
func ConsumeInitiation(relayPriv Key, in Init) (*Accepted, error) {
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite:   suite,
		Pattern:       noise.HandshakeIK,
		Initiator:     false,
		Prologue:      prologue,
		StaticKeypair: keypair(relayPriv),
	})
	if err != nil {
		return nil, err
	}
	payload, _, _, err := hs.ReadMessage(nil, in.Noise)
	if err != nil {
		return nil, fmt.Errorf("initiation does not authenticate: %w", &Error{Reason: ReasonUnauthorized})
	}
	if len(payload) != initPayloadLen {
		return nil, malformed(0, "initiation payload of %d bytes", len(payload))
	}
	a := &Accepted{Sender: in.Sender, hs: hs}
	copy(a.Timestamp[:], payload)
	copy(a.Peer[:], hs.PeerStatic())
	return a, nil
}

// Respond writes the handshake response and returns the relay's session.
func (a *Accepted) Respond(index uint32) ([]byte, *Session, error) {
	pkt := make([]byte, 12, ResponseLen)
	pkt[0], pkt[1] = TypeResponse, Version
	binary.BigEndian.PutUint32(pkt[4:], index)
	binary.BigEndian.PutUint32(pkt[8:], a.Sender)
	pkt, cs1, cs2, err := a.hs.WriteMessage(pkt, nil)
	if err != nil {
		return nil, nil, err
	}
	if len(pkt) != ResponseLen || cs1 == nil {
		return nil, nil, fmt.Errorf("internal: response is %d bytes, want %d", len(pkt), ResponseLen)
	}
	return pkt, newSession(index, a.Sender, cs2, cs1), nil
}

// Session is one direction pair of transport keys with a replay window.
type Session struct {
	Local, Remote uint32 // our index and the peer's
	Created       time.Time
	send, recv    noise.Cipher

	mu      sync.Mutex
	counter uint64
	window  ReplayWindow
}

func newSession(local, remote uint32, send, recv *noise.CipherState) *Session {
	return &Session{Local: local, Remote: remote, Created: time.Now(), send: send.Cipher(), recv: recv.Cipher()}
}

// Seal encrypts a message into a transport packet for the peer.
func (s *Session) Seal(msg []byte) ([]byte, error) {
	s.mu.Lock()
	n := s.counter
	s.counter++
	s.mu.Unlock()
	if n >= RejectAfterMessages {
		return nil, errors.New("session exhausted: handshake again")
	}
	pkt := make([]byte, transportHdrLen, transportHdrLen+len(msg)+tagLen)
	pkt[0], pkt[1] = TypeTransport, Version
	binary.BigEndian.PutUint32(pkt[4:], s.Remote)
	binary.BigEndian.PutUint64(pkt[8:], n)
	return s.send.Encrypt(pkt, n, pkt[:transportHdrLen], msg), nil
}

// Open authenticates and decrypts a transport packet addressed to this
// session. A counter seen before, or too old for the window, is refused with
// ReasonReplay; a packet that does not authenticate with ReasonUnauthorized.
func (s *Session) Open(t Transport) ([]byte, error) {
	s.mu.Lock()
	fresh := s.window.Fresh(t.Counter)
	s.mu.Unlock()
	if !fresh {
		return nil, &Error{Reason: ReasonReplay}
	}
	msg, err := s.recv.Decrypt(nil, t.Counter, t.Header, t.Ciphertext)
	if err != nil {
		return nil, &Error{Reason: ReasonUnauthorized}
	}
	s.mu.Lock()
	ok := s.window.Accept(t.Counter)
	s.mu.Unlock()
	if !ok {
		return nil, &Error{Reason: ReasonReplay}
	}
	return msg, nil
}

// WindowSize is how far behind the highest counter seen a packet may arrive.
const WindowSize = 1024

// ReplayWindow tracks received counters (RFC 6479 style bitmap).
type ReplayWindow struct {
	top  uint64 // highest counter accepted + 1 (0 = nothing yet)
	bits [WindowSize / 64]uint64
}

// Fresh reports whether n could be accepted (not seen, not too old).
func (w *ReplayWindow) Fresh(n uint64) bool {
	if n >= RejectAfterMessages {
		return false
	}
	if n >= w.top {
		return true
	}
	if w.top-n > WindowSize-64 {
		return false
	}
	i := n % WindowSize
	return w.bits[i/64]&(1<<(i%64)) == 0
}

// Accept records n; it returns false if n is not fresh.
func (w *ReplayWindow) Accept(n uint64) bool {
	if !w.Fresh(n) {
		return false
	}
	if n >= w.top {
		// Clear the words that slide out of the window.
		if w.top > 0 {
			cur, next := (w.top-1)/64, n/64
			words := uint64(len(w.bits))
			if next-cur >= words {
				w.bits = [WindowSize / 64]uint64{}
			} else {
				for i := cur + 1; i <= next; i++ {
					w.bits[i%words] = 0
				}
			}
		}
		w.top = n + 1
	}
	i := n % WindowSize
	w.bits[i/64] |= 1 << (i % 64)
	return true
}
