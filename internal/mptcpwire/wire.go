// Package mptcpwire builds and parses IPv4/TCP and IPv6/TCP segments carrying MPTCP
// options (RFC 8684): the probes of `mpdetour path-check`, the quotes of
// ICMP errors they provoke, and the forged segments of the lab's attack
// suite.
//
// Written here rather than taken from a packet library: gopacket is not
// among the packages this project may use (neither in go.mod nor in the
// machine's package lists), golang.org/x/net (already a dependency) has
// IPv4 and ICMP but no TCP, and what is needed is small: one IPv4 header,
// one IPv6 header with the extension headers that may stand in front of
// TCP, one TCP header with options, checksums, and the six MPTCP option layouts
// used below. Every parser here takes untrusted bytes (packets from the
// network, quotes inside ICMP errors) and is fuzzed (FuzzParse*).
package mptcpwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// TCP option kinds used here.
const (
	OptEnd       = 0
	OptNOP       = 1
	OptMSS       = 2
	OptWScale    = 3
	OptSACKPerm  = 4
	OptTimestamp = 8
	OptMPTCP     = 30
)

// MPTCP option subtypes (RFC 8684 sec. 3).
const (
	MPCapable  = 0x0
	MPJoin     = 0x1
	DSS        = 0x2
	AddAddr    = 0x3
	RemoveAddr = 0x4
	MPPrio     = 0x5
	MPFail     = 0x6
	FastClose  = 0x7
	TCPRST     = 0x8
)

// TCP flags.
const (
	FIN = 0x01
	SYN = 0x02
	RST = 0x04
	PSH = 0x08
	ACK = 0x10
)

// Option is one TCP option: its kind and the bytes after kind and length
// (none for NOP and End).
type Option struct {
	Kind uint8
	Data []byte
}

// Subtype is the MPTCP subtype of an MPTCP option, or -1.
func (o Option) Subtype() int {
	if o.Kind != OptMPTCP || len(o.Data) == 0 {
		return -1
	}
	return int(o.Data[0] >> 4)
}

// Len is the option's length on the wire.
func (o Option) Len() int {
	if o.Kind == OptNOP || o.Kind == OptEnd {
		return 1
	}
	return 2 + len(o.Data)
}

// Equal says whether two options are byte for byte the same.
func (o Option) Equal(p Option) bool {
	return o.Kind == p.Kind && string(o.Data) == string(p.Data)
}

var subtypeNames = [...]string{"MP_CAPABLE", "MP_JOIN", "DSS", "ADD_ADDR", "REMOVE_ADDR", "MP_PRIO", "MP_FAIL", "MP_FASTCLOSE", "MP_TCPRST"}

// Name is a short name: MSS, SACK_PERM, MP_CAPABLE, kind-N, ...
func (o Option) Name() string {
	switch o.Kind {
	case OptEnd:
		return "EOL"
	case OptNOP:
		return "NOP"
	case OptMSS:
		return "MSS"
	case OptWScale:
		return "WSCALE"
	case OptSACKPerm:
		return "SACK_PERM"
	case 5:
		return "SACK"
	case OptTimestamp:
		return "TS"
	case OptMPTCP:
		if st := o.Subtype(); st >= 0 && st < len(subtypeNames) {
			return subtypeNames[st]
		}
		return fmt.Sprintf("MPTCP-subtype-%d", o.Subtype())
	}
	return fmt.Sprintf("kind-%d", o.Kind)
}

// String shows the option with its value where it is short.
func (o Option) String() string {
	switch {
	case o.Kind == OptMSS && len(o.Data) == 2:
		return fmt.Sprintf("MSS=%d", binary.BigEndian.Uint16(o.Data))
	case o.Kind == OptWScale && len(o.Data) == 1:
		return fmt.Sprintf("WSCALE=%d", o.Data[0])
	case o.Kind == OptEnd || o.Kind == OptNOP || o.Kind == OptSACKPerm:
		return o.Name()
	}
	return fmt.Sprintf("%s(%d)", o.Name(), o.Len())
}

