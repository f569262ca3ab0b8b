// Package roster is relay discovery for a Detour Collective: relays form a
// cluster over hashicorp/memberlist (SWIM failure detection and gossip;
// this package writes no membership protocol of its own) and each carries
// a signed roster entry as its node metadata: its control-protocol
// addresses, capacity, the detour kinds it offers, its load and a region
// label, signed with the relay's key, next to the collective certificate
// (role relay) that names that key. Entries that do not verify are dropped
// and counted; a relay that leaves or dies leaves the roster.
package roster

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Kinds is the set of detour kinds a relay offers.
type Kinds uint8

// Kind bits (wire format: never renumber).
const (
	KindNAT     Kinds = 1 << iota // NAT detours (OpGrant)
	KindTunnel                    // tunnel detours (OpTunnel)
	KindConvert                   // RFC 8803 converter (OpConvert)
	kindMask    = KindNAT | KindTunnel | KindConvert
)

func (k Kinds) String() string {
	var s []string
	for _, x := range []struct {
		k Kinds
		n string
	}{{KindNAT, "nat"}, {KindTunnel, "tunnel"}, {KindConvert, "convert"}} {
		if k&x.k != 0 {
			s = append(s, x.n)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// Entry is one relay's roster entry.
type Entry struct {
	Issued   time.Time        // millisecond precision; a newer entry replaces an older one
	Capacity uint32           // detours the relay offers at once (its global quota), >= 1
	Load     uint32           // detours in use when it signed
	Kinds    Kinds            // at least one
	Region   string           // 0-32 bytes of printable UTF-8
	Addrs    []netip.AddrPort // control-protocol addresses (UDP), 1-4
	Cert     *collective.Certificate
	// Signature: XEdDSA by Cert.Member over the encoding (xeddsa.go).
	Signature [64]byte
}

// Key is the relay's control-protocol public key (the one its certificate
// names and that signed the entry).
func (e *Entry) Key() proto.Key { return e.Cert.Member }

// Name is the relay's name from its certificate.
func (e *Entry) Name() string { return e.Cert.Name }

// Limits of the binary form. MaxEntryLen stays under memberlist's node
// metadata limit (512 bytes).
const (
	entryVersion = 1
	entryDomain  = "mpdetour roster entry v1\x00"
	MaxRegion    = 32
	MaxAddrs     = 4
	maxCert      = 256
	MaxEntryLen  = 512
	sigLen       = 64
)

// body is the signed part of the binary form:
//
//	version:u8 issued_ms:u64 capacity:u32 load:u32 kinds:u8
//	region_len:u8 region naddrs:u8 (family:u8 addr[4|16] port:u16)*naddrs
//	cert_len:u16 cert
//
// followed by the signature (64 bytes). Big-endian.
func (e *Entry) body() ([]byte, error) {
	if e.Cert == nil {
		return nil, errors.New("roster entry: no certificate")
	}
	if err := e.validate(); err != nil {
		return nil, err
	}
	cert := e.Cert.Bytes()
	if len(cert) > maxCert {
		return nil, fmt.Errorf("roster entry: certificate of %d bytes exceeds %d", len(cert), maxCert)
	}
	b := make([]byte, 0, MaxEntryLen)
	b = append(b, entryVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(e.Issued.UnixMilli()))
	b = binary.BigEndian.AppendUint32(b, e.Capacity)
	b = binary.BigEndian.AppendUint32(b, e.Load)
	b = append(b, byte(e.Kinds), byte(len(e.Region)))
	b = append(b, e.Region...)
	b = append(b, byte(len(e.Addrs)))
	for _, a := range e.Addrs {
		ip := a.Addr().Unmap()
		if ip.Is4() {
			v := ip.As4()
			b = append(append(b, 4), v[:]...)
		} else {
			v := ip.As16()
			b = append(append(b, 6), v[:]...)
		}
		b = binary.BigEndian.AppendUint16(b, a.Port())
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(cert)))
	return append(b, cert...), nil
}

func (e *Entry) validate() error {
	switch {
	case e.Capacity == 0:
		return errors.New("roster entry: capacity 0")
	case e.Kinds == 0 || e.Kinds&^kindMask != 0:
		return fmt.Errorf("roster entry: kinds %#x unknown or empty", uint8(e.Kinds))
	case len(e.Addrs) == 0 || len(e.Addrs) > MaxAddrs:
		return fmt.Errorf("roster entry: %d addresses, want 1-%d", len(e.Addrs), MaxAddrs)
	}
	if err := ValidRegion(e.Region); err != nil {
		return fmt.Errorf("roster entry: %w", err)
	}
	for _, a := range e.Addrs {
		if !a.IsValid() || a.Port() == 0 || a.Addr().Unmap().IsUnspecified() {
			return fmt.Errorf("roster entry: address %v is not a usable address:port", a)
		}
	}
	return nil
}

// ValidRegion checks a region label: 0-32 bytes of printable UTF-8.
func ValidRegion(s string) error {
	if len(s) > MaxRegion {
		return fmt.Errorf("region of %d bytes exceeds %d", len(s), MaxRegion)
	}
	if !utf8.ValidString(s) {
		return errors.New("region is not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("region contains control character %U", r)
		}
	}
	return nil
}

// Sign fills Issued's signature with the relay's private key priv, which
// must be the key the certificate names.
func (e *Entry) Sign(priv proto.Key) error {
	if e.Cert == nil || priv.Public() != e.Cert.Member {
		return errors.New("roster entry: the certificate is not for this relay's key")
	}
	e.Issued = e.Issued.Truncate(time.Millisecond)
	b, err := e.body()
	if err != nil {
		return err
	}
	sig, err := xSign(priv, append([]byte(entryDomain), b...))
	if err != nil {
		return err
	}
	copy(e.Signature[:], sig)
	return nil
}

// Bytes is the binary form (node metadata, control-protocol roster pages).
func (e *Entry) Bytes() ([]byte, error) {
	b, err := e.body()
	if err != nil {
		return nil, err
	}
	return append(b, e.Signature[:]...), nil
}

// Parse decodes the binary form of untrusted bytes: it checks the format
// only (Verify checks signatures and dates).
func Parse(b []byte) (*Entry, error) {
	if len(b) > MaxEntryLen {
		return nil, fmt.Errorf("roster entry: %d bytes exceed %d", len(b), MaxEntryLen)
	}
	const fixed = 1 + 8 + 4 + 4 + 1 + 1
	if len(b) < fixed+1+2+sigLen {
		return nil, fmt.Errorf("roster entry: %d bytes, too short", len(b))
	}
	if b[0] != entryVersion {
		return nil, fmt.Errorf("roster entry: version %d, want %d", b[0], entryVersion)
	}
	e := &Entry{
		Issued:   time.UnixMilli(int64(binary.BigEndian.Uint64(b[1:]))).UTC(),
		Capacity: binary.BigEndian.Uint32(b[9:]),
		Load:     binary.BigEndian.Uint32(b[13:]),
		Kinds:    Kinds(b[17]),
	}
	body := b[:len(b)-sigLen]
	copy(e.Signature[:], b[len(b)-sigLen:])
	rest := body[fixed:]
	n := int(b[18])
	if n > MaxRegion || len(rest) < n {
		return nil, fmt.Errorf("roster entry: region of %d bytes (max %d) in %d bytes", n, MaxRegion, len(rest))
	}
	e.Region, rest = string(rest[:n]), rest[n:]
	if len(rest) < 1 {
		return nil, errors.New("roster entry: truncated before the addresses")
	}
	n, rest = int(rest[0]), rest[1:]
	if n == 0 || n > MaxAddrs {
		return nil, fmt.Errorf("roster entry: %d addresses, want 1-%d", n, MaxAddrs)
	}
	for i := 0; i < n; i++ {
		var ip netip.Addr
		switch {
		case len(rest) >= 7 && rest[0] == 4:
			ip, rest = netip.AddrFrom4([4]byte(rest[1:5])), rest[5:]
		case len(rest) >= 19 && rest[0] == 6:
			ip, rest = netip.AddrFrom16([16]byte(rest[1:17])), rest[17:]
			if ip.Is4In6() {
				return nil, fmt.Errorf("roster entry: address %d: IPv4-mapped address must use family 4", i)
			}
		default:
			return nil, fmt.Errorf("roster entry: address %d truncated or of unknown family", i)
		}
		e.Addrs = append(e.Addrs, netip.AddrPortFrom(ip, binary.BigEndian.Uint16(rest)))
		rest = rest[2:]
	}
	if len(rest) < 2 {
		return nil, errors.New("roster entry: truncated before the certificate")
	}
	n, rest = int(binary.BigEndian.Uint16(rest)), rest[2:]
	if n > maxCert || len(rest) != n {
		return nil, fmt.Errorf("roster entry: certificate of %d bytes (max %d) with %d bytes left", n, maxCert, len(rest))
	}
	c, err := collective.ParseCertificateBytes(rest)
	if err != nil {
		return nil, fmt.Errorf("roster entry: %w", err)
	}
	e.Cert = c
	if err := e.validate(); err != nil {
		return nil, err
	}
	return e, nil
}

// Refusal reasons of Verify besides the certificate's (collective.Err*);
// Reason maps any of them to a stable metrics label.
var (
	ErrEntryForged = errors.New("entry signature does not verify")
	ErrFuture      = errors.New("entry issued in the future")
)

// MaxSkew is how far in the future an entry's issue time may lie (clocks
// of relays differ).
const MaxSkew = time.Minute

// Verify checks the entry at time now: its certificate (the authority's,
// valid, not revoked, role relay) and its signature by the key the
// certificate names.
func (e *Entry) Verify(t *collective.Trust, now time.Time) error {
	if _, err := t.CheckBytes(e.Cert.Bytes(), e.Cert.Member, collective.RoleRelay, now); err != nil {
		return fmt.Errorf("certificate of %q: %w", e.Cert.Name, err)
	}
	b, err := e.body()
	if err != nil {
		return err
	}
	if !xVerify(e.Cert.Member, append([]byte(entryDomain), b...), e.Signature[:]) {
		return ErrEntryForged
	}
	if e.Issued.After(now.Add(MaxSkew)) {
		return fmt.Errorf("%w (%s)", ErrFuture, e.Issued.Format(time.RFC3339))
	}
	return nil
}

// Reason is a short stable label for a Parse or Verify error (metrics).
func Reason(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrEntryForged):
		return "forged"
	case errors.Is(err, collective.ErrForged):
		return "certificate-forged"
	case errors.Is(err, collective.ErrExpired), errors.Is(err, collective.ErrNotYetValid):
		return "certificate-dates"
	case errors.Is(err, collective.ErrRevoked):
		return "revoked"
	case errors.Is(err, collective.ErrRole):
		return "not-a-relay"
	case errors.Is(err, ErrFuture):
		return "future"
	case errors.Is(err, errNameMismatch):
		return "name-mismatch"
	}
	return "malformed"
}

var errNameMismatch = errors.New("node name is not the entry's relay key")

// Refusal reasons besides Reason's: gossip packets and streams memberlist
// dropped because they were not sealed with the cluster's gossip secret;
// metadata longer than an entry can be; an entry not newer than the one
// held for its relay (replayed or reordered).
const (
	ReasonUnauthenticated = "unauthenticated"
	ReasonOversized       = "oversized"
	ReasonStale           = "stale"
)

// NodeName is the memberlist node name of a relay: its public key in
// base64url, so an entry can only be carried by the node named for its key.
func NodeName(k proto.Key) string {
	// base64url without padding: the standard alphabet's encoding with
	// + and / replaced and = trimmed (the name's original definition; a
	// Replacer built per call cost 20 % of learn at 1,000 relays).
	return "relay-" + base64.RawURLEncoding.EncodeToString(k[:])
}
