package roster

import (
	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Roster entries are signed with XEdDSA by the relay's Curve25519 control
// key, the key its certificate names, exactly as the collective's usage
// receipts (collective.XEdSign: why it is written here, and how).

func xSign(priv proto.Key, msg []byte) ([]byte, error) {
	sig, err := collective.XEdSign(priv, msg)
	return sig[:], err
}

func xVerify(pub proto.Key, msg, sig []byte) bool { return collective.XEdVerify(pub, msg, sig) }

func edwardsKey(pub proto.Key) ([]byte, error) { return collective.EdwardsOf(pub) }
