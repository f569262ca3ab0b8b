package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// operation describes one Op: its name (logs, metrics) and fresh bodies
// of its request and reply, for the decoders.
type operation struct {
	name    string
	request func() RequestBody
	reply   func() ReplyBody
}

// operations is the table of control operations. A new operation is a
// line here and its two body types below.
var operations = map[Op]operation{
	OpPing:    {"ping", func() RequestBody { return &PingRequest{} }, func() ReplyBody { return &PingReply{} }},
	OpGrant:   {"grant", func() RequestBody { return &GrantRequest{} }, func() ReplyBody { return &GrantReply{} }},
	OpRenew:   {"renew", func() RequestBody { return &RenewRequest{} }, func() ReplyBody { return &RenewReply{} }},
	OpRelease: {"release", func() RequestBody { return &ReleaseRequest{} }, func() ReplyBody { return &ReleaseReply{} }},
	OpTunnel:  {"tunnel", func() RequestBody { return &TunnelRequest{} }, func() ReplyBody { return &TunnelReply{} }},
	OpConvert: {"convert", func() RequestBody { return &ConvertRequest{} }, func() ReplyBody { return &ConvertReply{} }},
	OpCertify: {"certify", func() RequestBody { return &CertifyRequest{} }, func() ReplyBody { return &CertifyReply{} }},
	OpReceipt: {"receipt", func() RequestBody { return &ReceiptRequest{} }, func() ReplyBody { return &ReceiptReply{} }},
	OpEncap:   {"encap", func() RequestBody { return &EncapRequest{} }, func() ReplyBody { return &EncapReply{} }},
	OpRoster:  {"roster", func() RequestBody { return &RosterRequest{} }, func() ReplyBody { return &RosterReply{} }},
	OpRotate:  {"rotate", func() RequestBody { return &RotateRequest{} }, func() ReplyBody { return &RotateReply{} }},
	OpQuota:   {"quota", func() RequestBody { return &QuotaRequest{} }, func() ReplyBody { return &QuotaReply{} }},
}

// empty is the body of operations that carry nothing.
type empty struct{}

func (empty) appendTo(b []byte) ([]byte, error) { return b, nil }
func (empty) parse(b []byte) error {
	if len(b) != 0 {
		return fmt.Errorf("%d unexpected body bytes", len(b))
	}
	return nil
}

// PingRequest checks liveness (and keeps the session's address fresh).
// Body: empty.
type PingRequest struct{ empty }

// PingReply answers it. Body: empty.
type PingReply struct{ empty }

func (*PingRequest) Op() Op   { return OpPing }
func (*PingRequest) request() {}
func (*PingReply) Op() Op     { return OpPing }
func (*PingReply) reply()     {}

// GrantRequest asks for a NAT detour toward Server; Port is the detour port
// the client proposes (0: any). Body: addr port:u16 proposed:u16.
type GrantRequest struct {
	Server netip.AddrPort
	Port   uint16
}

// GrantReply is where to connect (the relay's data-plane address and the
// granted port) and the lease. Body: addr port:u16 lease_s:u32.
type GrantReply struct {
	Detour netip.AddrPort
	Lease  time.Duration
}

func (*GrantRequest) Op() Op   { return OpGrant }
func (*GrantRequest) request() {}
func (r *GrantRequest) appendTo(b []byte) ([]byte, error) {
	if !r.Server.IsValid() || r.Server.Port() == 0 {
		return nil, fmt.Errorf("grant needs a server address and port, got %v", r.Server)
	}
	b = appendAddr(b, r.Server.Addr())
	b = binary.BigEndian.AppendUint16(b, r.Server.Port())
	return binary.BigEndian.AppendUint16(b, r.Port), nil
}
func (r *GrantRequest) parse(b []byte) error {
	addr, rest, err := parseAddr(b)
	if err != nil {
		return fmt.Errorf("server address: %v", err)
	}
	if len(rest) != 4 {
		return fmt.Errorf("want 4 bytes of ports after the address, got %d", len(rest))
	}
	r.Server = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(rest))
	r.Port = binary.BigEndian.Uint16(rest[2:])
	if r.Server.Port() == 0 {
		return errors.New("server port 0")
	}
	return nil
}

