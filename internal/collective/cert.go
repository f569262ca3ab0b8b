// Package collective is the membership of a Detour Collective: an authority
// (an Ed25519 key held offline by whoever runs the collective) signs member
// certificates that bind a member's control-protocol key (the Curve25519
// key of internal/proto) to a name, roles and a validity period, and signs
// revocation lists. A relay that trusts the authority accepts any valid,
// unexpired, unrevoked certificate instead of a list of keys.
//
// Encoding. Certificates and revocation lists are small fixed-layout binary
// records signed with Ed25519 over a domain-separated message, carried as
// one line of text ("mpdetour-cert-v1:" + base64) so that they fit in a
// config file, a command line or a control-protocol message. X.509 was
// considered and left: its parsers are large attack surface for a record of
// six fields, and nothing here needs its chains or extensions (the same
// reasoning as WireGuard's and Tailscale's node keys). The parsers are
// strict (exact lengths, no trailing bytes, known versions and roles only)
// and fuzzed.
package collective

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// Roles a member may hold.
type Roles uint8

// Role bits.
const (
	RoleClient Roles = 1 << iota // may ask relays for detours
	RoleRelay                    // may serve as a relay (appear in the roster)
	roleMask   = RoleClient | RoleRelay
)

func (r Roles) String() string {
	var s []string
	if r&RoleClient != 0 {
		s = append(s, "client")
	}
	if r&RoleRelay != 0 {
		s = append(s, "relay")
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// ParseRoles parses "client", "relay" or "client,relay".
func ParseRoles(s string) (Roles, error) {
	var r Roles
	for _, p := range strings.Split(s, ",") {
		switch strings.TrimSpace(p) {
		case "client":
			r |= RoleClient
		case "relay":
			r |= RoleRelay
		default:
			return 0, fmt.Errorf("role %q is not client or relay", p)
		}
	}
	return r, nil
}

// Certificate is a signed member certificate.
type Certificate struct {
	Serial    uint64
	Roles     Roles
	NotBefore time.Time // second precision
	NotAfter  time.Time
	Member    proto.Key // the member's public control-protocol key
	Name      string    // 1-64 bytes of printable UTF-8
	Signature [ed25519.SignatureSize]byte
}

const (
	certVersion  = 1
	certPrefix   = "mpdetour-cert-v1:"
	certDomain   = "mpdetour collective certificate v1\x00"
	certFixedLen = 1 + 1 + 8 + 8 + 8 + proto.KeyLen + 1 // version roles serial nb na key namelen
	maxName      = 64
)

func (c *Certificate) body() []byte {
	b := make([]byte, 0, certFixedLen+len(c.Name))
	b = append(b, certVersion, byte(c.Roles))
	b = binary.BigEndian.AppendUint64(b, c.Serial)
	b = binary.BigEndian.AppendUint64(b, uint64(c.NotBefore.Unix()))
	b = binary.BigEndian.AppendUint64(b, uint64(c.NotAfter.Unix()))
	b = append(b, c.Member[:]...)
	b = append(b, byte(len(c.Name)))
	return append(b, c.Name...)
}

func signed(domain string, body []byte) []byte {
	return append([]byte(domain), body...)
}

// String is the certificate's one-line text form.
func (c *Certificate) String() string {
	b := append(c.body(), c.Signature[:]...)
	return certPrefix + base64.StdEncoding.EncodeToString(b)
}

func validName(s string) error {
	if len(s) == 0 || len(s) > maxName {
		return fmt.Errorf("name must be 1-%d bytes, got %d", maxName, len(s))
	}
	if !utf8.ValidString(s) {
		return errors.New("name is not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("name contains control character %U", r)
		}
	}
	return nil
}

// ParseCertificate decodes the text form; it checks the format, not the
// signature or the dates (Verify does).
func ParseCertificate(s string) (*Certificate, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, certPrefix) {
		return nil, fmt.Errorf("certificate: does not start with %q", certPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s[len(certPrefix):])
	if err != nil {
		return nil, fmt.Errorf("certificate: not base64: %w", err)
	}
	return ParseCertificateBytes(b)
}

// Bytes is the certificate's binary form (what the control protocol
// carries: OpCertify).
func (c *Certificate) Bytes() []byte { return append(c.body(), c.Signature[:]...) }

// ParseCertificateBytes decodes the binary form (untrusted bytes); like
// ParseCertificate it checks the format only.
func ParseCertificateBytes(b []byte) (*Certificate, error) {
	if len(b) < certFixedLen+1+ed25519.SignatureSize {
		return nil, fmt.Errorf("certificate: %d bytes, too short", len(b))
	}
	if b[0] != certVersion {
		return nil, fmt.Errorf("certificate: version %d, want %d", b[0], certVersion)
	}
	c := &Certificate{Roles: Roles(b[1])}
	if c.Roles == 0 || c.Roles&^roleMask != 0 {
		return nil, fmt.Errorf("certificate: roles %#x unknown", b[1])
	}
	c.Serial = binary.BigEndian.Uint64(b[2:])
	c.NotBefore = time.Unix(int64(binary.BigEndian.Uint64(b[10:])), 0).UTC()
	c.NotAfter = time.Unix(int64(binary.BigEndian.Uint64(b[18:])), 0).UTC()
	copy(c.Member[:], b[26:26+proto.KeyLen])
	n := int(b[certFixedLen-1])
	if len(b) != certFixedLen+n+ed25519.SignatureSize {
		return nil, fmt.Errorf("certificate: %d bytes, want %d for a %d-byte name", len(b), certFixedLen+n+ed25519.SignatureSize, n)
	}
	c.Name = string(b[certFixedLen : certFixedLen+n])
	if err := validName(c.Name); err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if c.Member.IsZero() {
		return nil, errors.New("certificate: member key is all zeros")
	}
	if !c.NotAfter.After(c.NotBefore) {
		return nil, fmt.Errorf("certificate: not_after %s is not after not_before %s", c.NotAfter, c.NotBefore)
	}
	copy(c.Signature[:], b[certFixedLen+n:])
	return c, nil
}

// Authority is the collective's signing key.
type Authority struct {
	key ed25519.PrivateKey
}

// NewAuthority makes a new authority key.
func NewAuthority() (*Authority, error) {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return &Authority{key: k}, nil
}

const (
	authPrivPrefix = "mpdetour-authority-private-v1:"
	authPubPrefix  = "mpdetour-authority-v1:"
)

// String is the private key's text form (keep it offline).
func (a *Authority) String() string {
	return authPrivPrefix + base64.StdEncoding.EncodeToString(a.key.Seed())
}

// Public is the authority's public key, which relays and agents trust.
func (a *Authority) Public() AuthorityKey {
	var k AuthorityKey
	copy(k[:], a.key.Public().(ed25519.PublicKey))
	return k
}

// ParseAuthority decodes a private authority key.
func ParseAuthority(s string) (*Authority, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, authPrivPrefix) {
		return nil, fmt.Errorf("authority key: does not start with %q", authPrivPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s[len(authPrivPrefix):])
	if err != nil || len(b) != ed25519.SeedSize {
		return nil, errors.New("authority key: not a base64 Ed25519 seed of 32 bytes")
	}
	return &Authority{key: ed25519.NewKeyFromSeed(b)}, nil
}

// AuthorityKey is an authority's public key.
type AuthorityKey [ed25519.PublicKeySize]byte

func (k AuthorityKey) String() string {
	return authPubPrefix + base64.StdEncoding.EncodeToString(k[:])
}

// ParseAuthorityKey decodes a public authority key.
func ParseAuthorityKey(s string) (AuthorityKey, error) {
	var k AuthorityKey
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, authPubPrefix) {
		return k, fmt.Errorf("authority public key: does not start with %q", authPubPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s[len(authPubPrefix):])
	if err != nil || len(b) != ed25519.PublicKeySize {
		return k, errors.New("authority public key: not a base64 Ed25519 key of 32 bytes")
	}
	copy(k[:], b)
	return k, nil
}

// Issue signs a certificate for member. A random serial identifies it in
// revocation lists.
func (a *Authority) Issue(member proto.Key, name string, roles Roles, notBefore, notAfter time.Time) (*Certificate, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if roles == 0 || roles&^roleMask != 0 {
		return nil, fmt.Errorf("roles %v invalid", roles)
	}
	if member.IsZero() {
		return nil, errors.New("member key is all zeros")
	}
	nb, na := notBefore.Truncate(time.Second), notAfter.Truncate(time.Second)
	if !na.After(nb) {
		return nil, fmt.Errorf("not_after %s is not after not_before %s", na, nb)
	}
	var serial [8]byte
	if _, err := rand.Read(serial[:]); err != nil {
		return nil, err
	}
	c := &Certificate{Serial: binary.BigEndian.Uint64(serial[:]), Roles: roles, NotBefore: nb.UTC(), NotAfter: na.UTC(), Member: member, Name: name}
	copy(c.Signature[:], ed25519.Sign(a.key, signed(certDomain, c.body())))
	return c, nil
}

// Refusal reasons of Verify, stable for logs and metrics labels.
var (
	ErrForged      = errors.New("signature does not verify (forged, or another authority's)")
	ErrNotYetValid = errors.New("not yet valid")
	ErrExpired     = errors.New("expired")
	ErrRevoked     = errors.New("revoked")
	ErrRole        = errors.New("role not granted")
	ErrWrongMember = errors.New("certificate is for another key")
	// ErrCRLForged: a revocation list whose signature does not verify
	// under the trusted authority (forged, altered or another authority's).
	ErrCRLForged = errors.New("revocation list signature does not verify (forged, or another authority's)")
	// ErrCRLStale: a validly signed list that is not newer than the one held.
	ErrCRLStale = errors.New("revocation list is not newer than the current one")
)

// Verify checks the certificate against the authority at time now, the
// revocation list (nil: none) and, when need is not 0, the roles needed.
func (c *Certificate) Verify(auth AuthorityKey, now time.Time, crl *RevocationList, need Roles) error {
	if !ed25519.Verify(auth[:], signed(certDomain, c.body()), c.Signature[:]) {
		return ErrForged
	}
	switch {
	case now.Before(c.NotBefore):
		return fmt.Errorf("%w (from %s)", ErrNotYetValid, c.NotBefore.Format(time.RFC3339))
	case !now.Before(c.NotAfter):
		return fmt.Errorf("%w (%s)", ErrExpired, c.NotAfter.Format(time.RFC3339))
	case crl != nil && crl.Revoked(c.Serial):
		return ErrRevoked
	case c.Roles&need != need:
		return fmt.Errorf("%w: has %v, needs %v", ErrRole, c.Roles, need)
	}
	return nil
}

// RevocationList is a signed list of revoked certificate serials. Seq grows
// with every list the authority signs, so a relay never goes back to an
// older list.
type RevocationList struct {
	Seq       uint64
	Issued    time.Time
	Serials   []uint64 // sorted, unique
	Signature [ed25519.SignatureSize]byte
}

const (
	crlVersion  = 1
	crlPrefix   = "mpdetour-crl-v1:"
	crlDomain   = "mpdetour collective revocation list v1\x00"
	crlFixedLen = 1 + 8 + 8 + 4
	maxRevoked  = 1 << 20
)

func (l *RevocationList) body() []byte {
	b := make([]byte, 0, crlFixedLen+8*len(l.Serials))
	b = append(b, crlVersion)
	b = binary.BigEndian.AppendUint64(b, l.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(l.Issued.Unix()))
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Serials)))
	for _, s := range l.Serials {
		b = binary.BigEndian.AppendUint64(b, s)
	}
	return b
}

