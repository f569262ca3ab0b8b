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
	OpQuota   Op = 12 // the member's NAT mappings in use and its quota
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

// Encap request actions (EncapRequest.Action).
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
// it holds (RosterRequest.Have) gets a page without entries when nothing
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
	if d, ok := operations[o]; ok {
		return d.name
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

// EncapGrant is an unencrypted VXLAN tunnel (opt-in on both sides, trusted
// networks only): the client's inner address, the relay's inner address
// (next hop), the relay's VXLAN endpoint, the member address the relay
// accepts encapsulated packets from (the control session's source: the
// client must send from it), the VNI and the inner MTU. ClientPrefix6 and
// Gateway6 are the optional IPv6 inside: the client's inner IPv6 address
// and the relay's (next hop), both set or both invalid; sent only to a
// request with EncapWantIPv6, by a relay with a vxlan subnet6.
type EncapGrant struct {
	ClientPrefix  netip.Prefix
	Gateway       netip.Addr
	Endpoint      netip.AddrPort
	Member        netip.Addr
	VNI           uint32 // 1..2^24-1
	MTU           uint16
	ClientPrefix6 netip.Prefix
	Gateway6      netip.Addr
}

// TunnelGrant is what a client needs to bring up a tunnel detour: its own
// tunnel address and the relay's WireGuard endpoint and key. The client's
// WireGuard key is its control-protocol static key (the member key).
type TunnelGrant struct {
	ClientPrefix netip.Prefix // the client's tunnel address and prefix length
	// ClientPrefix6 is the client's IPv6 tunnel address and prefix length
	// (invalid: none; sent only to a TunnelRequest with IPv6).
	ClientPrefix6 netip.Prefix
	Endpoint      netip.AddrPort
	PublicKey     Key // the relay's WireGuard public key
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
	if len(rest) != 10 && len(rest) != 10+encapInside6Len {
		return e, 0, fmt.Errorf("want vni, mtu and lease (10 bytes) after the member address, or %d with the IPv6 inside, got %d", 10+encapInside6Len, len(rest))
	}
	e.VNI = binary.BigEndian.Uint32(rest)
	e.MTU = binary.BigEndian.Uint16(rest[4:])
	lease := time.Duration(binary.BigEndian.Uint32(rest[6:])) * time.Second
	if rest = rest[10:]; len(rest) > 0 {
		if e.ClientPrefix6, e.Gateway6, err = parseEncapInside6(rest); err != nil {
			return e, 0, err
		}
	}
	return e, lease, e.Validate()
}

// encapInside6Len is the optional IPv6 inside of an encap grant:
// prefix6_addr (family 6) prefix6_len:u8 gateway6_addr (family 6).
const encapInside6Len = 17 + 1 + 17

func parseEncapInside6(b []byte) (netip.Prefix, netip.Addr, error) {
	a6, rest, err := parseAddr(b)
	if err != nil || !a6.Is6() || len(rest) < 1 {
		return netip.Prefix{}, netip.Addr{}, fmt.Errorf("IPv6 inner address: want family 6, 16 bytes and a length (%v)", err)
	}
	p, err := a6.Prefix(int(rest[0]))
	if err != nil || p.Bits() != int(rest[0]) {
		return netip.Prefix{}, netip.Addr{}, fmt.Errorf("bad IPv6 inner prefix length %d for %v", rest[0], a6)
	}
	gw, rest, err := parseAddr(rest[1:])
	if err != nil || !gw.Is6() || len(rest) != 0 {
		return netip.Prefix{}, netip.Addr{}, fmt.Errorf("IPv6 inner gateway: want family 6 and 16 bytes (%v)", err)
	}
	return netip.PrefixFrom(a6, p.Bits()), gw, nil
}

// appendEncapInside6 appends the optional IPv6 inside (nothing when the
// grant has none: the IPv4 body is what it always was).
func appendEncapInside6(b []byte, e EncapGrant) []byte {
	if !e.ClientPrefix6.IsValid() {
		return b
	}
	b = appendAddr(b, e.ClientPrefix6.Addr())
	b = append(b, byte(e.ClientPrefix6.Bits()))
	return appendAddr(b, e.Gateway6)
}

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// Validate checks a grant (received from the network, or about to be sent).
// The inner addresses are IPv4; the outer ones (endpoint and member) are
// both IPv4 or both IPv6 (VXLAN over an IPv6 underlay). An IPv6 outer
// address must be global unicast: a link-local one would need a scope the
// grant does not carry, and an IPv4-mapped one must be sent as IPv4.
func (e EncapGrant) Validate() error {
	ok4 := func(a netip.Addr) bool {
		return a.Is4() && !a.IsUnspecified() && !a.IsMulticast() && !a.IsLoopback() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	outer := func(a netip.Addr) bool {
		return ok4(a) || (a.Is6() && !a.Is4In6() && a.Zone() == "" && a.IsGlobalUnicast())
	}
	switch {
	case !e.ClientPrefix.IsValid() || !ok4(e.ClientPrefix.Addr()) || e.ClientPrefix.Bits() < 8:
		return fmt.Errorf("encap: client prefix %s is not a usable IPv4 prefix of /8 or longer", e.ClientPrefix)
	case !ok4(e.Gateway) || e.Gateway == e.ClientPrefix.Addr():
		return fmt.Errorf("encap: gateway %s is not a usable IPv4 address distinct from the client's", e.Gateway)
	case !outer(e.Endpoint.Addr()) || e.Endpoint.Port() == 0:
		return fmt.Errorf("encap: endpoint %s is not an IPv4 or global IPv6 address:port", e.Endpoint)
	case !outer(e.Member):
		return fmt.Errorf("encap: member address %s is not a usable IPv4 or global IPv6 address", e.Member)
	case e.Member.Is4() != e.Endpoint.Addr().Is4():
		return fmt.Errorf("encap: member address %s and endpoint %s are of different families", e.Member, e.Endpoint.Addr())
	case e.VNI == 0 || e.VNI > MaxVNI:
		return fmt.Errorf("encap: VNI %d out of range 1-%d", e.VNI, MaxVNI)
	case e.MTU < 576 || e.MTU > 9000:
		return fmt.Errorf("encap: MTU %d out of range 576-9000", e.MTU)
	}
	return e.validateInside6()
}

// validateInside6 checks the optional IPv6 inside: both addresses IPv6
// unicast (not IPv4-mapped, no zone, not link-local: the grant carries
// no scope), the gateway another address of the client's prefix, and an
// MTU IPv6 can use (1280: below it the kernel turns IPv6 off on the
// device).
func (e EncapGrant) validateInside6() error {
	ok6 := func(a netip.Addr) bool {
		return a.Is6() && !a.Is4In6() && a.Zone() == "" && !a.IsUnspecified() && !a.IsLoopback() &&
			!a.IsMulticast() && !a.IsLinkLocalUnicast()
	}
	p, gw := e.ClientPrefix6, e.Gateway6
	switch {
	case p == (netip.Prefix{}) && !gw.IsValid():
		return nil
	case !p.IsValid() || !ok6(p.Addr()) || p.Bits() < 8 || p.Bits() > 127:
		return fmt.Errorf("encap: IPv6 client prefix %s is not a usable IPv6 prefix of /8 to /127", p)
	case !ok6(gw) || gw == p.Addr() || !p.Contains(gw):
		return fmt.Errorf("encap: IPv6 gateway %s is not a usable IPv6 address of %s distinct from the client's", gw, p)
	case e.MTU < 1280:
		return fmt.Errorf("encap: MTU %d is below IPv6's minimum 1280, no IPv6 inside", e.MTU)
	}
	return nil
}
