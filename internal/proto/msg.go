package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Version is the protocol version carried by every packet and message of
// the authenticated protocol ("v2" in the docs). Version 1 is the
// unauthenticated legacy format (legacy.go); 2 was the first authenticated
// one; 3 added mac1/mac2 to initiations (200 bytes) and cookie replies, so
// a peer of the other generation gets a clear bad-version instead of
// silence.
const Version = 3

// Op is a request type.
type Op uint8

// Operations. Values are part of the wire format: never renumber.
const (
	OpPing    Op = 1  // liveness; no body
	OpGrant   Op = 2  // NAT detour toward a server
	OpRenew   Op = 3  // extend the lease of a granted port
	OpRelease Op = 4  // drop a granted port
	OpTunnel  Op = 5  // allocate a tunnel address (tunnel detours)
	OpConvert Op = 6  // converter tickets (RFC 8803 converter on the relay, internal/convert)
	OpCertify Op = 7  // present a collective member certificate (internal/collective)
	OpReceipt Op = 8  // present a usage receipt a relay issued (fair sharing, internal/collective)
	OpEncap   Op = 9  // open/renew or release an unencrypted VXLAN tunnel (docs/tunnel.md)
	OpRoster  Op = 10 // a page of the collective's relay roster (internal/roster)
	OpRotate  Op = 11 // carry the member state of an old member key over to this session's key
)

// RotateSigLen is the length of a rotation statement's signature (XEdDSA,
// collective.SignRotation).
const RotateSigLen = 64

// Rotation is OpRotate's body: the session's key asks the relay to carry
// the state of the member key Old over to it; Time (Unix seconds) and
// Signature are the old key's statement that the session's key is its
// successor (collective.SignRotation / VerifyRotation).
type Rotation struct {
	Old       Key
	Time      uint64
	Signature [RotateSigLen]byte
}

// Encap request actions (Request.Action for OpEncap).
const (
	EncapOpen    uint8 = 1 // allocate or renew (the lease restarts)
	EncapRelease uint8 = 2 // tear the member's encapsulation down now
)

// Roster pages: at most MaxRosterPage entries of 1..MaxRosterEntry bytes
// (the binary form of roster.Entry, opaque here) in one reply.
const (
	MaxRosterPage  = 8
	MaxRosterEntry = 512
)

// RosterPage is a roster reply: entries Start.. of Total, in the relay's
// order. Digest (0: the relay sent none, an older relay) fingerprints the
// whole roster the page was cut from: a client that asks with the digest
// it holds (Request.Have) gets a page without entries when nothing
// changed, and a client reading several pages sees whether the roster
// changed between them.
type RosterPage struct {
	Total   uint16
	Start   uint16
	Entries [][]byte
	Digest  uint64
}

// MaxTickets bounds the converter tickets one request asks for (a convert
// reply with 32 tickets is 544 bytes, one of the replies allowed up to
// MaxReplyLen); TicketLen is a ticket's size. Relays before this bound
// was raised from 8 refuse larger requests as malformed (docs/convert.md).
const (
	MaxTickets = 32
	TicketLen  = 16
)

// LegacyMaxTickets is the bound of relays before MaxTickets was raised.
const LegacyMaxTickets = 8