// String is the list's text form.
func (l *RevocationList) String() string {
	return crlPrefix + base64.StdEncoding.EncodeToString(l.Bytes())
}

// Bytes is the list's binary form (what the text form carries in base64).
func (l *RevocationList) Bytes() []byte {
	return append(l.body(), l.Signature[:]...)
}

// Revoked says whether serial is on the list.
func (l *RevocationList) Revoked(serial uint64) bool {
	_, found := slices.BinarySearch(l.Serials, serial)
	return found
}

// Revoke returns a new list signed by a with serials added and Seq+1
// (prev nil: the first list).
func (a *Authority) Revoke(prev *RevocationList, now time.Time, serials ...uint64) *RevocationList {
	l := &RevocationList{Issued: now.Truncate(time.Second).UTC()}
	if prev != nil {
		l.Seq = prev.Seq
		l.Serials = append(l.Serials, prev.Serials...)
	}
	l.Seq++
	l.Serials = append(l.Serials, serials...)
	slices.Sort(l.Serials)
	l.Serials = slices.Compact(l.Serials)
	copy(l.Signature[:], ed25519.Sign(a.key, signed(crlDomain, l.body())))
	return l
}

// ParseRevocationList decodes and verifies a list signed by auth.
func ParseRevocationList(s string, auth AuthorityKey) (*RevocationList, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, crlPrefix) {
		return nil, fmt.Errorf("revocation list: does not start with %q", crlPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s[len(crlPrefix):])
	if err != nil {
		return nil, fmt.Errorf("revocation list: not base64: %w", err)
	}
	return ParseRevocationListBytes(b, auth)
}

