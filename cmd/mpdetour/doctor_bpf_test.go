package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agentd"
)

// doctor probes the agent's BPF program only where an agent would load
// it: not on a relay host (--relay-config alone), not for a config that
// turns it off; it says why not.
func TestDoctorBPFNotUsed(t *testing.T) {
	parse := func(s string) agentd.Config {
		c, err := agentd.ParseConfig([]byte("socket: /tmp/a.sock\n" + s))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	server := "server:\n  announce: [{name: a, address: 10.0.6.2:5201}]\n"
	for _, tc := range []struct {
		name, agent, relay string
		cfg                agentd.Config
		err                error
		want               string // "" = probe
	}{
		{"no flags", "", "", agentd.Config{}, nil, ""},
		{"relay host", "", "relay.yaml", agentd.Config{}, nil, "a relay host"},
		{"both", "a.yaml", "relay.yaml", parse("subflow_lowat: 131072\n"), nil, ""},
		{"default on", "a.yaml", "", parse(""), nil, ""},
		{"set", "a.yaml", "", parse("subflow_lowat: 131072\n"), nil, ""},
		{"invalid config", "a.yaml", "", agentd.Config{}, errors.New("bad"), ""},
		{"off", "a.yaml", "", parse("subflow_lowat: 0\n"), nil, "has subflow_lowat: 0 (off)"},
		{"server role only", "a.yaml", "", parse(server), nil, "server-role-only agent without subflow_lowat (off by default there)"},
	} {
		got := bpfNotUsed(tc.agent, tc.relay, tc.cfg, tc.err)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
