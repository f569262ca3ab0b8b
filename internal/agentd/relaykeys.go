package agentd

import (
	"log/slog"

	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// followRelayKeys applies, on SIGHUP, the relays' public keys of the
// re-read configuration to the running connections of the same name: a
// relay that rotated its key (previous_private_key on the relay answers
// the old key meanwhile) is hand shaken with the new key at once, without
// a restart of the agent (docs/collective.md, "Key rotation"). Addresses
// and the list of relays are not reloaded.
func followRelayKeys(want []relayconn.Relay, conns []*relayconn.Conn, log *slog.Logger) {
	for _, r := range want {
		for _, c := range conns {
			if c.Relay().Name != r.Name {
				continue
			}
			old := c.Relay().PublicKey
			if c.SetRelayKey(r.PublicKey) {
				log.Info("SIGHUP: relay key changed in the configuration; hand shaking with the new key", "relay", r.Name,
					"old_key", old.ID(), "new_key", r.PublicKey.ID())
			}
		}
	}
}
