package agentd

import (
	"strings"
	"testing"
	"time"
)

const convertRelays = `
relays:
  key: 8G3fPZ2bYBwF0uLqBdZ9X1Jt3K4r7mVb6y2N5a8cQ1E=
  servers:
    - {name: fra1, address: 192.0.2.10:45673, public_key: hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=}
`

func TestParseConfigConvert(t *testing.T) {
	c, err := ParseConfig([]byte(convertRelays + "convert:\n  enabled: true\n  relays: [fra1]\n  ttl: 10m\n  tickets: 6\n  hold: 5s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Convert == nil || c.Convert.Socket != "/run/mpdetour/convert.sock" || c.Convert.Router.TTL != 10*time.Minute ||
		c.Convert.Router.Tickets != 6 || c.Convert.Router.Hold != 5*time.Second || len(c.Convert.Relays) != 1 {
		t.Fatalf("%+v", c.Convert)
	}
	if c, err := ParseConfig([]byte(convertRelays + "convert:\n  enabled: false\n")); err != nil || c.Convert != nil {
		t.Fatalf("disabled: %+v %v", c.Convert, err)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"convert:\n  enabled: true\n", "convert.enabled: conversion needs a relays section"},
		{convertRelays + "convert:\n  enabled: true\n  relays: [ams]\n", `convert.relays[0]: "ams" is not a relay`},
		{convertRelays + "convert:\n  enabled: true\n  tickets: 33\n", "convert.tickets: 33 out of range"},
		{convertRelays + "convert:\n  enabled: true\n  ttl: 0s\n", "convert.ttl"},
		{convertRelays + "convert:\n  enabled: true\n  sockett: /x\n", "sockett"},
	} {
		_, err := ParseConfig([]byte(bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: got %v, want %q", bad.yaml, err, bad.want)
		}
	}
}
