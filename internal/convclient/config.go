package convclient

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// FileConfig is the agent's `convert:` section (docs/convert.md).
type FileConfig struct {
	Enabled bool             `yaml:"enabled"`
	Socket  string           `yaml:"socket"`
	Relays  []string         `yaml:"relays"` // default: every relay of relays:
	TTL     *config.Duration `yaml:"ttl"`
	Tickets int              `yaml:"tickets"`
	Hold    *config.Duration `yaml:"hold"`
}

// Settings are the validated section.
type Settings struct {
	Socket string
	// Relays names the relays asked for tickets (nil: all).
	Relays []string
	Router Config
}

// Build validates the section against the relay names of the agent's
// relays: section; errors start with the field.
func (f FileConfig) Build(relays []string) (Settings, error) {
	s := Settings{Socket: f.Socket}
	if s.Socket == "" {
		s.Socket = DefaultSocket
	}
	if !filepath.IsAbs(s.Socket) {
		return s, fmt.Errorf("socket: %q is not an absolute path", s.Socket)
	}
	if len(relays) == 0 {
		return s, fmt.Errorf("enabled: conversion needs a relays section (tickets come from the relays)")
	}
	for i, r := range f.Relays {
		if !slices.Contains(relays, r) {
			return s, fmt.Errorf("relays[%d]: %q is not a relay of the relays section (%v)", i, r, relays)
		}
		if slices.Contains(f.Relays[:i], r) {
			return s, fmt.Errorf("relays[%d]: %q listed twice", i, r)
		}
	}
	s.Relays = f.Relays
	if f.TTL != nil {
		if v := f.TTL.D(); v < time.Second || v > 7*24*time.Hour {
			return s, fmt.Errorf("ttl: %s out of range 1s-168h", v)
		}
		s.Router.TTL = f.TTL.D()
	}
	if f.Tickets != 0 {
		if f.Tickets < 1 || f.Tickets > proto.MaxTickets {
			return s, fmt.Errorf("tickets: %d out of range 1-%d", f.Tickets, proto.MaxTickets)
		}
		s.Router.Tickets = f.Tickets
	}
	if f.Hold != nil {
		if v := f.Hold.D(); v < time.Second || v > time.Hour {
			return s, fmt.Errorf("hold: %s out of range 1s-1h", v)
		}
		s.Router.Hold = f.Hold.D()
	}
	return s, nil
}