func (*GrantReply) Op() Op { return OpGrant }
func (*GrantReply) reply() {}
func (r *GrantReply) appendTo(b []byte) ([]byte, error) {
	if !r.Detour.IsValid() {
		return nil, errors.New("grant reply without detour address")
	}
	b = appendAddr(b, r.Detour.Addr())
	b = binary.BigEndian.AppendUint16(b, r.Detour.Port())
	return binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease)), nil
}
func (r *GrantReply) parse(b []byte) error {
	addr, rest, err := parseAddr(b)
	if err != nil {
		return fmt.Errorf("detour address: %w", err)
	}
	if len(rest) != 6 {
		return fmt.Errorf("want 6 bytes after the address, got %d", len(rest))
	}
	r.Detour = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(rest))
	if r.Detour.Port() == 0 {
		return errors.New("port 0")
	}
	r.Lease = time.Duration(binary.BigEndian.Uint32(rest[2:])) * time.Second
	return nil
}

// appendPort and parsePort are the body of renew and release requests:
// port:u16, not 0.
func appendPort(b []byte, p uint16) ([]byte, error) {
	if p == 0 {
		return nil, errors.New("needs a port")
	}
	return binary.BigEndian.AppendUint16(b, p), nil
}

func parsePort(b []byte) (uint16, error) {
	if len(b) != 2 {
		return 0, fmt.Errorf("want a 2-byte port, got %d bytes", len(b))
	}
	p := binary.BigEndian.Uint16(b)
	if p == 0 {
		return 0, errors.New("port 0")
	}
	return p, nil
}

// RenewRequest extends the lease of the granted detour port Port.
// Body: port:u16.
type RenewRequest struct{ Port uint16 }

// RenewReply is the new lease. Body: lease_s:u32.
type RenewReply struct{ Lease time.Duration }

func (*RenewRequest) Op() Op                              { return OpRenew }
func (*RenewRequest) request()                            {}
func (r *RenewRequest) appendTo(b []byte) ([]byte, error) { return appendPort(b, r.Port) }
func (r *RenewRequest) parse(b []byte) (err error) {
	r.Port, err = parsePort(b)
	return err
}
func (*RenewReply) Op() Op { return OpRenew }
func (*RenewReply) reply() {}
func (r *RenewReply) appendTo(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease)), nil
}
func (r *RenewReply) parse(b []byte) error {
	if len(b) != 4 {
		return fmt.Errorf("want 4 bytes, got %d", len(b))
	}
	r.Lease = time.Duration(binary.BigEndian.Uint32(b)) * time.Second
	return nil
}

// ReleaseRequest drops the granted detour port Port. Body: port:u16.
type ReleaseRequest struct{ Port uint16 }

// ReleaseReply is what was counted on the mapping so far (both
// directions). Body: bytes:u64.
type ReleaseReply struct{ Bytes uint64 }

func (*ReleaseRequest) Op() Op                              { return OpRelease }
func (*ReleaseRequest) request()                            {}
func (r *ReleaseRequest) appendTo(b []byte) ([]byte, error) { return appendPort(b, r.Port) }
func (r *ReleaseRequest) parse(b []byte) (err error) {
	r.Port, err = parsePort(b)
	return err
}
func (*ReleaseReply) Op() Op { return OpRelease }
func (*ReleaseReply) reply() {}
func (r *ReleaseReply) appendTo(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint64(b, r.Bytes), nil
}
func (r *ReleaseReply) parse(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("want 8 bytes, got %d", len(b))
	}
	r.Bytes = binary.BigEndian.Uint64(b)
	return nil
}

// TunnelRequest asks for a tunnel address (tunnel detours). Body: empty
// (an IPv4 tunnel address, what every version asks), or flags:u8 with
// TunnelWantIPv6 (an IPv6 tunnel address too, where the relay has one;
// relays before it answer malformed, so a client retries without).
type TunnelRequest struct {
	IPv6 bool
}

// TunnelWantIPv6 is the TunnelRequest flag asking for an IPv6 tunnel
// address beside the IPv4 one. Other bits are refused (malformed).
const TunnelWantIPv6 uint8 = 1

// TunnelReply is the tunnel (see TunnelGrant) and its lease. Body:
// prefix_addr prefix_len:u8 endpoint_addr endpoint_port:u16 pubkey[32]
// lease_s:u32, then, only in answer to a request with TunnelWantIPv6 and
// only when the relay has an IPv6 tunnel subnet, prefix6_addr (family 6)
// prefix6_len:u8.
type TunnelReply struct {
	Tunnel TunnelGrant
	Lease  time.Duration
}

