// Package convert is the converter core (docs/convert.md): the 0-RTT TCP Convert
// Protocol (RFC 8803) message format, a converter server that turns an
// authenticated MPTCP connection into a plain TCP connection to the
// destination named in the first bytes, and the client side that opens
// such a connection (in the SYN with TCP Fast Open where the kernel can).
//
// The package imports no daemon. The relay runs the server side (Listen,
// under its `convert:` section, internal/relay/convert.go); `mpdetour run
// --convert` turns a program's connect() into ConvertFD on a ticket that the
// agent's convclient.Router hands out; the lab's load generator uses Dial.
package convert

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Fixed header (RFC 8803, section 4.1):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    Version    | Total Length  |         Magic Number          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// Version is 1. Total Length counts 32-bit words, the header included, so
// a message is at most 255*4 bytes. Magic Number is 0x2263 (8803); early
// drafts had an Unassigned field there, the RFC fixes the value.
//
// Every TLV (section 4.2.1) is
//
//	| Type (8) | Length (8, in 32-bit words, Type and Length included) | Value |
//
// and TLVs are aligned on 32-bit boundaries.
const (
	Version = 1
	Magic   = 0x2263
	// HeaderLen is the size of the fixed header in bytes.
	HeaderLen = 4
	// MaxMessageLen is the largest Convert message: Total Length is one byte
	// counting 32-bit words.
	MaxMessageLen = 255 * 4
)

// TLVType is a Convert TLV type (IANA "Convert TLVs" registry).
type TLVType uint8

// The TLV types of RFC 8803 and our ticket TLV.
const (
	TypeInfo                   TLVType = 1
	TypeConnect                TLVType = 10
	TypeExtendedTCPHeader      TLVType = 20
	TypeSupportedTCPExtensions TLVType = 21
	TypeCookie                 TLVType = 22
	TypeError                  TLVType = 30
	// TypeTicket carries mpdetour's authentication ticket. The registry
	// leaves 31-191 unassigned (IETF Review / Specification Required: a
	// future RFC may take any of them) and sets 192-255 aside for Private
	// Use (RFC 8126), which is what an application-specific TLV is: 192
	// is the first value no RFC 8803 implementation will ever give another
	// meaning, so a standard converter answers it with Unsupported Message
	// rather than misreading it.
	TypeTicket TLVType = 192
)

func (t TLVType) String() string {
	switch t {
	case TypeInfo:
		return "Info"
	case TypeConnect:
		return "Connect"
	case TypeExtendedTCPHeader:
		return "Extended TCP Header"
	case TypeSupportedTCPExtensions:
		return "Supported TCP Extensions"
	case TypeCookie:
		return "Cookie"
	case TypeError:
		return "Error"
	case TypeTicket:
		return "Ticket"
	}
	return fmt.Sprintf("TLV type %d", uint8(t))
}

// ErrorCode is an RFC 8803 error code (section 4.2.7; IANA "Convert Errors").
type ErrorCode uint8

// RFC 8803 error codes: 0-31 message validation, 32-63 client side, 64-95
// converter side, 96-127 caused by the destination.
const (
	CodeUnsupportedVersion     ErrorCode = 0
	CodeMalformedMessage       ErrorCode = 1
	CodeUnsupportedMessage     ErrorCode = 2
	CodeMissingCookie          ErrorCode = 3
	CodeNotAuthorized          ErrorCode = 32
	CodeUnsupportedTCPOption   ErrorCode = 33
	CodeResourceExceeded       ErrorCode = 64
	CodeNetworkFailure         ErrorCode = 65
	CodeConnectionReset        ErrorCode = 96
	CodeDestinationUnreachable ErrorCode = 97
)

func (c ErrorCode) String() string {
	switch c {
	case CodeUnsupportedVersion:
		return "unsupported version"
	case CodeMalformedMessage:
		return "malformed message"
	case CodeUnsupportedMessage:
		return "unsupported message"
	case CodeMissingCookie:
		return "missing cookie"
	case CodeNotAuthorized:
		return "not authorized"
	case CodeUnsupportedTCPOption:
		return "unsupported TCP option"
	case CodeResourceExceeded:
		return "resource exceeded"
	case CodeNetworkFailure:
		return "network failure"
	case CodeConnectionReset:
		return "connection reset"
	case CodeDestinationUnreachable:
		return "destination unreachable"
	}
	return fmt.Sprintf("error code %d", uint8(c))
}

// Ticket length bounds (bytes).
const (
	MinTicketLen = 16
	MaxTicketLen = 64
)

