// Package policy decides which subflows an MPTCP connection should have.
//
// The agent turns kernel events into calls on a Policy and the returned
// Intents into mptcp_pm commands; a Policy never touches netlink. This
// mirrors mptcpd's path-manager plugin operations, so new strategies
// (adaptive detour choice, backup-only detours, fairness accounting) are new
// implementations of the interface. Calls come from one goroutine.
package policy

import (
	"errors"
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
	// Fully: the kernel's ESTABLISHED event said so (it comes once the
	// connection is fully established); false for a connection found by
	// inet_diag, which may still be waiting for its first data ack. A
	// SUBFLOW_CREATE refused with ENOTCONN is final for the former (the
	// connection is closing or fell back to TCP), transient for the latter.
	Fully bool
	// DenyJoinInitial: the server set the C flag (its ESTABLISHED event
	// carries MPTCP_PM_EV_FLAG_DENY_JOIN_ID0): it accepts no join to its
	// initial address, which is where every detour leads (a NAT detour
	// DNATs to it, a tunnel detour goes to it). No detour subflow is
	// opened; announced addresses are still joined.
	DenyJoinInitial bool
	// Inet6: the MPTCP socket is an AF_INET6 one (an IPv6 connection, or
	// an IPv4 one whose events carry IPv4-mapped addresses). Only such a
	// socket takes subflows of the other family than its first subflow's
	// (measured: TestCrossFamilySubflow); an AF_INET socket gets no
	// cross-family detour.
	Inet6 bool
}

// ErrConnectionGone marks a command error that says the connection no
// longer exists (the kernel knows no such token): the agent wraps the
// kernel's error in it, and the policy stops all work for the connection.
var ErrConnectionGone = errors.New("connection gone")

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
	// ConnClosing (SubflowClosed only): when the subflow closed, the
	// connection's MPTCP socket was no longer ESTABLISHED (the server's
	// DATA_FIN came, or we sent ours) or was gone. A server resets a join
	// to such a connection with the same reason as a join beyond its
	// limit (MPTCP_RST_EPROHIBIT), so such a reset says nothing about the
	// limit. The agent asks the kernel only for a join that closed within
	// DefaultMinLifetime of coming up while another extra subflow lived
	// (the case that would teach a limit); false otherwise.
	ConnClosing bool
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
	// Measured hands over the kernel's per-subflow TCP_INFO (sock_diag) for
	// the connections the policy tracks, every probe interval: how a policy
	// notices a path that went silent (the kernel would take minutes to
	// close it), and what an adaptive one judges paths by.
	Measured(now time.Time, ms []Measurement) []Intent
	// Failed: the kernel refused an intent outright.
	Failed(in Intent, err error) []Intent
	// Adopt hands over an established connection that existed before the
	// agent started (or whose events were lost), with its live subflows.
	Adopt(c Conn, subflows []Subflow) []Intent
	// Tick lets the policy act on time (retries after backoff).
	Tick(now time.Time) []Intent
	// Refresh: a source's detours changed (detour.Notifier); fill
	// connections now, close subflows through withdrawn detours.
	Refresh(now time.Time) []Intent
	// Report describes the policy's view for "mpdetour status": per
	// subflow its role and the last decision with its reason, per detour
	// its health. It is called from the same goroutine as the rest.
	Report() Report
}

// Measurement is one subflow's state as the kernel reports it in struct
// tcp_info (through sock_diag, without the application's socket).
type Measurement struct {
	Token         uint32
	Local, Remote netip.AddrPort
	Backup        bool
	// RTT is the smoothed round-trip time; Retransmits the consecutive
	// retransmission timeouts now (0 on a healthy path).
	RTT, RTTVar, MinRTT                                time.Duration
	Retransmits                                        uint8
	TotalRetrans, SegsOut, Unacked                     uint32
	BytesAcked, BytesReceived, BytesSent, BytesRetrans uint64
	DeliveryRate                                       uint64 // bytes/s
	// What limits the sender: congestion window (segments) and MSS, the
	// pacing rate (bytes/s), bytes not sent yet, whether the last rate
	// sample was application limited, and cumulative busy time and the
	// parts of it limited by the receive window and the send buffer
	// (microseconds). Busy time that neither limit explains is time the
	// subflow was limited by its congestion window or pacing.
	SndCwnd, SndMSS                            uint32
	PacingRate                                 uint64
	NotsentBytes                               uint32
	AppLimited                                 bool
	BusyTime, RwndLimited, SndbufLimited       uint64
	SinceDataSent, SinceDataRecv, SinceAckRecv time.Duration
}

// Role is what a subflow is for, as a policy sees it.
type Role string

const (
	RoleConnecting Role = "connecting" // SYN sent, not established yet
	RoleActive     Role = "active"     // carries data
	RoleBackup     Role = "backup"     // marked backup: used only when no active subflow works
	RoleProbing    Role = "probing"    // on trial: set aside to see what the connection does without it
	RoleEvicted    Role = "evicted"    // closed because it added nothing or harmed
	RoleFailed     Role = "failed"     // stopped delivering (watchdog) or refused
)

// Report is a policy's view for status.
type Report struct {
	Conns   []ConnReport
	Detours []DetourReport
}

// ConnReport is one tracked connection.
type ConnReport struct {
	Token    uint32
	Selected bool // matched the selectors: detours are added
	Subflows []SubflowReport
	// Refusals counts the kernel's and the server's refusals of subflows
	// of this connection by reason ("EADDRINUSE", "closed within 2s", ...).
	Refusals map[string]int
	// HoldUntil: no new subflow is tried before this (backoff after
	// repeated refusals); zero when none.
	HoldUntil time.Time
	Decision  string // the last decision about the connection, with its reason
	// Cross says what the connection does with the other address family:
	// the server's other-family address its detours lead to and where it
	// was learned, or why it gets no cross-family detour; "" when nothing
	// of the other family is known.
	Cross string
}

// SubflowReport is one subflow as the policy sees it.
type SubflowReport struct {
	Local netip.Addr
	// Port is the local port once the subflow is up (0 before): the
	// default path's changes when a redial replaces its subflow.
	Port     uint16
	Remote   netip.AddrPort
	Path     string // "default", "announced", or kind:relay
	Role     Role
	RTT      time.Duration
	Rate     float64 // bytes/s delivered (both directions), smoothed
	Loss     float64 // retransmitted share of segments sent, smoothed
	Decision string
}

// DetourReport is one detour's health.
type DetourReport struct {
	Detour       detour.Detour
	Fails        int // consecutive failures (the backoff grows with them)
	Total        int // failures since the agent started
	BackoffUntil time.Time
	LastError    string
}

// PathName names a subflow's path for status and logs.
func PathName(d *detour.Detour, otherwise string) string {
	if d == nil {
		return otherwise
	}
	return d.Kind.String() + ":" + d.Relay
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
