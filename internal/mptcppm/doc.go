// Package mptcppm speaks the kernel's "mptcp_pm" generic-netlink family
// (Linux 5.19+): the events a userspace MPTCP path manager receives and the
// commands it sends, plus the inet_diag queries it needs to find existing
// MPTCP connections and their subflows.
//
// The family codec is our own: we know of no Go codec for mptcp_pm; the
// existing ones are mptcpd (C), the Rust crate mptcp-pm
// (endpoints and limits, no events or userspace-PM commands) and a Haskell
// package for the out-of-tree kernel. Attribute numbers and layouts come
// from upstream include/uapi/linux/mptcp_pm.h, include/uapi/linux/mptcp.h
// and Documentation/netlink/specs/mptcp_pm.yaml, checked against the
// kernel (see docs/agent.md for where the spec and the kernel differ). Sockets come from
// mdlayher/genetlink and mdlayher/netlink; no cgo, no kernel patch.
//
// Events arrive on a multicast group. Under load the kernel may drop them
// (ENOBUFS); Events.Receive reports that as ErrEventsLost so the caller can
// resynchronise from a Dump.
package mptcppm

// Family name, version and multicast groups (uapi mptcp_pm.h).
const (
	FamilyName  = "mptcp_pm"
	FamilyVer   = 1
	GroupCmds   = "mptcp_pm_cmds"
	GroupEvents = "mptcp_pm_events"
	protoMPTCP  = 262 // IPPROTO_MPTCP
	afInet      = 2
	afInet6     = 10
)

// Commands (enum in uapi mptcp_pm.h).
const (
	CmdAddAddr        = 1
	CmdDelAddr        = 2
	CmdGetAddr        = 3
	CmdFlushAddrs     = 4
	CmdSetLimits      = 5
	CmdGetLimits      = 6
	CmdSetFlags       = 7
	CmdAnnounce       = 8
	CmdRemove         = 9
	CmdSubflowCreate  = 10
	CmdSubflowDestroy = 11
)

var cmdNames = map[uint8]string{
	CmdAddAddr: "ADD_ADDR", CmdDelAddr: "DEL_ADDR", CmdGetAddr: "GET_ADDR",
	CmdFlushAddrs: "FLUSH_ADDRS", CmdSetLimits: "SET_LIMITS", CmdGetLimits: "GET_LIMITS",
	CmdSetFlags: "SET_FLAGS", CmdAnnounce: "ANNOUNCE", CmdRemove: "REMOVE",
	CmdSubflowCreate: "SUBFLOW_CREATE", CmdSubflowDestroy: "SUBFLOW_DESTROY",
}

// Top-level command attributes (MPTCP_PM_ATTR_*).
const (
	attrAddr        = 1 // nested address
	attrRcvAddAddrs = 2 // u32
	attrSubflows    = 3 // u32
	attrToken       = 4 // u32
	attrLocID       = 5 // u8
	attrAddrRemote  = 6 // nested address
)

// Endpoint attribute set used by ADD/DEL/GET/FLUSH (MPTCP_PM_ENDPOINT_ADDR).
const endpointAddr = 1

// Address attributes (MPTCP_PM_ADDR_ATTR_*).
const (
	addrFamily  = 1 // u16
	addrID      = 2 // u8
	addrAddr4   = 3 // u32 big-endian
	addrAddr6   = 4 // 16 bytes
	addrPort    = 5 // u16 host order (despite the spec)
	addrFlags   = 6 // u32
	addrIfIndex = 7 // s32
)

// AddrFlags are MPTCP_PM_ADDR_FLAG_* endpoint flags.
type AddrFlags uint32

const (
	FlagSignal   AddrFlags = 1 << 0
	FlagSubflow  AddrFlags = 1 << 1
	FlagBackup   AddrFlags = 1 << 2
	FlagFullmesh AddrFlags = 1 << 3
	FlagImplicit AddrFlags = 1 << 4
)

// Event attributes (enum mptcp_event_attr).
const (
	evToken       = 1  // u32
	evFamily      = 2  // u16
	evLocID       = 3  // u8
	evRemID       = 4  // u8
	evSaddr4      = 5  // u32 big-endian
	evSaddr6      = 6  // 16 bytes
	evDaddr4      = 7  // u32 big-endian
	evDaddr6      = 8  // 16 bytes
	evSport       = 9  // u16 big-endian
	evDport       = 10 // u16 big-endian
	evBackup      = 11 // u8
	evError       = 12 // u8
	evFlags       = 13 // u16
	evTimeout     = 14 // u32
	evIfIndex     = 15 // u32
	evResetReason = 16 // u32
	evResetFlags  = 17 // u32
	evServerSide  = 18 // u8
	evMax         = 18
)