// Message is one Convert message: the fixed header and its TLVs. A nil
// field means the TLV is absent; RFC 8803 allows each TLV at most once.
type Message struct {
	// Info asks the converter which TCP extensions it supports.
	Info bool
	// Connect names the destination (client to converter).
	Connect *Connect
	// ExtendedTCPHeader is the TCP header of the destination's SYN+ACK as
	// the converter received it (converter to client), options included.
	ExtendedTCPHeader []byte
	// SupportedTCPExtensions lists TCP option kinds the converter supports
	// (answer to Info). Non-nil, possibly empty, when present.
	SupportedTCPExtensions []byte
	// Cookie is an opaque cookie (a multiple of 4 bytes, at least 4).
	Cookie []byte
	// Error reports a failure (converter to client).
	Error *ErrorTLV
	// Ticket is mpdetour's authentication ticket (16-64 opaque bytes).
	Ticket []byte
}

// Connect is the Connect TLV (RFC 8803, section 4.2.4):
//
//	| Type=10 | Length | Remote Peer Port (16)           |
//	| Remote Peer IP Address (128, IPv4 as ::ffff:a.b.c.d) |
//	| TCP options (optional, zero-padded to 32 bits)       |
type Connect struct {
	Dst netip.AddrPort
	// TCPOptions the client asks the converter to use towards Dst, as
	// they appear in a TCP header (padding zeros included after parsing).
	TCPOptions []byte
}

// ErrorTLV is the Error TLV (RFC 8803, section 4.2.7):
//
//	| Type=30 | Length | Error Code (8) | Value (variable, zero-padded) |
type ErrorTLV struct {
	Code ErrorCode
	// Value is code specific; after parsing it holds every byte after the
	// code (padding included), at least one.
	Value []byte
}

// ParseError is a message that cannot be accepted. Code is the RFC 8803
// error code the converter answers with, Value the Error TLV value.
type ParseError struct {
	Code   ErrorCode
	Value  []byte
	Offset int // byte offset in the message where the problem is
	Msg    string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("convert message: byte %d: %s (%s)", e.Offset, e.Msg, e.Code)
}

