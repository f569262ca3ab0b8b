package main

import (
	"log/slog"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relay/tunnels"
)

// relayTunnels is the relay's tunnel factory: WireGuard tunnel detours
// (internal/tunnel) serving the config's `tunnel:` section. Spelled out here
// so that a reader of cmd/mpdetour sees what the relay runs.
func relayTunnels(section *config.Doc, key proto.Key, top destination.Policy, log *slog.Logger) (relay.Tunnels, error) {
	a, err := tunnels.Factory(section, key, top, log)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return a, nil
}