func (*TunnelRequest) Op() Op   { return OpTunnel }
func (*TunnelRequest) request() {}
func (r *TunnelRequest) appendTo(b []byte) ([]byte, error) {
	if r.IPv6 {
		return append(b, TunnelWantIPv6), nil
	}
	return b, nil
}
func (r *TunnelRequest) parse(b []byte) error {
	switch {
	case len(b) == 0:
		r.IPv6 = false
	case len(b) == 1 && b[0] == TunnelWantIPv6:
		r.IPv6 = true
	default:
		return fmt.Errorf("tunnel request flags % x: want none or %d", b, TunnelWantIPv6)
	}
	return nil
}
func (*TunnelReply) Op() Op { return OpTunnel }
func (*TunnelReply) reply() {}
func (r *TunnelReply) appendTo(b []byte) ([]byte, error) {
	t := r.Tunnel
	if !t.ClientPrefix.IsValid() || !t.Endpoint.IsValid() {
		return nil, errors.New("tunnel reply needs a client prefix and an endpoint")
	}
	b = appendAddr(b, t.ClientPrefix.Addr())
	b = append(b, byte(t.ClientPrefix.Bits()))
	b = appendAddr(b, t.Endpoint.Addr())
	b = binary.BigEndian.AppendUint16(b, t.Endpoint.Port())
	b = append(b, t.PublicKey[:]...)
	b = binary.BigEndian.AppendUint32(b, leaseSeconds(r.Lease))
	if p := t.ClientPrefix6; p.IsValid() {
		if !p.Addr().Is6() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, fmt.Errorf("tunnel reply: IPv6 client prefix %v is not IPv6", p)
		}
		b = appendAddr(b, p.Addr())
		b = append(b, byte(p.Bits()))
	}
	return b, nil
}
func (r *TunnelReply) parse(b []byte) error {
	addr, rest, err := parseAddr(b)
	if err != nil {
		return fmt.Errorf("prefix: %w", err)
	}
	if len(rest) < 1 {
		return errors.New("missing prefix length")
	}
	p, err := addr.Prefix(int(rest[0]))
	if err != nil || p.Bits() != int(rest[0]) {
		return fmt.Errorf("bad prefix length %d for %v", rest[0], addr)
	}
	r.Tunnel.ClientPrefix = netip.PrefixFrom(addr, int(rest[0]))
	ep, rest, err := parseAddr(rest[1:])
	if err != nil {
		return fmt.Errorf("endpoint: %w", err)
	}
	if len(rest) != 2+KeyLen+4 && len(rest) != 2+KeyLen+4+18 {
		return fmt.Errorf("want %d (or %d, with an IPv6 prefix) bytes after the endpoint, got %d", 2+KeyLen+4, 2+KeyLen+4+18, len(rest))
	}
	r.Tunnel.Endpoint = netip.AddrPortFrom(ep, binary.BigEndian.Uint16(rest))
	copy(r.Tunnel.PublicKey[:], rest[2:])
	r.Lease = time.Duration(binary.BigEndian.Uint32(rest[2+KeyLen:])) * time.Second
	if rest = rest[2+KeyLen+4:]; len(rest) > 0 {
		a6, tail, err := parseAddr(rest)
		if err != nil || !a6.Is6() || len(tail) != 1 {
			return fmt.Errorf("IPv6 prefix: want family 6, 16 bytes and a length (%v)", err)
		}
		p, err := a6.Prefix(int(tail[0]))
		if err != nil || p.Bits() != int(tail[0]) {
			return fmt.Errorf("bad IPv6 prefix length %d for %v", tail[0], a6)
		}
		r.Tunnel.ClientPrefix6 = netip.PrefixFrom(a6, int(tail[0]))
	}
	return nil
}

// ConvertRequest asks for Count (1..MaxTickets) converter tickets.
// Body: count:u8.
type ConvertRequest struct{ Count uint8 }

// ConvertReply is the converter's address and single-use tickets (valid
// for Lease, from the address this session's requests come from). Body:
// addr port:u16 lease_s:u32 count:u8 tickets[count][16].
type ConvertReply struct {
	Converter netip.AddrPort
	Lease     time.Duration
	Tickets   [][TicketLen]byte
}

