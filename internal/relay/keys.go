package relay

import (
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Key rotation (docs/relay.md, "Rotating the relay's key"). The relay
// answers handshakes addressed to its current key and, while configured,
// to the previous one (previous_private_key): members that know only the
// old public key (their configuration, a roster read before the rotation)
// keep reaching it. A SIGHUP applies a new key at once; established
// sessions are untouched (their transport keys do not depend on the static
// key once the handshake is done), and so are mappings, tunnels and
// converter tickets, which belong to members, not to the relay's key.
//
// The initiation's mac1 is keyed with the public key the member addressed,
// so the reader (screenInit) finds the identity by mac1 before the packet
// is queued: one MAC per configured key, no extra Diffie-Hellman.

// identity is one key the relay answers for, with its cookie jar (mac1,
// mac2 and cookie replies are bound to the public key).
type identity struct {
	priv proto.Key
	jar  *proto.CookieJar
}

// keyring: ids[0] is the current key. Replaced as a whole (atomic pointer:
// the reader uses it concurrently with the event loop).
type keyring struct {
	ids []*identity
}

func newKeyring(cur, prev proto.Key, old *keyring) *keyring {
	kr := &keyring{}
	for _, k := range []proto.Key{cur, prev} {
		if k.IsZero() {
			continue
		}
		id := old.find(k)
		if id == nil { // a kept key keeps its jar (cookies given stay valid)
			id = &identity{priv: k, jar: proto.NewCookieJar(k.Public())}
		}
		kr.ids = append(kr.ids, id)
	}
	return kr
}

func (kr *keyring) find(k proto.Key) *identity {
	if kr == nil {
		return nil
	}
	for _, id := range kr.ids {
		if id.priv == k {
			return id
		}
	}
	return nil
}

// match returns the identity whose mac1 the initiation carries (nil: none,
// the sender does not know any of our public keys).
func (kr *keyring) match(pkt []byte) *identity {
	for _, id := range kr.ids {
		if id.jar.CheckMAC1(pkt) {
			return id
		}
	}
	return nil
}

// reloadKeys applies a new key (and previous key) from a reload: new
// handshakes are answered with it at once; nothing established changes.
// The WireGuard device keeps the key it was created with until a restart
// (the tunnel section applies at start; a tunnel grant names the device's
// public key, so members do not assume it is the control key).
func (s *Server) reloadKeys(set *Reloadable) {
	if set.PrivateKey == s.set.PrivateKey && set.PreviousKey == s.set.PreviousKey {
		return
	}
	old := s.trust.keys.Load()
	s.trust.keys.Store(newKeyring(set.PrivateKey, set.PreviousKey, old))
	prev := "none"
	if !set.PreviousKey.IsZero() {
		prev = set.PreviousKey.Public().ID()
	}
	if set.PrivateKey != s.set.PrivateKey {
		s.log.Info("reload: new relay key: new handshakes use it; sessions, mappings and tunnels established stay",
			"key", set.PrivateKey.Public().ID(), "was", s.set.PrivateKey.Public().ID(), "previous_accepted", prev)
		if set.PreviousKey != s.set.PrivateKey {
			s.log.Warn("reload: the replaced key is not configured as previous_private_key: members that know only its public key cannot hand shake any more (sessions established stay until they rekey)",
				"replaced", s.set.PrivateKey.Public().ID())
		}
	} else {
		s.log.Info("reload: previous relay key changed", "previous_accepted", prev)
	}
}
