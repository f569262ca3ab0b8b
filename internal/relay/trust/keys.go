package trust

import (
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Identity is one key the relay answers for, with its cookie jar (mac1,
// mac2 and cookie replies are bound to the public key).
type Identity struct {
	Priv proto.Key
	Jar  *proto.CookieJar
}

// Keyring is the keys the relay answers for: ids[0] is the current key. Replaced as a whole (atomic pointer:
// the reader uses it concurrently with the event loop).
type Keyring struct {
	ids []*Identity
}

func NewKeyring(cur, prev proto.Key, old *Keyring) *Keyring {
	kr := &Keyring{}
	for _, k := range []proto.Key{cur, prev} {
		if k.IsZero() {
			continue
		}
		id := old.Find(k)
		if id == nil { // a kept key keeps its jar (cookies given stay valid)
			id = &Identity{Priv: k, Jar: proto.NewCookieJar(k.Public())}
		}
		kr.ids = append(kr.ids, id)
	}
	return kr
}

func (kr *Keyring) Find(k proto.Key) *Identity {
	if kr == nil {
		return nil
	}
	for _, id := range kr.ids {
		if id.Priv == k {
			return id
		}
	}
	return nil
}

// Match returns the identity whose mac1 the initiation carries (nil: none,
// the sender does not know any of our public keys).
func (kr *Keyring) Match(pkt []byte) *Identity {
	for _, id := range kr.ids {
		if id.Jar.CheckMAC1(pkt) {
			return id
		}
	}
	return nil
}
