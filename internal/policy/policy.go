// Package policy decides which subflows an MPTCP connection should have.
//
// The agent turns kernel events into calls on a Policy and the returned
// Intents into mptcp_pm commands; a Policy never touches netlink. This
// mirrors mptcpd's path-manager plugin operations, so new strategies
// (adaptive detour choice, backup-only detours, fairness accounting) are new
// implementations of the interface. Calls come from one goroutine.
package policy

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Conn is an MPTCP connection as the kernel reported it; Remote is the server.
type Conn struct {
	Token  uint32
	Local  netip.AddrPort
	Remote netip.AddrPort
}

// Subflow is one subflow of a connection.
type Subflow struct {
	Token    uint32
	LocalID  uint8
	RemoteID uint8
	Local    netip.AddrPort
	Remote   netip.AddrPort
	Backup   bool
	// Errno is the subflow's socket error on close (0 = none).
	Errno uint8
}

// Action is what an Intent asks of the kernel.
type Action int

const (
	CreateSubflow Action = iota + 1
	DestroySubflow
	SetBackup
)

func (a Action) String() string {
	switch a {
	case CreateSubflow:
		return "create"
	case DestroySubflow:
		return "destroy"
	case SetBackup:
		return "set-backup"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// Intent is one command the policy wants issued.
type Intent struct {
	Action   Action
	Token    uint32
	LocalID  uint8
	RemoteID uint8 // the server's address id, for announced addresses
	// Local is the subflow's source; port 0 lets the kernel choose.
	Local  netip.AddrPort
	Remote netip.AddrPort
	Backup bool
	// Detour is the detour the subflow goes through, nil for subflows
	// toward addresses the server announced.
	Detour *detour.Detour
}

func (in Intent) String() string {
	s := fmt.Sprintf("%s token %08x %s -> %s", in.Action, in.Token, in.Local, in.Remote)
	if in.Detour != nil {
		s += " via " + in.Detour.String()
	}
	return s
}

// Policy receives the path manager's events (mptcpd plugin ops) and returns
// the commands to issue.
type Policy interface {
	// Created: SYN sent; time to warm up detours for the server.
	Created(c Conn) []Intent
	// Established: the connection can take subflows now.
	Established(c Conn) []Intent
	Closed(token uint32) []Intent
	// Announced: the server advertised another address (ADD_ADDR).
	Announced(token uint32, id uint8, addr netip.AddrPort) []Intent
	Removed(token uint32, id uint8) []Intent
	SubflowEstablished(sf Subflow) []Intent
	SubflowClosed(sf Subflow) []Intent
	Priority(sf Subflow) []Intent
	// Stalled: an established subflow keeps timing out (its path went
	// silent without a reset); the kernel would take minutes to close it.
	Stalled(sf Subflow) []Intent
	// Failed: the kernel refused an intent outright.
	Failed(in Intent, err error) []Intent
	// Adopt hands over an established connection that existed before the
	// agent started (or whose events were lost), with its live subflows.
	Adopt(c Conn, subflows []Subflow) []Intent
	// Tick lets the policy act on time (retries after backoff).
	Tick(now time.Time) []Intent
}

// Match finds the detour a subflow uses: a NAT detour by its relay
// address and port, a tunnel detour by its local address and the server.
func Match(ds []detour.Detour, local netip.Addr, remote netip.AddrPort) (detour.Detour, bool) {
	local = local.Unmap()
	remote = unmapAP(remote)
	for _, d := range ds {
		switch d.Kind {
		case detour.NAT:
			if unmapAP(d.Remote) == remote && (!d.Local.IsValid() || d.Local.Unmap() == local) {
				return d, true
			}
		case detour.Tunnel:
			if d.Local.Unmap() == local && unmapAP(d.Remote) == remote {
				return d, true
			}
		}
	}
	return detour.Detour{}, false
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Key identifies a detour across calls of Source.Detours.
func Key(d detour.Detour) string {
	local := "default"
	if d.Local.IsValid() {
		local = d.Local.String()
	}
	return fmt.Sprintf("%s/%s/%s/%s", d.Kind, d.Relay, local, d.Remote)
}