func (o Op) String() string {
	switch o {
	case OpPing:
		return "ping"
	case OpGrant:
		return "grant"
	case OpRenew:
		return "renew"
	case OpRelease:
		return "release"
	case OpTunnel:
		return "tunnel"
	case OpConvert:
		return "convert"
	case OpCertify:
		return "certify"
	case OpReceipt:
		return "receipt"
	case OpEncap:
		return "encap"
	case OpRoster:
		return "roster"
	case OpRotate:
		return "rotate"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Reason is the result code of a request. Values and names are stable: they
// appear on the wire, in logs and in metrics labels.
type Reason uint8

// Result codes.
const (
	OK                   Reason = 0
	ReasonUnauthorized   Reason = 1  // unknown key, or the packet does not authenticate
	ReasonQuota          Reason = 2  // per-member or global mapping quota reached
	ReasonPolicyDenied   Reason = 3  // destination address or port refused by policy
	ReasonNoPorts        Reason = 4  // no free detour port
	ReasonRateLimited    Reason = 5  // too many requests from this member or address
	ReasonReplay         Reason = 6  // replayed handshake or transport counter
	ReasonMalformed      Reason = 7  // message does not parse
	ReasonBadVersion     Reason = 8  // unsupported protocol version
	ReasonNotFound       Reason = 9  // renew/release of a port this member does not hold
	ReasonUnsupported    Reason = 10 // operation not offered by this relay (e.g. tunnels)
	ReasonNoSession      Reason = 11 // transport message for an unknown or expired session
	ReasonAddressChanged Reason = 12 // transport message from an address other than the handshake's
	ReasonInternal       Reason = 13 // relay-side failure (e.g. nftables error)
	ReasonCapacity       Reason = 14 // relay at capacity and members with more credit hold it
	ReasonExpired        Reason = 15 // a receipt (or certificate) too old or not yet valid
)

var reasonNames = map[Reason]string{
	OK:                   "ok",
	ReasonUnauthorized:   "unauthorized",
	ReasonQuota:          "quota",
	ReasonPolicyDenied:   "policy-denied",
	ReasonNoPorts:        "no-ports",
	ReasonRateLimited:    "rate-limited",
	ReasonReplay:         "replay",
	ReasonMalformed:      "malformed",
	ReasonBadVersion:     "bad-version",
	ReasonNotFound:       "not-found",
	ReasonUnsupported:    "unsupported",
	ReasonNoSession:      "no-session",
	ReasonAddressChanged: "address-changed",
	ReasonInternal:       "internal",
	ReasonCapacity:       "capacity",
	ReasonExpired:        "expired",
}

// Known reports whether r is a code this version defines (a peer may send
// others; logs and metric labels bound them).
func (r Reason) Known() bool {
	_, ok := reasonNames[r]
	return ok
}

func (r Reason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Error is a refusal as seen by a client: it carries the stable code.
type Error struct {
	Op     Op
	Reason Reason
}

func (e *Error) Error() string {
	if e.Op == 0 {
		return fmt.Sprintf("relay refused: %s", e.Reason)
	}
	return fmt.Sprintf("relay refused %s: %s", e.Op, e.Reason)
}

// ReasonOf returns the refusal code in err's chain, or OK if none.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return OK
}

// Request is a decoded client request.
type Request struct {
	Op Op
	ID uint32 // chosen by the client to match the reply; retransmissions reuse it
	// Grant: the server to reach and the detour port the client proposes
	// (0 = any). Renew/Release: Port is the granted detour port.
	Server netip.AddrPort
	Port   uint16
	// Convert: how many tickets (1..MaxTickets).
	Count uint8
	// Certify: the member certificate, binary form (collective.Certificate.Bytes).
	Cert []byte
	// Receipt: a usage receipt, binary form (collective.Receipt.Bytes).
	Receipt []byte
	// Encap: EncapOpen or EncapRelease.
	Action uint8
	// Roster: index of the first entry wanted, and the digest of the
	// roster the client holds (0: none; RosterPage.Digest). A request
	// with Have != 0 or HasDigest set asks for the digest in the reply;
	// an older relay refuses it as malformed and the client asks again
	// without.
	Start     uint16
	Have      uint64
	HasDigest bool
	// Rotate: the old key and its signed statement.
	Rotate Rotation
}

// Reply is a decoded relay reply.
type Reply struct {
	Op     Op
	ID     uint32
	Reason Reason
	// Grant: where to connect (relay data-plane address and granted port).
	Detour netip.AddrPort
	// Grant, Renew, Tunnel: lease length.
	Lease time.Duration
	// Release: bytes counted on the mapping so far (both directions).
	Bytes uint64
	// Tunnel: see TunnelGrant.
	Tunnel TunnelGrant
	// Convert: the converter's address and single-use tickets (valid for
	// Lease, from the address this session's requests come from).
	Converter netip.AddrPort
	Tickets   [][TicketLen]byte
	// Receipt: the presenting member's credit at this relay afterwards,
	// in bytes (negative: it consumed more than it contributed).
	Credit int64
	// Encap: see EncapGrant (zero in the reply to a release).
	Encap EncapGrant
	// Roster: one page of signed roster entries.
	Roster RosterPage
}

// EncapGrant is an unencrypted VXLAN tunnel (opt-in on both sides, trusted
// networks only): the client's inner address, the relay's inner address
// (next hop), the relay's VXLAN endpoint, the member address the relay
// accepts encapsulated packets from (the control session's source: the
// client must send from it), the VNI and the inner MTU.
type EncapGrant struct {
	ClientPrefix netip.Prefix
	Gateway      netip.Addr
	Endpoint     netip.AddrPort
	Member       netip.Addr
	VNI          uint32 // 1..2^24-1
	MTU          uint16
}

// TunnelGrant is what a client needs to bring up a tunnel detour: its own
// tunnel address and the relay's WireGuard endpoint and key. The client's
// WireGuard key is its control-protocol static key (the member key).
type TunnelGrant struct {
	ClientPrefix netip.Prefix // the client's tunnel address and prefix length
	Endpoint     netip.AddrPort
	PublicKey    Key // the relay's WireGuard public key
}

// Message layout (inside an encrypted transport packet; big-endian):
//
//	request: version:u8 op:u8 reserved:u16 id:u32 body
//	  grant:   addr port:u16 proposed:u16
//	  renew:   port:u16
//	  release: port:u16
//	  convert: count:u8 (1..8)
//	  certify: certificate (binary form, 1..MaxMessageLen-8 bytes)
//	  receipt: usage receipt (binary form, 1..MaxMessageLen-8 bytes)
//	  encap:   action:u8 (1 open/renew, 2 release)
//	  roster:  start:u16 (index of the first entry wanted) [have:u64 (digest held, 0 none)]
//	  rotate:  old_key[32] time:u64 signature[64] (exactly 104 bytes)
//	  ping, tunnel: empty
//	reply:   version:u8 op:u8 reason:u8 reserved:u8 id:u32 body (empty unless reason=ok)
//	  grant:   addr port:u16 lease_s:u32
//	  renew:   lease_s:u32
//	  release: bytes:u64
//	  tunnel:  prefix_addr prefix_len:u8 endpoint_addr endpoint_port:u16 pubkey[32] lease_s:u32
//	  convert: addr port:u16 lease_s:u32 count:u8 tickets[count][16]
//	  receipt: credit:i64 (bytes)
//	  encap:   empty (release) or prefix_addr prefix_len:u8 gateway_addr endpoint_addr
//	           endpoint_port:u16 member_addr vni:u32 mtu:u16 lease_s:u32
//	  roster:  total:u16 start:u16 count:u8 (len:u16 entry[len])*count [digest:u64]
//	           (count <= MaxRosterPage, 1 <= len <= MaxRosterEntry, start+count <= total;
//	           the digest when the request carried have, nonzero; count 0 and
//	           digest = have: unchanged)
//	addr = family:u8 (4 or 6) + 4 or 16 bytes
const msgHeaderLen = 8

// rotateBodyLen is OpRotate's body: old key, time, signature.
const rotateBodyLen = KeyLen + 8 + RotateSigLen

// MaxMessageLen bounds any request and every reply but roster pages;
// larger input is refused.
const MaxMessageLen = 256

// MaxReplyLen bounds roster and convert replies (the only larger ones):
// it keeps a transport packet within 1,280 bytes with IPv6 and UDP headers.
const MaxReplyLen = 1200

// MarshalRequest encodes r.
func MarshalRequest(r Request) ([]byte, error) {
	b := make([]byte, msgHeaderLen, 32)
	b[0] = Version
	b[1] = byte(r.Op)
	binary.BigEndian.PutUint32(b[4:], r.ID)
	switch r.Op {
	case OpPing, OpTunnel:
	case OpGrant:
		if !r.Server.IsValid() || r.Server.Port() == 0 {
			return nil, fmt.Errorf("grant needs a server address and port, got %v", r.Server)
		}
		b = appendAddr(b, r.Server.Addr())
		b = binary.BigEndian.AppendUint16(b, r.Server.Port())
		b = binary.BigEndian.AppendUint16(b, r.Port)
	case OpRenew, OpRelease:
		if r.Port == 0 {
			return nil, fmt.Errorf("%s needs a port", r.Op)
		}
		b = binary.BigEndian.AppendUint16(b, r.Port)
	case OpConvert:
		if r.Count == 0 || r.Count > MaxTickets {
			return nil, fmt.Errorf("convert asks for 1..%d tickets, not %d", MaxTickets, r.Count)
		}
		b = append(b, r.Count)
	case OpCertify:
		if len(r.Cert) == 0 || len(r.Cert) > MaxMessageLen-msgHeaderLen {
			return nil, fmt.Errorf("certify needs a certificate of 1..%d bytes, not %d", MaxMessageLen-msgHeaderLen, len(r.Cert))
		}
		b = append(b, r.Cert...)
	case OpReceipt:
		if len(r.Receipt) == 0 || len(r.Receipt) > MaxMessageLen-msgHeaderLen {
			return nil, fmt.Errorf("receipt needs 1..%d bytes, not %d", MaxMessageLen-msgHeaderLen, len(r.Receipt))
		}
		b = append(b, r.Receipt...)
	case OpEncap:
		if r.Action != EncapOpen && r.Action != EncapRelease {
			return nil, fmt.Errorf("encap action %d is not open (1) or release (2)", r.Action)
		}
		b = append(b, r.Action)
	case OpRoster:
		b = binary.BigEndian.AppendUint16(b, r.Start)
		if r.HasDigest || r.Have != 0 {
			b = binary.BigEndian.AppendUint64(b, r.Have)
		}
	case OpRotate:
		if r.Rotate.Old.IsZero() || r.Rotate.Time == 0 {
			return nil, fmt.Errorf("rotate needs the old key and the statement's time")
		}
		b = append(b, r.Rotate.Old[:]...)
		b = binary.BigEndian.AppendUint64(b, r.Rotate.Time)
		b = append(b, r.Rotate.Signature[:]...)
	default:
		return nil, fmt.Errorf("unknown op %d", r.Op)
	}
	return b, nil
}

// ParseRequest decodes an untrusted request. The error wraps a *Error whose
// reason says how to answer (malformed, bad-version).
func ParseRequest(b []byte) (Request, error) {
	var r Request
	if len(b) < msgHeaderLen {
		return r, malformed(0, "request of %d bytes is shorter than its %d-byte header", len(b), msgHeaderLen)
	}
	if len(b) > MaxMessageLen {
		return r, malformed(0, "request of %d bytes exceeds %d", len(b), MaxMessageLen)
	}
	r.Op = Op(b[1])
	r.ID = binary.BigEndian.Uint32(b[4:])
	if b[0] != Version {
		return r, fmt.Errorf("request version %d: %w", b[0], &Error{Op: r.Op, Reason: ReasonBadVersion})
	}
	body := b[msgHeaderLen:]
	switch r.Op {
	case OpPing, OpTunnel:
		if len(body) != 0 {
			return r, malformed(r.Op, "%d unexpected body bytes", len(body))
		}
	case OpGrant:
		addr, rest, err := parseAddr(body)
		if err != nil {
			return r, malformed(r.Op, "server address: %v", err)
		}
		if len(rest) != 4 {
			return r, malformed(r.Op, "want 4 bytes of ports after the address, got %d", len(rest))
		}
		r.Server = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(rest))
		r.Port = binary.BigEndian.Uint16(rest[2:])
		if r.Server.Port() == 0 {
			return r, malformed(r.Op, "server port 0")
		}
	case OpRenew, OpRelease:
		if len(body) != 2 {
			return r, malformed(r.Op, "want a 2-byte port, got %d bytes", len(body))
		}
		r.Port = binary.BigEndian.Uint16(body)
		if r.Port == 0 {
			return r, malformed(r.Op, "port 0")
		}
	case OpConvert:
		if len(body) != 1 || body[0] == 0 || body[0] > MaxTickets {
			return r, malformed(r.Op, "want a ticket count 1..%d, got % x", MaxTickets, body)
		}
		r.Count = body[0]
	case OpCertify:
		if len(body) == 0 {
			return r, malformed(r.Op, "empty certificate")
		}
		r.Cert = append([]byte(nil), body...)
	case OpReceipt:
		if len(body) == 0 {
			return r, malformed(r.Op, "empty receipt")
		}
		r.Receipt = append([]byte(nil), body...)
	case OpEncap:
		if len(body) != 1 || (body[0] != EncapOpen && body[0] != EncapRelease) {
			return r, malformed(r.Op, "want one action byte (1 open, 2 release), got % x", body)
		}
		r.Action = body[0]
	case OpRoster:
		if len(body) != 2 && len(body) != 10 {
			return r, malformed(r.Op, "want a 2-byte start index and an optional 8-byte digest, got %d bytes", len(body))
		}
		r.Start = binary.BigEndian.Uint16(body)
		if len(body) == 10 {
			r.Have, r.HasDigest = binary.BigEndian.Uint64(body[2:]), true
		}
	case OpRotate:
		if len(body) != rotateBodyLen {
			return r, malformed(r.Op, "want %d bytes (old key, time, signature), got %d", rotateBodyLen, len(body))
		}
		copy(r.Rotate.Old[:], body)
		r.Rotate.Time = binary.BigEndian.Uint64(body[KeyLen:])
		copy(r.Rotate.Signature[:], body[KeyLen+8:])
		if r.Rotate.Old.IsZero() || r.Rotate.Time == 0 {
			return Request{Op: r.Op, ID: r.ID}, malformed(r.Op, "zero old key or time")
		}
	default:
		return r, fmt.Errorf("op %d: %w", b[1], &Error{Op: r.Op, Reason: ReasonUnsupported})
	}
	return r, nil
}

// MarshalReply encodes r. A refusal carries no body.
func MarshalReply(r Reply) ([]byte, error) {
	b := make([]byte, msgHeaderLen, 192)
	b[0] = Version
	b[1] = byte(r.Op)
	b[2] = byte(r.Reason)
	binary.BigEndian.PutUint32(b[4:], r.ID)
	if r.Reason != OK {
		return b, nil
	}
	switch r.Op {
	case OpPing, OpCertify, OpRotate:
	case OpGrant:
		if !r.Detour.IsValid() {
			return nil, fmt.Errorf("grant reply without detour address")
		}
		b = appendAddr(b, r.Detour.Addr())
		b = binary.BigEndian.AppendUint16(b, r.Detour.Port())
		b = binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease))
	case OpRenew:
		b = binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease))
	case OpRelease:
		b = binary.BigEndian.AppendUint64(b, r.Bytes)
	case OpReceipt:
		b = binary.BigEndian.AppendUint64(b, uint64(r.Credit))
	case OpTunnel:
		t := r.Tunnel
		if !t.ClientPrefix.IsValid() || !t.Endpoint.IsValid() {
			return nil, fmt.Errorf("tunnel reply needs a client prefix and an endpoint")
		}
		b = appendAddr(b, t.ClientPrefix.Addr())
		b = append(b, byte(t.ClientPrefix.Bits()))
		b = appendAddr(b, t.Endpoint.Addr())
		b = binary.BigEndian.AppendUint16(b, t.Endpoint.Port())
		b = append(b, t.PublicKey[:]...)
		b = binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease))
	case OpConvert:
		if !r.Converter.IsValid() || r.Converter.Port() == 0 || len(r.Tickets) == 0 || len(r.Tickets) > MaxTickets {
			return nil, fmt.Errorf("convert reply needs a converter address and 1..%d tickets", MaxTickets)
		}
		b = appendAddr(b, r.Converter.Addr())
		b = binary.BigEndian.AppendUint16(b, r.Converter.Port())
		b = binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease))
		b = append(b, byte(len(r.Tickets)))
		for _, t := range r.Tickets {
			b = append(b, t[:]...)
		}
	case OpEncap:
		e := r.Encap
		if e == (EncapGrant{}) {
			break // release
		}
		if err := e.Validate(); err != nil {
			return nil, err
		}
		b = appendAddr(b, e.ClientPrefix.Addr())
		b = append(b, byte(e.ClientPrefix.Bits()))
		b = appendAddr(b, e.Gateway)
		b = appendAddr(b, e.Endpoint.Addr())
		b = binary.BigEndian.AppendUint16(b, e.Endpoint.Port())
		b = appendAddr(b, e.Member)
		b = binary.BigEndian.AppendUint32(b, e.VNI)
		b = binary.BigEndian.AppendUint16(b, e.MTU)
		b = binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease))
	case OpRoster:
		p := r.Roster
		if len(p.Entries) > MaxRosterPage || int(p.Start)+len(p.Entries) > int(p.Total) {
			return nil, fmt.Errorf("roster reply: %d entries from %d of %d", len(p.Entries), p.Start, p.Total)
		}
		b = binary.BigEndian.AppendUint16(b, p.Total)
		b = binary.BigEndian.AppendUint16(b, p.Start)
		b = append(b, byte(len(p.Entries)))
		for _, e := range p.Entries {
			if len(e) == 0 || len(e) > MaxRosterEntry {
				return nil, fmt.Errorf("roster reply: entry of %d bytes", len(e))
			}
			b = binary.BigEndian.AppendUint16(b, uint16(len(e)))
			b = append(b, e...)
		}
		if p.Digest != 0 {
			b = binary.BigEndian.AppendUint64(b, p.Digest)
		}
		if len(b) > MaxReplyLen {
			return nil, fmt.Errorf("roster reply of %d bytes exceeds %d", len(b), MaxReplyLen)
		}
	default:
		return nil, fmt.Errorf("unknown op %d", r.Op)
	}
	return b, nil
}

