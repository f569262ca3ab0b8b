package relay

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

// reloadKeys applies a new key (and previous key) from a reload: new
// handshakes are answered with it at once; nothing established changes.
// The WireGuard device keeps the key it was created with until a restart
// (the tunnel section applies at start; a tunnel grant names the device's
// public key, so members do not assume it is the control key).
func (s *Server) reloadKeys(set *Reloadable) {
	if set.PrivateKey == s.set.PrivateKey && set.PreviousKey == s.set.PreviousKey {
		return
	}
	s.trust.SetKeys(set.PrivateKey, set.PreviousKey)
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