// ParseRevocationListBytes decodes and verifies the binary form (gossip).
// A list that does not verify under auth fails with ErrCRLForged; any other
// error means the bytes are malformed.
func ParseRevocationListBytes(b []byte, auth AuthorityKey) (*RevocationList, error) {
	if len(b) < crlFixedLen+ed25519.SignatureSize {
		return nil, fmt.Errorf("revocation list: %d bytes, too short", len(b))
	}
	if b[0] != crlVersion {
		return nil, fmt.Errorf("revocation list: version %d, want %d", b[0], crlVersion)
	}
	n := binary.BigEndian.Uint32(b[17:])
	if n > maxRevoked || len(b) != crlFixedLen+8*int(n)+ed25519.SignatureSize {
		return nil, fmt.Errorf("revocation list: %d bytes do not hold %d serials", len(b), n)
	}
	body := b[:crlFixedLen+8*int(n)]
	if !ed25519.Verify(auth[:], signed(crlDomain, body), b[len(body):]) {
		return nil, ErrCRLForged
	}
	l := &RevocationList{Seq: binary.BigEndian.Uint64(b[1:]), Issued: time.Unix(int64(binary.BigEndian.Uint64(b[9:])), 0).UTC()}
	for i := 0; i < int(n); i++ {
		l.Serials = append(l.Serials, binary.BigEndian.Uint64(b[crlFixedLen+8*i:]))
	}
	if !slices.IsSorted(l.Serials) || len(slices.Compact(slices.Clone(l.Serials))) != len(l.Serials) {
		return nil, errors.New("revocation list: serials not sorted and unique")
	}
	copy(l.Signature[:], b[len(body):])
	if !bytes.Equal(l.body(), body) {
		return nil, errors.New("revocation list: does not re-encode identically")
	}
	return l, nil
}

