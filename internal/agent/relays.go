package agent

import (
	"time"
)

// Relay states as the client sees them ("the client says
// what is wrong"). JSON values and metric labels are stable.
const (
	RelayUnknown      = "unknown"             // not asked yet
	RelayOK           = "ok"                  // its last answer was a grant, renewal or ping
	RelayNoAnswer     = "no-answer"           // no handshake response or no reply in time
	RelayUnauthorized = "unauthorized"        // it refuses the member key (never accepted it in this run)
	RelayRevoked      = "revoked"             // it accepted the member key earlier in this run and refuses it now (or the certificate expired)
	RelayRefused      = "refused"             // another refusal (quota, rate-limited, no-ports, capacity, internal...)
	RelayPolicyDenied = "policy-denied"       // it refuses some destinations by policy (Detail names them)
	RelayNoHandshake  = "tunnel-no-handshake" // its WireGuard tunnel has no recent handshake
)

// RelayStates lists the states (metric label values).
var RelayStates = []string{RelayUnknown, RelayOK, RelayNoAnswer, RelayUnauthorized, RelayRevoked, RelayRefused, RelayPolicyDenied, RelayNoHandshake}

// RelayStatus is one relay as the agent sees it (JSON names stable;
// internal/agentd's RelayHealth keeps them).
type RelayStatus struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// Detail says what the state rests on (the destinations refused by
	// policy, the error, the handshake age) and what to check.
	Detail      string    `json:"detail,omitempty"`
	Since       time.Time `json:"since,omitzero"`
	LastSuccess time.Time `json:"last_success,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Tunnel: the relay's WireGuard tunnel detour, when the agent has one.
	Tunnel        bool      `json:"tunnel,omitempty"`
	LastHandshake time.Time `json:"tunnel_last_handshake,omitzero"`
}