func malformed(off int, format string, args ...any) *ParseError {
	return &ParseError{Code: CodeMalformedMessage, Value: []byte{0}, Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// ParseHeader checks the fixed header and returns the message length in
// bytes (header included).
func ParseHeader(h []byte) (int, error) {
	if len(h) < HeaderLen {
		return 0, malformed(len(h), "fixed header truncated: %d of %d bytes", len(h), HeaderLen)
	}
	if h[0] != Version {
		return 0, &ParseError{Code: CodeUnsupportedVersion, Value: []byte{Version}, Offset: 0,
			Msg: fmt.Sprintf("version %d, only %d is supported", h[0], Version)}
	}
	if h[1] == 0 {
		return 0, malformed(1, "total length 0 words, the header alone is 1")
	}
	if m := binary.BigEndian.Uint16(h[2:4]); m != Magic {
		return 0, malformed(2, "magic number 0x%04x, want 0x%04x", m, Magic)
	}
	return int(h[1]) * 4, nil
}

// Parse decodes exactly one Convert message: b must hold the whole message
// and nothing else. It never panics; every problem is a *ParseError.
func Parse(b []byte) (*Message, error) {
	n, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	if len(b) != n {
		if len(b) < n {
			return nil, malformed(len(b), "message truncated: total length %d bytes, have %d", n, len(b))
		}
		return nil, malformed(n, "%d bytes after the message's total length of %d", len(b)-n, n)
	}
	m := &Message{}
	seen := map[TLVType]bool{}
	for off := HeaderLen; off < n; {
		if n-off < 2 {
			return nil, malformed(off, "TLV header truncated")
		}
		typ, words := TLVType(b[off]), int(b[off+1])
		if words == 0 {
			return nil, malformed(off+1, "%v TLV: length 0 words", typ)
		}
		end := off + words*4
		if end > n {
			return nil, malformed(off+1, "%v TLV: length %d bytes runs past the message end (%d bytes left)", typ, words*4, n-off)
		}
		if seen[typ] {
			return nil, malformed(off, "%v TLV appears twice", typ)
		}
		seen[typ] = true
		v := b[off+2 : end] // the value, after Type and Length
		if err := m.parseTLV(typ, off, v); err != nil {
			return nil, err
		}
		off = end
	}
	return m, nil
}

func (m *Message) parseTLV(typ TLVType, off int, v []byte) error {
	switch typ {
	case TypeInfo:
		if len(v) != 2 {
			return malformed(off+1, "Info TLV: length %d bytes, must be 4", len(v)+2)
		}
		m.Info = true
	case TypeConnect:
		if len(v) < 18 {
			return malformed(off+1, "Connect TLV: length %d bytes, need at least 20", len(v)+2)
		}
		port := binary.BigEndian.Uint16(v[0:2])
		addr := netip.AddrFrom16([16]byte(v[2:18])).Unmap()
		opts := v[18:]
		if err := checkTCPOptions(opts); err != "" {
			return malformed(off+20, "Connect TLV: TCP options: %s", err)
		}
		m.Connect = &Connect{Dst: netip.AddrPortFrom(addr, port), TCPOptions: clone(opts)}
	case TypeExtendedTCPHeader:
		h := v[2:]
		if len(h) < 20 {
			return malformed(off+4, "Extended TCP Header TLV: %d bytes of TCP header, need at least 20", len(h))
		}
		if doff := int(h[12]>>4) * 4; doff != len(h) {
			return malformed(off+4+12, "Extended TCP Header TLV: TCP data offset says %d bytes, the TLV carries %d", doff, len(h))
		}
		if err := checkTCPOptions(h[20:]); err != "" {
			return malformed(off+4+20, "Extended TCP Header TLV: TCP options: %s", err)
		}
		m.ExtendedTCPHeader = clone(h)
	case TypeSupportedTCPExtensions:
		kinds := v[2:]
		end := len(kinds)
		for end > 0 && kinds[end-1] == 0 {
			end--
		}
		for i, k := range kinds[:end] {
			if k == 0 {
				return malformed(off+4+i, "Supported TCP Extensions TLV: kind 0 (padding) before the end of the list")
			}
		}
		if len(kinds)-end >= 4 {
			return malformed(off+4+end, "Supported TCP Extensions TLV: %d padding bytes, at most 3", len(kinds)-end)
		}
		m.SupportedTCPExtensions = append([]byte{}, kinds[:end]...)
	case TypeCookie:
		if len(v) < 6 {
			return malformed(off+1, "Cookie TLV: no opaque value")
		}
		m.Cookie = clone(v[2:])
	case TypeError:
		m.Error = &ErrorTLV{Code: ErrorCode(v[0]), Value: clone(v[1:])}
	case TypeTicket:
		// | Type=192 | Length | Reserved (8, zero) | Ticket Length (8) |
		// | Ticket (16-64 bytes) ... | zero padding to 32 bits |
		if v[0] != 0 {
			return malformed(off+2, "Ticket TLV: reserved byte is %d, must be 0", v[0])
		}
		tl := int(v[1])
		if tl < MinTicketLen || tl > MaxTicketLen {
			return malformed(off+3, "Ticket TLV: ticket of %d bytes, must be %d-%d", tl, MinTicketLen, MaxTicketLen)
		}
		if want := pad4(4 + tl); want != len(v)+2 {
			return malformed(off+1, "Ticket TLV: length %d bytes, a %d-byte ticket needs %d", len(v)+2, tl, want)
		}
		for i, c := range v[2+tl:] {
			if c != 0 {
				return malformed(off+4+tl+i, "Ticket TLV: padding byte is %d, must be 0", c)
			}
		}
		m.Ticket = clone(v[2 : 2+tl])
	default:
		return &ParseError{Code: CodeUnsupportedMessage, Value: []byte{byte(typ)}, Offset: off,
			Msg: fmt.Sprintf("unknown TLV type %d", uint8(typ))}
	}
	return nil
}

// checkTCPOptions walks a TCP option list: NOP, EOL followed by zeros
// only, and kind/length pairs that fit. It returns "" if the list is well formed.
func checkTCPOptions(o []byte) string {
	for i := 0; i < len(o); {
		switch o[i] {
		case 0: // End of Option List: the rest is padding
			for _, c := range o[i:] {
				if c != 0 {
					return fmt.Sprintf("byte %d after End of Option List is not zero", i)
				}
			}
			return ""
		case 1: // NOP
			i++
		default:
			if i+1 >= len(o) {
				return fmt.Sprintf("option kind %d at byte %d has no length", o[i], i)
			}
			l := int(o[i+1])
			if l < 2 || i+l > len(o) {
				return fmt.Sprintf("option kind %d at byte %d: length %d does not fit", o[i], i, l)
			}
			i += l
		}
	}
	return ""
}

// TCPOptionKinds lists the kinds in a well-formed option list, NOP and EOL left out.
func TCPOptionKinds(o []byte) []byte {
	var kinds []byte
	for i := 0; i < len(o); {
		switch o[i] {
		case 0:
			return kinds
		case 1:
			i++
		default:
			if i+1 >= len(o) || o[i+1] < 2 {
				return kinds
			}
			kinds = append(kinds, o[i])
			i += int(o[i+1])
		}
	}
	return kinds
}

func clone(b []byte) []byte { return append([]byte{}, b...) }

func pad4(n int) int { return (n + 3) &^ 3 }

// ReadMessage reads exactly one Convert message from r: the fixed header,
// then the rest of Total Length, never a byte more, so the payload that
// follows stays in the socket (and can be spliced). A clean EOF before the first byte is io.EOF; a connection
// closed mid-message is io.ErrUnexpectedEOF.
func ReadMessage(r io.Reader) (*Message, error) {
	var buf [MaxMessageLen]byte
	if _, err := io.ReadFull(r, buf[:HeaderLen]); err != nil {
		return nil, err
	}
	n, err := ParseHeader(buf[:HeaderLen])
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(r, buf[HeaderLen:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return Parse(buf[:n])
}

// Marshal encodes m. TLVs go out in ascending type order; values are padded
// with zeros to 32 bits.
func (m *Message) Marshal() ([]byte, error) {
	b := []byte{Version, 0, Magic >> 8, Magic & 0xff}
	tlv := func(typ TLVType, value ...[]byte) error {
		n := 2
		for _, v := range value {
			n += len(v)
		}
		p := pad4(n)
		if p/4 > 255 {
			return fmt.Errorf("convert: %v TLV of %d bytes is longer than 255 words", typ, p)
		}
		b = append(b, byte(typ), byte(p/4))
		for _, v := range value {
			b = append(b, v...)
		}
		b = append(b, make([]byte, p-n)...)
		return nil
	}
	var err error
	if m.Info {
		err = errors.Join(err, tlv(TypeInfo, []byte{0, 0}))
	}
	if c := m.Connect; c != nil {
		if !c.Dst.IsValid() {
			return nil, errors.New("convert: Connect TLV without a destination")
		}
		if s := checkTCPOptions(c.TCPOptions); s != "" {
			return nil, fmt.Errorf("convert: Connect TLV: TCP options: %s", s)
		}
		a := c.Dst.Addr().As16() // IPv4 becomes ::ffff:a.b.c.d
		err = errors.Join(err, tlv(TypeConnect, binary.BigEndian.AppendUint16(nil, c.Dst.Port()), a[:], c.TCPOptions))
	}
	if h := m.ExtendedTCPHeader; h != nil {
		if len(h) < 20 || int(h[12]>>4)*4 != len(h) {
			return nil, fmt.Errorf("convert: Extended TCP Header TLV: %d bytes is not a whole TCP header", len(h))
		}
		err = errors.Join(err, tlv(TypeExtendedTCPHeader, []byte{0, 0}, h))
	}
	if k := m.SupportedTCPExtensions; k != nil {
		for _, c := range k {
			if c == 0 {
				return nil, errors.New("convert: Supported TCP Extensions TLV: kind 0 cannot be listed")
			}
		}
		err = errors.Join(err, tlv(TypeSupportedTCPExtensions, []byte{0, 0}, k))
	}
	if c := m.Cookie; c != nil {
		if len(c) == 0 || len(c)%4 != 0 {
			return nil, fmt.Errorf("convert: Cookie TLV: %d bytes, must be a non-zero multiple of 4", len(c))
		}
		err = errors.Join(err, tlv(TypeCookie, []byte{0, 0}, c))
	}
	if e := m.Error; e != nil {
		v := e.Value
		if len(v) == 0 {
			v = []byte{0}
		}
		err = errors.Join(err, tlv(TypeError, []byte{byte(e.Code)}, v))
	}
	if t := m.Ticket; t != nil {
		if len(t) < MinTicketLen || len(t) > MaxTicketLen {
			return nil, fmt.Errorf("convert: ticket of %d bytes, must be %d-%d", len(t), MinTicketLen, MaxTicketLen)
		}
		err = errors.Join(err, tlv(TypeTicket, []byte{0, byte(len(t))}, t))
	}
	if err != nil {
		return nil, err
	}
	if len(b) > MaxMessageLen {
		return nil, fmt.Errorf("convert: message of %d bytes is longer than %d", len(b), MaxMessageLen)
	}
	b[1] = byte(len(b) / 4)
	return b, nil
}