func (*ConvertRequest) Op() Op   { return OpConvert }
func (*ConvertRequest) request() {}
func (r *ConvertRequest) appendTo(b []byte) ([]byte, error) {
	if r.Count == 0 || r.Count > MaxTickets {
		return nil, fmt.Errorf("convert asks for 1..%d tickets, not %d", MaxTickets, r.Count)
	}
	return append(b, r.Count), nil
}
func (r *ConvertRequest) parse(b []byte) error {
	if len(b) != 1 || b[0] == 0 || b[0] > MaxTickets {
		return fmt.Errorf("want a ticket count 1..%d, got % x", MaxTickets, b)
	}
	r.Count = b[0]
	return nil
}

func (*ConvertReply) Op() Op { return OpConvert }
func (*ConvertReply) reply() {}
func (r *ConvertReply) appendTo(b []byte) ([]byte, error) {
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
	return b, nil
}
func (r *ConvertReply) parse(b []byte) error {
	addr, rest, err := parseAddr(b)
	if err != nil {
		return fmt.Errorf("converter address: %w", err)
	}
	if len(rest) < 7 {
		return fmt.Errorf("want port, lease and count after the address, got %d bytes", len(rest))
	}
	r.Converter = netip.AddrPortFrom(addr, binary.BigEndian.Uint16(rest))
	r.Lease = time.Duration(binary.BigEndian.Uint32(rest[2:])) * time.Second
	n := int(rest[6])
	rest = rest[7:]
	if r.Converter.Port() == 0 || n == 0 || n > MaxTickets || len(rest) != n*TicketLen {
		return fmt.Errorf("port %d, %d tickets in %d bytes (want 1..%d tickets of %d bytes)", r.Converter.Port(), n, len(rest), MaxTickets, TicketLen)
	}
	for i := 0; i < n; i++ {
		r.Tickets = append(r.Tickets, [TicketLen]byte(rest[i*TicketLen:]))
	}
	return nil
}

// blob is a request body of 1..MaxMessageLen-8 opaque bytes.
type blob []byte

func (v blob) append(b []byte, what string) ([]byte, error) {
	if len(v) == 0 || len(v) > MaxMessageLen-msgHeaderLen {
		return nil, fmt.Errorf("needs a %s of 1..%d bytes, not %d", what, MaxMessageLen-msgHeaderLen, len(v))
	}
	return append(b, v...), nil
}

func parseBlob(b []byte, what string) (blob, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("empty %s", what)
	}
	return append(blob(nil), b...), nil
}

// CertifyRequest presents a collective member certificate (binary form,
// collective.Certificate.Bytes). Body: the certificate.
type CertifyRequest struct{ Cert []byte }

// CertifyReply accepts it. Body: empty.
type CertifyReply struct{ empty }

func (*CertifyRequest) Op() Op   { return OpCertify }
func (*CertifyRequest) request() {}
func (r *CertifyRequest) appendTo(b []byte) ([]byte, error) {
	return blob(r.Cert).append(b, "certificate")
}
func (r *CertifyRequest) parse(b []byte) error {
	c, err := parseBlob(b, "certificate")
	r.Cert = c
	return err
}
func (*CertifyReply) Op() Op { return OpCertify }
func (*CertifyReply) reply() {}

// ReceiptRequest presents a usage receipt a relay issued (binary form,
// collective.Receipt.Bytes). Body: the receipt.
type ReceiptRequest struct{ Receipt []byte }

// ReceiptReply is the member's credit at this relay afterwards, in bytes
// (negative: it consumed more than it contributed). Body: credit:i64.
type ReceiptReply struct{ Credit int64 }

func (*ReceiptRequest) Op() Op   { return OpReceipt }
func (*ReceiptRequest) request() {}
func (r *ReceiptRequest) appendTo(b []byte) ([]byte, error) {
	return blob(r.Receipt).append(b, "receipt")
}
func (r *ReceiptRequest) parse(b []byte) error {
	c, err := parseBlob(b, "receipt")
	r.Receipt = c
	return err
}
func (*ReceiptReply) Op() Op { return OpReceipt }
func (*ReceiptReply) reply() {}
func (r *ReceiptReply) appendTo(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint64(b, uint64(r.Credit)), nil
}
func (r *ReceiptReply) parse(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("want 8 bytes, got %d", len(b))
	}
	r.Credit = int64(binary.BigEndian.Uint64(b))
	return nil
}

