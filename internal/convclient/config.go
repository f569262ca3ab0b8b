package convclient

import (
	"fmt"
	osuser "os/user"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// File is the agent's `convert:` section (docs/convert.md).
type File struct {
	Enabled bool             `yaml:"enabled"`
	Socket  string           `yaml:"socket"`
	Relays  []string         `yaml:"relays"` // default: every relay of relays:
	TTL     *config.Duration `yaml:"ttl"`
	Tickets int              `yaml:"tickets"`
	Hold    *config.Duration `yaml:"hold"`
	// Users may convert besides root: user names or numeric uids, or
	// "*" for every local user (docs/convert.md, docs/security.md).
	Users []string `yaml:"users"`
}

// Settings are the validated section.
type Settings struct {
	Socket string
	// Relays names the relays asked for tickets (nil: all).
	Relays []string
	Router Config
	// Users allowed on the socket besides root.
	Users Users
}

// Build validates the section against the relay names of the agent's
// relays: section; errors start with the field.
func (f File) Build(relays []string) (Settings, error) {
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
	for i, name := range f.Users {
		if name == "*" {
			if len(f.Users) > 1 {
				return s, fmt.Errorf("users[%d]: \"*\" (every user) stands alone", i)
			}
			s.Users.Any = true
			break
		}
		uid, err := lookupUID(name)
		if err != nil {
			return s, fmt.Errorf("users[%d]: %w", i, err)
		}
		if slices.Contains(s.Users.UIDs, uid) {
			return s, fmt.Errorf("users[%d]: %q listed twice", i, name)
		}
		s.Users.UIDs = append(s.Users.UIDs, uid)
	}
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

// lookupUID resolves a user name or a numeric uid.
func lookupUID(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	u, err := osuser.Lookup(name)
	if err != nil {
		return 0, fmt.Errorf("%q: no such user on this host (a name or a numeric uid)", name)
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q: uid %q is not a number", name, u.Uid)
	}
	return uint32(n), nil
}
