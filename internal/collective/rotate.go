package collective

import (
	"encoding/binary"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// A member's key rotation in place (docs/collective.md, "Key rotation"):
// the member opens a session with its new key (which proves the new key)
// and sends OpRotate with a statement signed by the old key that names the
// new one as its successor (which proves the old key). The relay then
// carries the old key's state (mappings, tunnel, converter tickets,
// ledger) over to the new key. The signature is XEdDSA with the old
// Curve25519 control-protocol key, as usage receipts are signed.

const rotationDomain = "mpdetour collective member key rotation v1\x00"

// RotationSkew is how far a rotation statement's time may lie from the
// relay's clock (either way).
const RotationSkew = 5 * time.Minute

func rotationMessage(old, successor proto.Key, t uint64) []byte {
	m := make([]byte, 0, len(rotationDomain)+2*proto.KeyLen+8)
	m = append(m, rotationDomain...)
	m = append(m, old[:]...)
	m = append(m, successor[:]...)
	return binary.BigEndian.AppendUint64(m, t)
}

// SignRotation is the old key's statement that successor replaces it, made
// at t (OpRotate's body).
func SignRotation(oldPriv proto.Key, successor proto.Key, t time.Time) (proto.Rotation, error) {
	r := proto.Rotation{Old: oldPriv.Public(), Time: uint64(t.Unix())}
	sig, err := XEdSign(oldPriv, rotationMessage(r.Old, successor, r.Time))
	if err != nil {
		return proto.Rotation{}, err
	}
	r.Signature = sig
	return r, nil
}

// VerifyRotation says whether r is r.Old's statement naming successor.
// The time is the caller's to check (RotationSkew).
func VerifyRotation(r proto.Rotation, successor proto.Key) bool {
	if r.Old.IsZero() || r.Old == successor {
		return false
	}
	return XEdVerify(r.Old, rotationMessage(r.Old, successor, r.Time), r.Signature[:])
}