// Trust is what a relay or agent holds: the authority it trusts and the
// newest revocation list it has seen. Safe for concurrent use.
type Trust struct {
	auth AuthorityKey
	mu   sync.Mutex
	crl  *RevocationList
}

// NewTrust trusts auth, with no revocations yet.
func NewTrust(auth AuthorityKey) *Trust {
	return &Trust{auth: auth}
}

// Authority is the trusted authority's key.
func (t *Trust) Authority() AuthorityKey { return t.auth }

// UpdateCRL installs a revocation list (text form) signed by the authority;
// a list older than (or as old as) the current one is refused, so a replayed
// old list cannot un-revoke anybody.
func (t *Trust) UpdateCRL(text string) error {
	l, err := ParseRevocationList(text, t.auth)
	if err != nil {
		return err
	}
	_, err = t.Install(l)
	return err
}

// Install makes l (verified by the caller, e.g. ParseRevocationListBytes
// with this Trust's authority) the current list if it is newer: installed
// is true then. The very list held already is no error (installed false);
// an older one, or another list of the same sequence number, fails with
// ErrCRLStale.
func (t *Trust) Install(l *RevocationList) (installed bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crl != nil && l.Seq <= t.crl.Seq {
		if l.Seq == t.crl.Seq && bytes.Equal(l.Signature[:], t.crl.Signature[:]) {
			return false, nil // the same list again
		}
		return false, fmt.Errorf("%w: seq %d, current %d", ErrCRLStale, l.Seq, t.crl.Seq)
	}
	t.crl = l
	return true, nil
}

// CRL is the current revocation list (nil: none yet).
func (t *Trust) CRL() *RevocationList {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.crl
}

// Check parses a certificate presented for member and verifies it now.
func (t *Trust) Check(text string, member proto.Key, need Roles, now time.Time) (*Certificate, error) {
	c, err := ParseCertificate(text)
	if err != nil {
		return nil, err
	}
	return t.verify(c, member, need, now)
}

// CheckBytes is Check for the binary form (OpCertify).
func (t *Trust) CheckBytes(b []byte, member proto.Key, need Roles, now time.Time) (*Certificate, error) {
	c, err := ParseCertificateBytes(b)
	if err != nil {
		return nil, err
	}
	return t.verify(c, member, need, now)
}

// Revoked reports whether serial is on the current revocation list.
func (t *Trust) Revoked(serial uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.crl != nil && t.crl.Revoked(serial)
}

func (t *Trust) verify(c *Certificate, member proto.Key, need Roles, now time.Time) (*Certificate, error) {
	if c.Member != member {
		return nil, ErrWrongMember
	}
	t.mu.Lock()
	crl := t.crl
	t.mu.Unlock()
	if err := c.Verify(t.auth, now, crl, need); err != nil {
		return nil, err
	}
	return c, nil
}