// EncapRequest opens (or renews) or releases the member's unencrypted
// VXLAN tunnel: Action is EncapOpen or EncapRelease. IPv6 (open only)
// asks for an IPv6 inner address too. Body: action:u8 [flags:u8], flags
// only with open and then EncapWantIPv6 (relays before it answer
// malformed, so a client retries without).
type EncapRequest struct {
	Action uint8
	IPv6   bool
}

// EncapWantIPv6 is the EncapRequest flag asking for an IPv6 inner address
// beside the IPv4 one. Other bits are refused (malformed).
const EncapWantIPv6 uint8 = 1

// EncapReply is the tunnel (see EncapGrant) and its lease; zero in the
// reply to a release. Body: empty (release) or prefix_addr prefix_len:u8
// gateway_addr endpoint_addr endpoint_port:u16 member_addr vni:u32
// mtu:u16 lease_s:u32, then, only in answer to a request with
// EncapWantIPv6 and only when the relay has a vxlan subnet6,
// prefix6_addr (family 6) prefix6_len:u8 gateway6_addr (family 6).
type EncapReply struct {
	Encap EncapGrant
	Lease time.Duration
}

func (*EncapRequest) Op() Op   { return OpEncap }
func (*EncapRequest) request() {}
func (r *EncapRequest) appendTo(b []byte) ([]byte, error) {
	if r.Action != EncapOpen && r.Action != EncapRelease {
		return nil, fmt.Errorf("encap action %d is not open (1) or release (2)", r.Action)
	}
	if r.IPv6 {
		if r.Action != EncapOpen {
			return nil, errors.New("encap: only an open asks for IPv6")
		}
		return append(b, r.Action, EncapWantIPv6), nil
	}
	return append(b, r.Action), nil
}
func (r *EncapRequest) parse(b []byte) error {
	switch {
	case len(b) == 1 && (b[0] == EncapOpen || b[0] == EncapRelease):
		r.Action, r.IPv6 = b[0], false
	case len(b) == 2 && b[0] == EncapOpen && b[1] == EncapWantIPv6:
		r.Action, r.IPv6 = b[0], true
	default:
		return fmt.Errorf("want one action byte (1 open, 2 release) and, with open, optional flags %d, got % x", EncapWantIPv6, b)
	}
	return nil
}

