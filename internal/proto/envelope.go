package proto

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Body is the body of one operation's request or reply: one Go type per
// operation and direction (ops.go), which encodes and decodes itself.
// Adding an operation is one request type, one reply type and a line in
// the operations table; the envelope (Request, Reply) does not change.
type Body interface {
	Op() Op
	// appendTo appends the encoded body (after the header) to b.
	appendTo(b []byte) ([]byte, error)
	// parse decodes an untrusted body (exactly b).
	parse(b []byte) error
}

// RequestBody is a request's body (*PingRequest, *GrantRequest...).
type RequestBody interface {
	Body
	request()
}

// ReplyBody is a reply's body (*PingReply, *GrantReply...).
type ReplyBody interface {
	Body
	reply()
}

// Request is a client request: the envelope (ID) and the operation's body.
type Request struct {
	// Op is the body's operation; ParseRequest sets it from the header,
	// also when the body does not parse (the relay answers with it).
	Op Op
	ID uint32 // chosen by the client to match the reply; retransmissions reuse it
	// Body is the operation's request (nil only from a failed parse).
	Body RequestBody
}

// Reply is a relay reply: the envelope (ID, Reason) and, when Reason is
// OK, the operation's body.
type Reply struct {
	Op     Op
	ID     uint32
	Reason Reason
	// Body is the operation's reply; nil with a refusal.
	Body ReplyBody
}

// NewRequest is a request of body with id.
func NewRequest(id uint32, body RequestBody) Request {
	return Request{Op: body.Op(), ID: id, Body: body}
}

// Message layout (inside an encrypted transport packet; big-endian):
//
//	request: version:u8 op:u8 reserved:u16 id:u32 body
//	  grant:   addr port:u16 proposed:u16
//	  renew:   port:u16
//	  release: port:u16
//	  convert: count:u8 (1..MaxTickets)
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
//
// Each body is its operation's type in ops.go (the types say the same).
const msgHeaderLen = 8

// MaxMessageLen bounds any request and every reply but roster pages;
// larger input is refused.
const MaxMessageLen = 256

// MaxReplyLen bounds roster and convert replies (the only larger ones):
// it keeps a transport packet within 1,280 bytes with IPv6 and UDP headers.
const MaxReplyLen = 1200

// MarshalRequest encodes r (its operation is its body's). A request of an
// operation whose body is empty (ping, tunnel) may leave Body nil.
func MarshalRequest(r Request) ([]byte, error) {
	if r.Body == nil {
		d, ok := operations[r.Op]
		if !ok {
			return nil, fmt.Errorf("unknown op %d", r.Op)
		}
		r.Body = d.request()
	}
	op := r.Body.Op()
	if _, ok := operations[op]; !ok {
		return nil, fmt.Errorf("unknown op %d", op)
	}
	b := make([]byte, msgHeaderLen, 32)
	b[0] = Version
	b[1] = byte(op)
	binary.BigEndian.PutUint32(b[4:], r.ID)
	return r.Body.appendTo(b)
}

// ParseRequest decodes an untrusted request. The error wraps a *Error whose
// reason says how to answer (malformed, bad-version, unsupported); the
// request's Op and ID are set whenever the header was there.
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
	d, ok := operations[r.Op]
	if !ok {
		return r, fmt.Errorf("op %d: %w", b[1], &Error{Op: r.Op, Reason: ReasonUnsupported})
	}
	body := d.request()
	if err := body.parse(b[msgHeaderLen:]); err != nil {
		return r, malformed(r.Op, "%v", err)
	}
	r.Body = body
	return r, nil
}

// MarshalReply encodes r. A refusal carries no body; an accepted
// operation whose reply is empty may leave Body nil.
func MarshalReply(r Reply) ([]byte, error) {
	op := r.Op
	if r.Body != nil {
		if r.Op != 0 && r.Op != r.Body.Op() {
			return nil, fmt.Errorf("reply %s with a %s body", r.Op, r.Body.Op())
		}
		op = r.Body.Op()
	}
	b := make([]byte, msgHeaderLen, 192)
	b[0] = Version
	b[1] = byte(op)
	b[2] = byte(r.Reason)
	binary.BigEndian.PutUint32(b[4:], r.ID)
	if r.Reason != OK {
		return b, nil
	}
	if _, ok := operations[op]; !ok {
		return nil, fmt.Errorf("unknown op %d", op)
	}
	if r.Body == nil { // an operation whose reply is empty (ping, certify, rotate)
		r.Body = operations[op].reply()
	}
	return r.Body.appendTo(b)
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
	d, ok := operations[r.Op]
	if !ok {
		return r, fmt.Errorf("reply for unknown op %d", r.Op)
	}
	rb := d.reply()
	if err := rb.parse(body); err != nil {
		return r, fmt.Errorf("%s reply: %w", r.Op, err)
	}
	r.Body = rb
	return r, nil
}

// NewReplyBody is a fresh, empty reply body of op (nil for an unknown op),
// for peers that answer an operation without content of their own.
func NewReplyBody(op Op) ReplyBody {
	if d, ok := operations[op]; ok {
		return d.reply()
	}
	return nil
}

// Ops lists the operations of the protocol, in numeric order.
func Ops() []Op {
	ops := make([]Op, 0, len(operations))
	for op := range operations {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	return ops
}