// ParseReply decodes an untrusted reply.
func ParseReply(b []byte) (Reply, error) {
	var r Reply
	if len(b) < msgHeaderLen {
		return r, fmt.Errorf("reply of %d bytes is shorter than its %d-byte header", len(b), msgHeaderLen)
	}
	if len(b) > MaxMessageLen && (len(b) > MaxReplyLen || (Op(b[1]) != OpRoster && Op(b[1]) != OpConvert)) {
		return r, fmt.Errorf("reply of %d bytes exceeds %d", len(b), MaxMessageLen)
	}
	if b[0] != Version {
		return r, fmt.Errorf("reply version %d, want %d", b[0], Version)
	}
	r.Op = Op(b[1])
	r.Reason = Reason(b[2])
	r.ID = binary.BigEndian.Uint32(b[4:])
	body := b[msgHeaderLen:]
	if r.Reason != OK {
		if len(body) != 0 {
			return r, fmt.Errorf("refusal with %d body bytes", len(body))
		}
		return r, nil
	}
	switch r.Op {
	case OpPing, OpCertify, OpRotate:
		if len(body) != 0 {
			return r, fmt.Errorf("%s reply with %d body bytes", r.Op, len(body))
		}
	case OpGrant:
		addr, rest, err := parseAddr(body)
		if err != nil {
			return r, fmt.Errorf("grant reply detour address: %w", err)
		}
		if len(rest) != 6 {
			return r, fmt.Errorf("grant reply: want 6 bytes after the address, got %d", len(rest))
		}
		r.Detour = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(rest))
		if r.Detour.Port() == 0 {
			return r, fmt.Errorf("grant reply with port 0")
		}
		r.Lease = time.Duration(binary.BigEndian.Uint32(rest[2:])) * time.Second
	case OpRenew:
		if len(body) != 4 {
			return r, fmt.Errorf("renew reply: want 4 bytes, got %d", len(body))
		}
		r.Lease = time.Duration(binary.BigEndian.Uint32(body)) * time.Second
	case OpRelease:
		if len(body) != 8 {
			return r, fmt.Errorf("release reply: want 8 bytes, got %d", len(body))
		}
		r.Bytes = binary.BigEndian.Uint64(body)
	case OpReceipt:
		if len(body) != 8 {
			return r, fmt.Errorf("receipt reply: want 8 bytes, got %d", len(body))
		}
		r.Credit = int64(binary.BigEndian.Uint64(body))
	case OpTunnel:
		addr, rest, err := parseAddr(body)
		if err != nil {
			return r, fmt.Errorf("tunnel reply prefix: %w", err)
		}
		if len(rest) < 1 {
			return r, fmt.Errorf("tunnel reply: missing prefix length")
		}
		p, err := addr.Prefix(int(rest[0]))
		if err != nil || p.Bits() != int(rest[0]) {
			return r, fmt.Errorf("tunnel reply: bad prefix length %d for %v", rest[0], addr)
		}
		r.Tunnel.ClientPrefix = netip.PrefixFrom(addr, int(rest[0]))
		ep, rest, err := parseAddr(rest[1:])
		if err != nil {
			return r, fmt.Errorf("tunnel reply endpoint: %w", err)
		}
		if len(rest) != 2+KeyLen+4 {
			return r, fmt.Errorf("tunnel reply: want %d bytes after the endpoint, got %d", 2+KeyLen+4, len(rest))
		}
		r.Tunnel.Endpoint = netip.AddrPortFrom(ep, binary.BigEndian.Uint16(rest))
		copy(r.Tunnel.PublicKey[:], rest[2:])
		r.Lease = time.Duration(binary.BigEndian.Uint32(rest[2+KeyLen:])) * time.Second
	case OpConvert:
		addr, rest, err := parseAddr(body)
		if err != nil {
			return r, fmt.Errorf("convert reply converter address: %w", err)
		}
		if len(rest) < 7 {
			return r, fmt.Errorf("convert reply: want port, lease and count after the address, got %d bytes", len(rest))
		}
		r.Converter = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(rest))
		r.Lease = time.Duration(binary.BigEndian.Uint32(rest[2:])) * time.Second
		n := int(rest[6])
		rest = rest[7:]
		if r.Converter.Port() == 0 || n == 0 || n > MaxTickets || len(rest) != n*TicketLen {
			return r, fmt.Errorf("convert reply: port %d, %d tickets in %d bytes (want 1..%d tickets of %d bytes)", r.Converter.Port(), n, len(rest), MaxTickets, TicketLen)
		}
		for i := 0; i < n; i++ {
			r.Tickets = append(r.Tickets, [TicketLen]byte(rest[i*TicketLen:]))
		}
	case OpEncap:
		if len(body) == 0 {
			return r, nil // release
		}
		e, lease, err := parseEncap(body)
		if err != nil {
			return r, fmt.Errorf("encap reply: %w", err)
		}
		r.Encap, r.Lease = e, lease
	case OpRoster:
		if len(body) < 5 {
			return r, fmt.Errorf("roster reply: %d bytes, want at least 5", len(body))
		}
		p := RosterPage{Total: binary.BigEndian.Uint16(body), Start: binary.BigEndian.Uint16(body[2:])}
		n, rest := int(body[4]), body[5:]
		if n > MaxRosterPage || int(p.Start)+n > int(p.Total) {
			return r, fmt.Errorf("roster reply: %d entries from %d of %d (at most %d a page)", n, p.Start, p.Total, MaxRosterPage)
		}
		for i := 0; i < n; i++ {
			if len(rest) < 2 {
				return r, fmt.Errorf("roster reply: entry %d truncated", i)
			}
			l := int(binary.BigEndian.Uint16(rest))
			if l == 0 || l > MaxRosterEntry || len(rest) < 2+l {
				return r, fmt.Errorf("roster reply: entry %d of %d bytes (1..%d) with %d left", i, l, MaxRosterEntry, len(rest)-2)
			}
			p.Entries = append(p.Entries, append([]byte(nil), rest[2:2+l]...))
			rest = rest[2+l:]
		}
		switch len(rest) {
		case 0:
		case 8:
			if p.Digest = binary.BigEndian.Uint64(rest); p.Digest == 0 {
				return r, fmt.Errorf("roster reply: digest 0")
			}
		default:
			return r, fmt.Errorf("roster reply: %d trailing bytes (0, or an 8-byte digest)", len(rest))
		}
		r.Roster = p
	default:
		return r, fmt.Errorf("reply for unknown op %d", r.Op)
	}
	return r, nil
}