// Segment is an IPv4 or IPv6 packet with a TCP segment, the fields this
// package reads and writes. The family is the addresses'.
type Segment struct {
	Src, Dst netip.Addr
	TTL      uint8 // IPv6: the hop limit
	TOS      uint8 // IPv6: the traffic class
	ID       uint16
	SrcPort  uint16
	DstPort  uint16
	Seq, Ack uint32
	Flags    uint8
	Window   uint16
	Options  []Option
	Payload  []byte
}

// FlagString shows TCP flags as S, SA, R, RA, ...
func FlagString(f uint8) string {
	var b strings.Builder
	for _, x := range []struct {
		bit uint8
		c   byte
	}{{SYN, 'S'}, {ACK, 'A'}, {FIN, 'F'}, {RST, 'R'}, {PSH, 'P'}} {
		if f&x.bit != 0 {
			b.WriteByte(x.c)
		}
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// MarshalOptions encodes options padded with NOPs to a multiple of 4 bytes
// (at most 40).
func MarshalOptions(opts []Option) ([]byte, error) {
	var b []byte
	for _, o := range opts {
		switch o.Kind {
		case OptEnd, OptNOP:
			b = append(b, o.Kind)
		default:
			if len(o.Data) > 38 {
				return nil, fmt.Errorf("option %s: %d data bytes, at most 38", o.Name(), len(o.Data))
			}
			b = append(b, o.Kind, byte(2+len(o.Data)))
			b = append(b, o.Data...)
		}
	}
	for len(b)%4 != 0 {
		b = append(b, OptNOP)
	}
	if len(b) > 40 {
		return nil, fmt.Errorf("TCP options take %d bytes, at most 40", len(b))
	}
	return b, nil
}

// Marshal encodes the segment as an IPv4 packet (IPv4 addresses) or an
// IPv6 packet (IPv6 addresses, no extension header), checksums included.
func (s *Segment) Marshal() ([]byte, error) {
	t, err := s.MarshalTCP()
	if err != nil {
		return nil, err
	}
	ttl := s.TTL
	if ttl == 0 {
		ttl = 64
	}
	if s.Src.Is6() {
		if len(t) > 65535 {
			return nil, errors.New("segment too large")
		}
		p := make([]byte, 40, 40+len(t))
		p[0] = 0x60 | s.TOS>>4
		p[1] = s.TOS << 4
		binary.BigEndian.PutUint16(p[4:], uint16(len(t)))
		p[6] = 6
		p[7] = ttl
		src, dst := s.Src.As16(), s.Dst.As16()
		copy(p[8:24], src[:])
		copy(p[24:40], dst[:])
		return append(p, t...), nil
	}
	total := 20 + len(t)
	if total > 65535 {
		return nil, errors.New("segment too large")
	}
	p := make([]byte, 20, total)
	p[0] = 0x45
	p[1] = s.TOS
	binary.BigEndian.PutUint16(p[2:], uint16(total))
	binary.BigEndian.PutUint16(p[4:], s.ID)
	binary.BigEndian.PutUint16(p[6:], 0x4000) // DF
	p[8] = ttl
	p[9] = 6
	src, dst := s.Src.As4(), s.Dst.As4()
	copy(p[12:16], src[:])
	copy(p[16:20], dst[:])
	binary.BigEndian.PutUint16(p[10:], ^sum(p[:20], 0))
	return append(p, t...), nil
}

// MarshalTCP encodes the TCP part alone, its checksum over the pseudo
// header of the addresses' family: what an IPv6 raw socket sends (the
// kernel writes the IPv6 header; the hop limit goes in a control message).
// Both addresses must be of one family; IPv4-mapped IPv6 addresses are
// refused (a probe is of one family on the wire).
func (s *Segment) MarshalTCP() ([]byte, error) {
	switch {
	case s.Src.Is4() && s.Dst.Is4():
	case s.Src.Is6() && s.Dst.Is6() && !s.Src.Is4In6() && !s.Dst.Is4In6():
	default:
		return nil, fmt.Errorf("addresses %v -> %v: not both IPv4 or both IPv6 (IPv4-mapped IPv6 refused)", s.Src, s.Dst)
	}
	ob, err := MarshalOptions(s.Options)
	if err != nil {
		return nil, err
	}
	tcpLen := 20 + len(ob) + len(s.Payload)
	if tcpLen > 65535-20 {
		return nil, errors.New("segment too large")
	}
	t := make([]byte, tcpLen)
	binary.BigEndian.PutUint16(t[0:], s.SrcPort)
	binary.BigEndian.PutUint16(t[2:], s.DstPort)
	binary.BigEndian.PutUint32(t[4:], s.Seq)
	binary.BigEndian.PutUint32(t[8:], s.Ack)
	t[12] = byte((20 + len(ob)) / 4 << 4)
	t[13] = s.Flags
	binary.BigEndian.PutUint16(t[14:], s.Window)
	copy(t[20:], ob)
	copy(t[20+len(ob):], s.Payload)
	binary.BigEndian.PutUint16(t[16:], ^sum(t, pseudo(s.Src, s.Dst, tcpLen)))
	return t, nil
}

// pseudo is the TCP pseudo header's sum (RFC 793; RFC 8200 sec. 8.1 for
// IPv6): both addresses, protocol 6 and the TCP length.
func pseudo(src, dst netip.Addr, tcpLen int) uint32 {
	var s uint32
	for _, a := range []netip.Addr{src, dst} {
		b := a.AsSlice()
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	s += 6 + uint32(tcpLen)
	return s
}

func sum(b []byte, s uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// ParseOptions decodes TCP option bytes. A truncated last option is an
// error (its bytes are reported), as is a length below 2.
func ParseOptions(b []byte) ([]Option, error) {
	var opts []Option
	for i := 0; i < len(b); {
		k := b[i]
		switch k {
		case OptEnd:
			// The rest is padding.
			opts = append(opts, Option{Kind: OptEnd})
			return opts, nil
		case OptNOP:
			opts = append(opts, Option{Kind: OptNOP})
			i++
			continue
		}
		if i+1 >= len(b) {
			return opts, fmt.Errorf("option kind %d at byte %d: no length byte", k, i)
		}
		l := int(b[i+1])
		if l < 2 {
			return opts, fmt.Errorf("option kind %d at byte %d: length %d below 2", k, i, l)
		}
		if i+l > len(b) {
			return opts, fmt.Errorf("option kind %d at byte %d: length %d runs past the %d option bytes", k, i, l, len(b))
		}
		opts = append(opts, Option{Kind: k, Data: append([]byte(nil), b[i+2:i+l]...)})
		i += l
	}
	return opts, nil
}

// ErrShort says a packet ended before a header did.
var ErrShort = errors.New("truncated packet")

// ParseIPv4 decodes an IPv4 packet holding TCP. With quote set the packet
// is the quote inside an ICMP error: its TCP part may be cut anywhere after
// the first 8 bytes (ports and sequence number, RFC 792), the IP total
// length may exceed what is there, checksums are not checked, and options
// that the cut truncated are simply absent (Truncated says so).
func ParseIPv4(b []byte, quote bool) (*Segment, bool, error) {
	if len(b) < 20 {
		return nil, false, fmt.Errorf("IPv4 header: %w (%d bytes)", ErrShort, len(b))
	}
	if b[0]>>4 != 4 {
		return nil, false, fmt.Errorf("IP version %d, not 4", b[0]>>4)
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || ihl > len(b) {
		return nil, false, fmt.Errorf("IPv4 header length %d: %w (%d bytes)", ihl, ErrShort, len(b))
	}
	if b[9] != 6 {
		return nil, false, fmt.Errorf("IP protocol %d, not TCP", b[9])
	}
	total := int(binary.BigEndian.Uint16(b[2:]))
	if total < ihl {
		return nil, false, fmt.Errorf("IPv4 total length %d below its header length %d", total, ihl)
	}
	switch {
	case total <= len(b):
		b = b[:total]
	case !quote:
		return nil, false, fmt.Errorf("IPv4 total length %d: %w (%d bytes)", total, ErrShort, len(b))
	}
	s := &Segment{TOS: b[1], ID: binary.BigEndian.Uint16(b[4:]), TTL: b[8]}
	s.Src = netip.AddrFrom4([4]byte(b[12:16]))
	s.Dst = netip.AddrFrom4([4]byte(b[16:20]))
	trunc, err := s.parseTCP(b[ihl:], quote)
	if err != nil {
		return nil, false, err
	}
	return s, trunc, nil
}

// IPv6 extension headers ParseIPv6 walks (RFC 8200 sec. 4; AH RFC 4302).
const (
	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6Fragment = 44
	ipv6ESP      = 50
	ipv6AH       = 51
	ipv6NoNext   = 59
	ipv6DstOpts  = 60
)

// maxExtHeaders bounds the walk (a chain of tiny headers is allowed by the
// RFC; a quote holds at most 1232 bytes of them anyway).
const maxExtHeaders = 16

// ParseIPv6 decodes an IPv6 packet holding TCP, after any hop-by-hop,
// routing, destination options and AH headers (the TCP header must be in
// the packet: a fragment other than the first, ESP or "no next header" is
// an error naming it). With quote set the packet is the quote inside an
// ICMPv6 error, cut as ParseIPv4 describes. TOS is the traffic class, TTL
// the hop limit.
func ParseIPv6(b []byte, quote bool) (*Segment, bool, error) {
	if len(b) < 40 {
		return nil, false, fmt.Errorf("IPv6 header: %w (%d bytes)", ErrShort, len(b))
	}
	if b[0]>>4 != 6 {
		return nil, false, fmt.Errorf("IP version %d, not 6", b[0]>>4)
	}
	plen := int(binary.BigEndian.Uint16(b[4:]))
	switch {
	case plen == 0:
		return nil, false, errors.New("IPv6 payload length 0 (jumbogram or empty): no TCP segment")
	case 40+plen <= len(b):
		b = b[:40+plen]
	case !quote:
		return nil, false, fmt.Errorf("IPv6 payload length %d: %w (%d bytes)", plen, ErrShort, len(b))
	}
	s := &Segment{TOS: b[0]<<4 | b[1]>>4, TTL: b[7]}
	s.Src = netip.AddrFrom16([16]byte(b[8:24]))
	s.Dst = netip.AddrFrom16([16]byte(b[24:40]))
	next, off := b[6], 40
	for n := 0; next != 6; n++ {
		if n == maxExtHeaders {
			return nil, false, fmt.Errorf("more than %d IPv6 extension headers", maxExtHeaders)
		}
		var l int
		switch next {
		case ipv6HopByHop, ipv6Routing, ipv6DstOpts:
			if off+2 > len(b) {
				return nil, false, fmt.Errorf("IPv6 extension header %d at byte %d: %w", next, off, ErrShort)
			}
			l = (int(b[off+1]) + 1) * 8
		case ipv6AH:
			if off+2 > len(b) {
				return nil, false, fmt.Errorf("IPv6 AH at byte %d: %w", off, ErrShort)
			}
			l = (int(b[off+1]) + 2) * 4
		case ipv6Fragment:
			if off+8 > len(b) {
				return nil, false, fmt.Errorf("IPv6 fragment header at byte %d: %w", off, ErrShort)
			}
			if binary.BigEndian.Uint16(b[off+2:])&^7 != 0 {
				return nil, false, errors.New("IPv6 fragment other than the first: no TCP header in it")
			}
			l = 8
		case ipv6ESP:
			return nil, false, errors.New("IPv6 ESP: the TCP header is encrypted")
		case ipv6NoNext:
			return nil, false, errors.New("IPv6 \"no next header\": no TCP segment")
		default:
			return nil, false, fmt.Errorf("IPv6 next header %d, not TCP", next)
		}
		if off+l > len(b) {
			return nil, false, fmt.Errorf("IPv6 extension header %d at byte %d, %d bytes: %w (%d bytes)", next, off, l, ErrShort, len(b))
		}
		next, off = b[off], off+l
	}
	trunc, err := s.parseTCP(b[off:], quote)
	if err != nil {
		return nil, false, err
	}
	return s, trunc, nil
}

// ParseTCP decodes a whole TCP segment without its IP header (what an
// IPv6 raw socket delivers), between the addresses given. The checksum is
// not checked (the kernel dropped segments with a bad one).
func ParseTCP(b []byte, src, dst netip.Addr) (*Segment, error) {
	s := &Segment{Src: src, Dst: dst}
	if _, err := s.parseTCP(b, false); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Segment) parseTCP(t []byte, quote bool) (truncated bool, err error) {
	if len(t) < 8 || (!quote && len(t) < 20) {
		return false, fmt.Errorf("TCP header: %w (%d bytes)", ErrShort, len(t))
	}
	s.SrcPort = binary.BigEndian.Uint16(t[0:])
	s.DstPort = binary.BigEndian.Uint16(t[2:])
	s.Seq = binary.BigEndian.Uint32(t[4:])
	if len(t) < 20 {
		return true, nil
	}
	s.Ack = binary.BigEndian.Uint32(t[8:])
	off := int(t[12]>>4) * 4
	s.Flags = t[13]
	s.Window = binary.BigEndian.Uint16(t[14:])
	if off < 20 {
		return false, fmt.Errorf("TCP data offset %d below 20", off)
	}
	if off > len(t) {
		if !quote {
			return false, fmt.Errorf("TCP data offset %d: %w (%d bytes)", off, ErrShort, len(t))
		}
		// Keep the options that are complete.
		s.Options, _ = ParseOptions(t[20:])
		return true, nil
	}
	s.Options, err = ParseOptions(t[20:off])
	if err != nil {
		return false, err
	}
	s.Payload = t[off:]
	return false, nil
}

// Find returns the first MPTCP option of the subtype.
func Find(opts []Option, subtype int) (Option, bool) {
	for _, o := range opts {
		if o.Subtype() == subtype {
			return o, true
		}
	}
	return Option{}, false
}

// Meaningful drops NOP and EOL padding, so that two option lists compare
// by content (a middlebox that overwrites an option with NOPs, as
// nftables' "reset tcp option" does, shows as that option missing).
func Meaningful(opts []Option) []Option {
	var r []Option
	for _, o := range opts {
		if o.Kind != OptNOP && o.Kind != OptEnd {
			r = append(r, o)
		}
	}
	return r
}

// The MPTCP options: builders and decoders.

// CapableSYN is MP_CAPABLE as a version-1 SYN carries it (RFC 8684 sec.
// 3.1: no key in the SYN), HMAC-SHA256, checksums not required.
func CapableSYN() Option {
	return Option{Kind: OptMPTCP, Data: []byte{MPCapable<<4 | 1, 0x01}}
}

// Capable is a decoded MP_CAPABLE.
type Capable struct {
	Version uint8
	Flags   uint8
	// Keys present: 0 (SYN), 1 (SYN/ACK: the sender's), 2 (third ACK).
	Keys          []uint64
	DataLevelLen  uint16 // with data (len 22/24)
	HasDataLength bool
}

// ParseCapable decodes an MP_CAPABLE option.
func ParseCapable(o Option) (Capable, error) {
	if o.Subtype() != MPCapable {
		return Capable{}, errors.New("not MP_CAPABLE")
	}
	d := o.Data
	if len(d) < 2 {
		return Capable{}, fmt.Errorf("MP_CAPABLE length %d below 4", o.Len())
	}
	c := Capable{Version: d[0] & 0x0f, Flags: d[1]}
	switch len(d) {
	case 2:
	case 10:
		c.Keys = []uint64{binary.BigEndian.Uint64(d[2:])}
	case 18, 20, 22:
		c.Keys = []uint64{binary.BigEndian.Uint64(d[2:]), binary.BigEndian.Uint64(d[10:])}
		if len(d) >= 20 {
			c.HasDataLength = true
			c.DataLevelLen = binary.BigEndian.Uint16(d[18:])
		}
	default:
		return Capable{}, fmt.Errorf("MP_CAPABLE length %d not one of 4, 12, 20, 22, 24", o.Len())
	}
	return c, nil
}

// JoinSYN is MP_JOIN as a SYN carries it: the receiver's token and the
// sender's random nonce.
func JoinSYN(addrID uint8, backup bool, token, nonce uint32) Option {
	d := make([]byte, 10)
	d[0] = MPJoin << 4
	if backup {
		d[0] |= 1
	}
	d[1] = addrID
	binary.BigEndian.PutUint32(d[2:], token)
	binary.BigEndian.PutUint32(d[6:], nonce)
	return Option{Kind: OptMPTCP, Data: d}
}

// JoinACK is MP_JOIN as the third ACK carries it: a 160-bit HMAC.
func JoinACK(hmac [20]byte) Option {
	d := make([]byte, 22)
	d[0] = MPJoin << 4
	copy(d[2:], hmac[:])
	return Option{Kind: OptMPTCP, Data: d}
}

// Join is a decoded MP_JOIN (the fields its length carries).
type Join struct {
	Backup bool
	AddrID uint8
	Token  uint32 // SYN
	Nonce  uint32 // SYN, SYN/ACK
	MAC    []byte // SYN/ACK (64 bits), ACK (160 bits)
	Stage  string // "SYN", "SYN/ACK" or "ACK"
}

// ParseJoin decodes an MP_JOIN option.
func ParseJoin(o Option) (Join, error) {
	if o.Subtype() != MPJoin {
		return Join{}, errors.New("not MP_JOIN")
	}
	d := o.Data
	j := Join{Backup: len(d) > 0 && d[0]&1 == 1}
	switch len(d) {
	case 10:
		j.Stage, j.AddrID = "SYN", d[1]
		j.Token, j.Nonce = binary.BigEndian.Uint32(d[2:]), binary.BigEndian.Uint32(d[6:])
	case 14:
		j.Stage, j.AddrID = "SYN/ACK", d[1]
		j.MAC = append([]byte(nil), d[2:10]...)
		j.Nonce = binary.BigEndian.Uint32(d[10:])
	case 22:
		j.Stage = "ACK"
		j.MAC = append([]byte(nil), d[2:22]...)
	default:
		return Join{}, fmt.Errorf("MP_JOIN length %d not one of 12, 16, 24", o.Len())
	}
	return j, nil
}

// AddAddrOpt is ADD_ADDR for an IPv4 address with its truncated HMAC
// (echo false) or as an echo (no HMAC); port 0 = none.
func AddAddrOpt(id uint8, addr netip.Addr, port uint16, echo bool, hmac uint64) Option {
	a := addr.As4()
	d := []byte{AddAddr << 4, id, a[0], a[1], a[2], a[3]}
	if echo {
		d[0] |= 1
	}
	if port != 0 {
		d = binary.BigEndian.AppendUint16(d, port)
	}
	if !echo {
		d = binary.BigEndian.AppendUint64(d, hmac)
	}
	return Option{Kind: OptMPTCP, Data: d}
}

// AddrAnnounce is a decoded IPv4 ADD_ADDR.
type AddrAnnounce struct {
	Echo    bool
	ID      uint8
	Addr    netip.Addr
	Port    uint16
	HMAC    uint64
	HasHMAC bool
}

// ParseAddAddr decodes an IPv4 ADD_ADDR (IPv6 ones are reported as such).
func ParseAddAddr(o Option) (AddrAnnounce, error) {
	if o.Subtype() != AddAddr {
		return AddrAnnounce{}, errors.New("not ADD_ADDR")
	}
	d := o.Data
	a := AddrAnnounce{Echo: len(d) > 0 && d[0]&1 == 1}
	switch len(d) {
	case 6, 8, 14, 16:
	case 18, 20, 26, 28:
		return AddrAnnounce{}, errors.New("ADD_ADDR with an IPv6 address: not decoded")
	default:
		return AddrAnnounce{}, fmt.Errorf("ADD_ADDR length %d not valid", o.Len())
	}
	a.ID = d[1]
	a.Addr = netip.AddrFrom4([4]byte(d[2:6]))
	rest := d[6:]
	if len(rest) == 2 || len(rest) == 10 {
		a.Port = binary.BigEndian.Uint16(rest)
		rest = rest[2:]
	}
	if len(rest) == 8 {
		a.HMAC, a.HasHMAC = binary.BigEndian.Uint64(rest), true
	}
	return a, nil
}

// RemoveAddrOpt is REMOVE_ADDR for the given address ids (1 to 36 of them).
func RemoveAddrOpt(ids ...uint8) Option {
	return Option{Kind: OptMPTCP, Data: append([]byte{RemoveAddr << 4}, ids...)}
}
