package collective

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// A usage receipt is a relay's signed statement that it relayed Relayed bytes for
// the member Served during [Start, End]. The relay's operator presents the
// receipts its relay issued to the other relays of the collective, which
// count them as its contribution (fair sharing, docs/collective.md): the
// issuer is the relay's control-protocol key, which is also its operator's
// member key (one certificate with the roles client and relay), so credit
// earned by relaying goes to the member that runs the relay.
//
// Binary form (big-endian, 161 bytes, signed with XEdDSA by Issuer over
// receiptDomain || the first 97 bytes):
//
//	version:u8 (1) issuer[32] served[32] seq:u64 start:u64 end:u64 bytes:u64 signature[64]
//
// Seq grows by one with every receipt the issuer signs (whatever the served
// member), so a relay detects a replay by the pair (issuer, seq).
type Receipt struct {
	Issuer    proto.Key // the relay that served (public key)
	Served    proto.Key // the member it served
	Seq       uint64    // > 0, unique per issuer
	Start     time.Time // the period the bytes were counted in (seconds)
	End       time.Time
	Relayed   uint64 // > 0: bytes relayed for Served, both directions
	Signature [ed25519.SignatureSize]byte
}

const (
	receiptVersion = 1
	receiptPrefix  = "mpdetour-receipt-v1:"
	receiptDomain  = "mpdetour collective usage receipt v1\x00"
	receiptBodyLen = 1 + 2*proto.KeyLen + 8 + 8 + 8 + 8
	// ReceiptLen is the binary form's length.
	ReceiptLen = receiptBodyLen + ed25519.SignatureSize
	// ReceiptMaxAge: a receipt whose period ended longer ago is refused
	// as expired, which bounds what a relay must remember against replays
	// (docs/collective.md).
	ReceiptMaxAge = 7 * 24 * time.Hour
	// receiptSkew tolerates clocks that differ between relays.
	receiptSkew = 5 * time.Minute
)

// Refusal reasons of a receipt, stable for logs and metric labels.
var (
	ErrReceiptForged     = errors.New("receipt signature does not verify (forged, or not signed by its issuer)")
	ErrReceiptSelfIssued = errors.New("receipt is self-issued (the relay served its own member)")
	ErrReceiptExpired    = errors.New("receipt expired")
	ErrReceiptFuture     = errors.New("receipt period is in the future")
	ErrReceiptReplay     = errors.New("receipt replayed (this issuer's sequence number was seen)")
)

func (r *Receipt) body() []byte {
	b := make([]byte, 0, ReceiptLen)
	b = append(b, receiptVersion)
	b = append(b, r.Issuer[:]...)
	b = append(b, r.Served[:]...)
	b = binary.BigEndian.AppendUint64(b, r.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Start.Unix()))
	b = binary.BigEndian.AppendUint64(b, uint64(r.End.Unix()))
	return binary.BigEndian.AppendUint64(b, r.Relayed)
}

// Bytes is the binary form (what OpReceipt carries).
func (r *Receipt) Bytes() []byte { return append(r.body(), r.Signature[:]...) }

// String is the one-line text form (the receipts file).
func (r *Receipt) String() string {
	return receiptPrefix + base64.StdEncoding.EncodeToString(r.Bytes())
}

// SignReceipt fills in Issuer (the public key of relayPriv) and signs r.
func SignReceipt(r *Receipt, relayPriv proto.Key) error {
	r.Issuer = relayPriv.Public()
	r.Start, r.End = r.Start.Truncate(time.Second).UTC(), r.End.Truncate(time.Second).UTC()
	if err := r.wellFormed(); err != nil {
		return err
	}
	sig, err := XEdSign(relayPriv, signed(receiptDomain, r.body()))
	if err != nil {
		return err
	}
	r.Signature = sig
	return nil
}

func (r *Receipt) wellFormed() error {
	switch {
	case r.Issuer.IsZero() || r.Served.IsZero():
		return errors.New("receipt: issuer or served key is all zeros")
	case r.Seq == 0:
		return errors.New("receipt: sequence number 0")
	case r.Relayed == 0:
		return errors.New("receipt: 0 bytes")
	case r.Start.Unix() < 0 || r.End.Before(r.Start):
		return fmt.Errorf("receipt: period %d..%d is not a period", r.Start.Unix(), r.End.Unix())
	}
	return nil
}