func malformed(op Op, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), &Error{Op: op, Reason: ReasonMalformed})
}

func leaseSeconds(d time.Duration) uint32 {
	s := d / time.Second
	if s < 0 {
		return 0
	}
	if s > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(s)
}

func appendAddr(b []byte, a netip.Addr) []byte {
	a = a.Unmap()
	if a.Is4() {
		v := a.As4()
		return append(append(b, 4), v[:]...)
	}
	v := a.As16()
	return append(append(b, 6), v[:]...)
}

func parseAddr(b []byte) (netip.Addr, []byte, error) {
	if len(b) < 1 {
		return netip.Addr{}, nil, errors.New("missing address family")
	}
	switch b[0] {
	case 4:
		if len(b) < 5 {
			return netip.Addr{}, nil, errors.New("truncated IPv4 address")
		}
		return netip.AddrFrom4([4]byte(b[1:5])), b[5:], nil
	case 6:
		if len(b) < 17 {
			return netip.Addr{}, nil, errors.New("truncated IPv6 address")
		}
		a := netip.AddrFrom16([16]byte(b[1:17]))
		if a.Is4In6() {
			return netip.Addr{}, nil, errors.New("IPv4-mapped address must use family 4")
		}
		return a, b[17:], nil
	}
	return netip.Addr{}, nil, fmt.Errorf("unknown address family %d", b[0])
}

