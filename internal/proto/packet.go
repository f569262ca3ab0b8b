package proto

import (
	"encoding/binary"
	"fmt"
)

// Packet types (first byte of every v2 datagram). Part of the wire format.
const (
	TypeInit        = 1 // handshake initiation: Noise IK message 1
	TypeResponse    = 2 // handshake response: Noise IK message 2
	TypeError       = 3 // cleartext refusal before a session can carry it
	TypeTransport   = 4 // encrypted request or reply
	TypeCookieReply = 5 // the relay is under load: prove your address (cookie.go)
)

// Packet layout (big-endian):
//
//	init:      type:u8 version:u8 reserved:u16 sender:u32 noise1[initNoiseLen] mac1[16] mac2[16]
//	response:  type:u8 version:u8 reserved:u16 sender:u32 receiver:u32 noise2[respNoiseLen]
//	error:     type:u8 version:u8 reason:u8 reserved:u8 index:u32 counter:u64
//	transport: type:u8 version:u8 reserved:u16 receiver:u32 counter:u64 ciphertext
//	cookie:    type:u8 version:u8 reserved:u16 receiver:u32 nonce[24] sealed_cookie[32]
//
// Sizes are fixed so that a relay's answer to an unproven address is never
// larger than what it received: init is 200 bytes, response 60, cookie reply
// 64, error 16.
const (
	initPayloadLen  = 64                                   // TAI64N timestamp + zero padding
	initNoiseLen    = 32 + (32 + 16) + initPayloadLen + 16 // e, encrypted s, encrypted payload
	InitLen         = 8 + initNoiseLen + 2*macLen
	respNoiseLen    = 32 + 16 // e, empty encrypted payload
	ResponseLen     = 12 + respNoiseLen
	ErrorLen        = 16
	transportHdrLen = 16
	tagLen          = 16
	// MaxPacketLen bounds every datagram we accept (roster replies are
	// the largest messages; requests are still bounded by MaxMessageLen).
	MaxPacketLen = transportHdrLen + MaxReplyLen + tagLen
)

// Init is a parsed (still encrypted) handshake initiation.
type Init struct {
	Sender uint32
	Noise  []byte
}

// Response is a parsed (still encrypted) handshake response.
type Response struct {
	Sender, Receiver uint32
	Noise            []byte
}

// ErrorPacket is a cleartext refusal. Index echoes the index the refused
// packet carried (the sender index of an init, the receiver index of a
// transport packet) and Counter the transport counter, so the client can match
// it. Being unauthenticated, clients treat it only as a hint.
type ErrorPacket struct {
	Reason  Reason
	Index   uint32
	Counter uint64
}

// Transport is a parsed (still encrypted) transport packet.
type Transport struct {
	Receiver   uint32
	Counter    uint64
	Header     []byte // authenticated as additional data
	Ciphertext []byte
}

// PacketType returns the type of a datagram after checking the common header.
// The error wraps a *Error with ReasonMalformed or ReasonBadVersion.
func PacketType(b []byte) (byte, error) {
	if len(b) < 8 {
		return 0, malformed(0, "datagram of %d bytes is too short", len(b))
	}
	if len(b) > MaxPacketLen && b[0] != TypeInit {
		return 0, malformed(0, "datagram of %d bytes is too long", len(b))
	}
	if b[1] != Version {
		return b[0], fmt.Errorf("packet version %d: %w", b[1], &Error{Reason: ReasonBadVersion})
	}
	switch b[0] {
	case TypeInit, TypeResponse, TypeError, TypeTransport, TypeCookieReply:
		return b[0], nil
	}
	return b[0], malformed(0, "unknown packet type %d", b[0])
}

// ParseInit parses an initiation datagram.
func ParseInit(b []byte) (Init, error) {
	if len(b) != InitLen || b[0] != TypeInit {
		return Init{}, malformed(0, "initiation of %d bytes, want %d", len(b), InitLen)
	}
	if b[1] != Version {
		return Init{}, &Error{Reason: ReasonBadVersion}
	}
	return Init{Sender: binary.BigEndian.Uint32(b[4:]), Noise: b[8 : 8+initNoiseLen]}, nil
}

// ParseResponse parses a handshake response datagram.
func ParseResponse(b []byte) (Response, error) {
	if len(b) != ResponseLen || b[0] != TypeResponse || b[1] != Version {
		return Response{}, fmt.Errorf("handshake response of %d bytes (type %d), want %d bytes", len(b), typeOf(b), ResponseLen)
	}
	return Response{
		Sender:   binary.BigEndian.Uint32(b[4:]),
		Receiver: binary.BigEndian.Uint32(b[8:]),
		Noise:    b[12:],
	}, nil
}

// ParseError parses a cleartext refusal.
func ParseError(b []byte) (ErrorPacket, error) {
	if len(b) != ErrorLen || b[0] != TypeError || b[1] != Version {
		return ErrorPacket{}, fmt.Errorf("error packet of %d bytes (type %d), want %d bytes", len(b), typeOf(b), ErrorLen)
	}
	return ErrorPacket{
		Reason:  Reason(b[2]),
		Index:   binary.BigEndian.Uint32(b[4:]),
		Counter: binary.BigEndian.Uint64(b[8:]),
	}, nil
}

// MarshalError encodes a cleartext refusal.
func MarshalError(e ErrorPacket) []byte {
	b := make([]byte, ErrorLen)
	b[0], b[1], b[2] = TypeError, Version, byte(e.Reason)
	binary.BigEndian.PutUint32(b[4:], e.Index)
	binary.BigEndian.PutUint64(b[8:], e.Counter)
	return b
}

// ParseTransport parses a transport datagram.
func ParseTransport(b []byte) (Transport, error) {
	if len(b) < transportHdrLen+tagLen || len(b) > MaxPacketLen || b[0] != TypeTransport {
		return Transport{}, malformed(0, "transport packet of %d bytes (type %d)", len(b), typeOf(b))
	}
	if b[1] != Version {
		return Transport{}, &Error{Reason: ReasonBadVersion}
	}
	return Transport{
		Receiver:   binary.BigEndian.Uint32(b[4:]),
		Counter:    binary.BigEndian.Uint64(b[8:]),
		Header:     b[:transportHdrLen],
		Ciphertext: b[transportHdrLen:],
	}, nil
}

func typeOf(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}