func (*EncapReply) Op() Op { return OpEncap }
func (*EncapReply) reply() {}
func (r *EncapReply) appendTo(b []byte) ([]byte, error) {
	e := r.Encap
	if e == (EncapGrant{}) {
		return b, nil // release
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
	return appendEncapInside6(b, e), nil
}
func (r *EncapReply) parse(b []byte) error {
	if len(b) == 0 {
		return nil // release
	}
	e, lease, err := parseEncap(b)
	if err != nil {
		return err
	}
	r.Encap, r.Lease = e, lease
	return nil
}

// RosterRequest asks for a page of the collective's relay roster from
// index Start. Have is the digest of the roster the client holds (0:
// none; RosterPage.Digest): a request with Have != 0 or HasDigest set asks
// for the digest in the reply; an older relay refuses it as malformed and
// the client asks again without. Body: start:u16 [have:u64].
type RosterRequest struct {
	Start     uint16
	Have      uint64
	HasDigest bool
}

// RosterReply is one page of signed roster entries. Body: total:u16
// start:u16 count:u8 (len:u16 entry[len])*count [digest:u64] (count <=
// MaxRosterPage, 1 <= len <= MaxRosterEntry, start+count <= total; the
// digest when the request carried have, nonzero; count 0 and digest =
// have: unchanged).
type RosterReply struct{ Roster RosterPage }

func (*RosterRequest) Op() Op   { return OpRoster }
func (*RosterRequest) request() {}
func (r *RosterRequest) appendTo(b []byte) ([]byte, error) {
	b = binary.BigEndian.AppendUint16(b, r.Start)
	if r.HasDigest || r.Have != 0 {
		b = binary.BigEndian.AppendUint64(b, r.Have)
	}
	return b, nil
}
func (r *RosterRequest) parse(b []byte) error {
	if len(b) != 2 && len(b) != 10 {
		return fmt.Errorf("want a 2-byte start index and an optional 8-byte digest, got %d bytes", len(b))
	}
	r.Start = binary.BigEndian.Uint16(b)
	if len(b) == 10 {
		r.Have, r.HasDigest = binary.BigEndian.Uint64(b[2:]), true
	}
	return nil
}

func (*RosterReply) Op() Op { return OpRoster }
func (*RosterReply) reply() {}
func (r *RosterReply) appendTo(b []byte) ([]byte, error) {
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
	return b, nil
}
func (r *RosterReply) parse(b []byte) error {
	if len(b) < 5 {
		return fmt.Errorf("%d bytes, want at least 5", len(b))
	}
	p := RosterPage{Total: binary.BigEndian.Uint16(b), Start: binary.BigEndian.Uint16(b[2:])}
	n, rest := int(b[4]), b[5:]
	if n > MaxRosterPage || int(p.Start)+n > int(p.Total) {
		return fmt.Errorf("%d entries from %d of %d (at most %d a page)", n, p.Start, p.Total, MaxRosterPage)
	}
	for i := 0; i < n; i++ {
		if len(rest) < 2 {
			return fmt.Errorf("entry %d truncated", i)
		}
		l := int(binary.BigEndian.Uint16(rest))
		if l == 0 || l > MaxRosterEntry || len(rest) < 2+l {
			return fmt.Errorf("entry %d of %d bytes (1..%d) with %d left", i, l, MaxRosterEntry, len(rest)-2)
		}
		p.Entries = append(p.Entries, append([]byte(nil), rest[2:2+l]...))
		rest = rest[2+l:]
	}
	switch len(rest) {
	case 0:
	case 8:
		if p.Digest = binary.BigEndian.Uint64(rest); p.Digest == 0 {
			return errors.New("digest 0")
		}
	default:
		return fmt.Errorf("%d trailing bytes (0, or an 8-byte digest)", len(rest))
	}
	r.Roster = p
	return nil
}

// rotateBodyLen is RotateRequest's body: old key, time, signature.
const rotateBodyLen = KeyLen + 8 + RotateSigLen

// RotateRequest carries the member state of the old key over to this
// session's key, with the old key's signed statement. Body: old_key[32]
// time:u64 signature[64] (exactly 104 bytes).
type RotateRequest struct{ Rotate Rotation }

// RotateReply accepts it. Body: empty.
type RotateReply struct{ empty }

func (*RotateRequest) Op() Op   { return OpRotate }
func (*RotateRequest) request() {}
func (r *RotateRequest) appendTo(b []byte) ([]byte, error) {
	if r.Rotate.Old.IsZero() || r.Rotate.Time == 0 {
		return nil, errors.New("rotate needs the old key and the statement's time")
	}
	b = append(b, r.Rotate.Old[:]...)
	b = binary.BigEndian.AppendUint64(b, r.Rotate.Time)
	return append(b, r.Rotate.Signature[:]...), nil
}
func (r *RotateRequest) parse(b []byte) error {
	if len(b) != rotateBodyLen {
		return fmt.Errorf("want %d bytes (old key, time, signature), got %d", rotateBodyLen, len(b))
	}
	var rot Rotation
	copy(rot.Old[:], b)
	rot.Time = binary.BigEndian.Uint64(b[KeyLen:])
	copy(rot.Signature[:], b[KeyLen+8:])
	if rot.Old.IsZero() || rot.Time == 0 {
		return errors.New("zero old key or time")
	}
	r.Rotate = rot
	return nil
}
func (*RotateReply) Op() Op { return OpRotate }
func (*RotateReply) reply() {}

// QuotaRequest asks how many NAT mappings the member holds and may hold
// (quota.per_member). Body: empty.
type QuotaRequest struct{ empty }

// QuotaReply is the member's mappings in use and its quota. Body:
// used:u32 quota:u32.
type QuotaReply struct{ Used, Quota uint32 }

func (*QuotaRequest) Op() Op   { return OpQuota }
func (*QuotaRequest) request() {}
func (*QuotaReply) Op() Op     { return OpQuota }
func (*QuotaReply) reply()     {}
func (r *QuotaReply) appendTo(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(b, r.Used), r.Quota), nil
}
func (r *QuotaReply) parse(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("want 8 bytes, got %d", len(b))
	}
	r.Used, r.Quota = binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
	return nil
}