func parseEncap(b []byte) (EncapGrant, time.Duration, error) {
	var e EncapGrant
	addr, rest, err := parseAddr(b)
	if err != nil {
		return e, 0, fmt.Errorf("client address: %w", err)
	}
	if len(rest) < 1 {
		return e, 0, errors.New("missing prefix length")
	}
	if p, err := addr.Prefix(int(rest[0])); err != nil || p.Bits() != int(rest[0]) {
		return e, 0, fmt.Errorf("bad prefix length %d for %v", rest[0], addr)
	}
	e.ClientPrefix = netip.PrefixFrom(addr, int(rest[0]))
	if e.Gateway, rest, err = parseAddr(rest[1:]); err != nil {
		return e, 0, fmt.Errorf("gateway: %w", err)
	}
	ep, rest, err := parseAddr(rest)
	if err != nil {
		return e, 0, fmt.Errorf("endpoint: %w", err)
	}
	if len(rest) < 2 {
		return e, 0, errors.New("missing endpoint port")
	}
	e.Endpoint = netip.AddrPortFrom(ep, binary.BigEndian.Uint16(rest))
	if e.Member, rest, err = parseAddr(rest[2:]); err != nil {
		return e, 0, fmt.Errorf("member address: %w", err)
	}
	if len(rest) != 10 {
		return e, 0, fmt.Errorf("want vni, mtu and lease (10 bytes) after the member address, got %d", len(rest))
	}
	e.VNI = binary.BigEndian.Uint32(rest)
	e.MTU = binary.BigEndian.Uint16(rest[4:])
	lease := time.Duration(binary.BigEndian.Uint32(rest[6:])) * time.Second
	return e, lease, e.Validate()
}

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// Validate checks a grant (received from the network, or about to be sent).
// The encapsulation is IPv4 inside and outside.
func (e EncapGrant) Validate() error {
	ok4 := func(a netip.Addr) bool {
		return a.Is4() && !a.IsUnspecified() && !a.IsMulticast() && !a.IsLoopback() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	switch {
	case !e.ClientPrefix.IsValid() || !ok4(e.ClientPrefix.Addr()) || e.ClientPrefix.Bits() < 8:
		return fmt.Errorf("encap: client prefix %s is not a usable IPv4 prefix of /8 or longer", e.ClientPrefix)
	case !ok4(e.Gateway) || e.Gateway == e.ClientPrefix.Addr():
		return fmt.Errorf("encap: gateway %s is not a usable IPv4 address distinct from the client's", e.Gateway)
	case !ok4(e.Endpoint.Addr()) || e.Endpoint.Port() == 0:
		return fmt.Errorf("encap: endpoint %s is not an IPv4 address:port", e.Endpoint)
	case !ok4(e.Member):
		return fmt.Errorf("encap: member address %s is not a usable IPv4 address", e.Member)
	case e.VNI == 0 || e.VNI > MaxVNI:
		return fmt.Errorf("encap: VNI %d out of range 1-%d", e.VNI, MaxVNI)
	case e.MTU < 576 || e.MTU > 9000:
		return fmt.Errorf("encap: MTU %d out of range 576-9000", e.MTU)
	}
	return nil
}
