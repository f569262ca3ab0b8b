// Package relay is the detour host's core: it authenticates members over
// the control protocol (internal/proto), applies policy, quotas and rate
// limits, and grants NAT mappings (client address, detour port) ->
// (server, port) with leases, per-mapping counters and an attribution log.
//
// One event loop (Server.Serve) owns every table, so the request path has
// no locks. The Server is built from its parts (New, Deps): the control
// socket, the data plane (internal/relay/dataplane: nftables, or its Fake),
// tunnel detours (Tunnels: internal/tunnel/tunnelctl, or a fake), a clock
// and a logger. Its parts keep their own state: the lease table
// (internal/relay/lease), trust (internal/relay/trust: keys, replay state,
// certified members, the live collective trust), gossip (gossip.go), fair
// share (fair.go: admission and receipts; the ledger in
// internal/relay/fairshare) and the converter's tickets (convert.go).
// Each control operation is one handler in a table (handlers.go).
//
// The daemon around it, `mpdetour relay` (configuration file, locks,
// sockets, SIGHUP), is internal/relayd.
package relay

import "github.com/mpdetour/mpdetour/internal/relay/dataplane"

// TableName is the nftables table the relay owns (internal/relay/dataplane).
const TableName = dataplane.TableName