// ParseReceiptBytes decodes the binary form (untrusted bytes). It checks
// the format only; Check verifies the signature and dates.
func ParseReceiptBytes(b []byte) (*Receipt, error) {
	if len(b) != ReceiptLen {
		return nil, fmt.Errorf("receipt: %d bytes, want %d", len(b), ReceiptLen)
	}
	if b[0] != receiptVersion {
		return nil, fmt.Errorf("receipt: version %d, want %d", b[0], receiptVersion)
	}
	r := &Receipt{}
	copy(r.Issuer[:], b[1:])
	copy(r.Served[:], b[1+proto.KeyLen:])
	o := 1 + 2*proto.KeyLen
	r.Seq = binary.BigEndian.Uint64(b[o:])
	start, end := binary.BigEndian.Uint64(b[o+8:]), binary.BigEndian.Uint64(b[o+16:])
	if start > 1<<40 || end > 1<<40 { // beyond year 36812: not a time
		return nil, fmt.Errorf("receipt: period %d..%d out of range", start, end)
	}
	r.Start, r.End = time.Unix(int64(start), 0).UTC(), time.Unix(int64(end), 0).UTC()
	r.Relayed = binary.BigEndian.Uint64(b[o+24:])
	if err := r.wellFormed(); err != nil {
		return nil, err
	}
	copy(r.Signature[:], b[receiptBodyLen:])
	if !bytes.Equal(r.Bytes(), b) {
		return nil, errors.New("receipt: does not re-encode identically")
	}
	return r, nil
}

// ParseReceipt decodes the text form.
func ParseReceipt(s string) (*Receipt, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, receiptPrefix) {
		return nil, fmt.Errorf("receipt: does not start with %q", receiptPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s[len(receiptPrefix):])
	if err != nil {
		return nil, fmt.Errorf("receipt: not base64: %w", err)
	}
	return ParseReceiptBytes(b)
}

// Check verifies the receipt at time now: its issuer's signature, that the
// issuer did not serve itself, and its period (not older than
// ReceiptMaxAge, not in the future). Whether the issuer is a relay of the
// collective (its certificate) and whether the receipt was seen before are
// the receiving relay's to check (Trust, ReplayWindow).
func (r *Receipt) Check(now time.Time) error {
	if !XEdVerify(r.Issuer, signed(receiptDomain, r.body()), r.Signature[:]) {
		return ErrReceiptForged
	}
	switch {
	case r.Served == r.Issuer:
		return ErrReceiptSelfIssued
	case r.Start.After(now.Add(receiptSkew)) || r.End.After(now.Add(receiptSkew)):
		return fmt.Errorf("%w (ends %s)", ErrReceiptFuture, r.End.Format(time.RFC3339))
	case now.Sub(r.End) > ReceiptMaxAge:
		return fmt.Errorf("%w (ended %s, older than %s)", ErrReceiptExpired, r.End.Format(time.RFC3339), ReceiptMaxAge)
	}
	return nil
}

// ReplayWindow remembers which sequence numbers of one issuer were
// accepted: the highest, and a bitmap of the 64 below it (the sliding
// window of IPsec and WireGuard), so receipts presented slightly out of
// order still count and any one counts once. Older than the window is
// refused as a replay (the issuer's own relay presents them in order).
type ReplayWindow struct {
	Top  uint64 `json:"top"`
	Bits uint64 `json:"bits"` // bit i: Top-i accepted (bit 0 = Top)
}

// Accept records seq and says whether it was new.
func (w *ReplayWindow) Accept(seq uint64) bool {
	switch {
	case seq == 0:
		return false
	case seq > w.Top:
		shift := seq - w.Top
		if shift >= 64 {
			w.Bits = 0
		} else {
			w.Bits <<= shift
		}
		w.Bits |= 1
		w.Top = seq
		return true
	case w.Top-seq >= 64:
		return false
	default:
		bit := uint64(1) << (w.Top - seq)
		if w.Bits&bit != 0 {
			return false
		}
		w.Bits |= bit
		return true
	}
}

// Credit is counted in bytes and shown in units of CreditUnit; a member a
// relay has no receipts of starts at StartCredit. Mobile Kibbutz starts its
// counter at 5; 5 MiB is small on purpose: it lets a newcomer rank above
// members that consumed more than they gave, and a few seconds of a busy
// detour subflow exhaust it, after which only relaying for others (receipts)
// buys priority. A unit much larger (say 1 GB) would let every newcomer
// outrank contributors of less than 5 GB for a long time.
const (
	CreditUnit  = 1 << 20 // 1 MiB
	StartCredit = 5 * CreditUnit
)
