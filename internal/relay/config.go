package relay

import (
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// DefaultPort is the v2 control port.
const DefaultPort = 45673

// DefaultReceiveBuffer is the control sockets' receive buffer unless
// configured (receive_buffer); 0 keeps the kernel's default. Junk from
// spoofed sources shares the socket with members' handshakes and requests,
// and a larger buffer holds genuine packets through short stalls of the
// relay; but in the one interleaved comparison run with three rounds
// (docs/results/attacks/spoofed-junk, 04:45) the 4 MiB relay missed the
// 1 s target in one flood minute while the kernel default met it in all
// three, so the numbers do not support changing the default.
const DefaultReceiveBuffer = 0

// Config is a validated configuration: what applies at start only
// (Static) and what a reload changes at once (Reloadable).
type Config struct {
	Static
	Reloadable
}

// Static is the part of the configuration a reload does not change: a
// reload with other values is applied only at the next start (the relay
// says so in its log).
type Static struct {
	Listen netip.AddrPort
	// Listen6 is the IPv6 control address (invalid: no control over IPv6,
	// hence no IPv6 NAT detours).
	Listen6       netip.AddrPort
	StateFile     string
	MetricsListen string
	MetricsToken  string // metrics.token_file's token ("" = none)

	Legacy       bool
	LegacyListen netip.AddrPort

	// Convert: the converter role (Convert.Enabled false: off).
	Convert ConvertConfig

	// FastPath: flowtable offload of established detour connections,
	// attribution through conntrack accounting.
	FastPath bool

	// ReceiveBuffer is the receive buffer asked for the control sockets,
	// in bytes (0: the kernel's default, net.core.rmem_default).
	ReceiveBuffer int

	// Tunnel is the `tunnel:` section (nil: none), for the TunnelFactory.
	Tunnel *config.Doc
}

// Reloadable is the part of the configuration a reload (SIGHUP) applies
// at once.
type Reloadable struct {
	PrivateKey proto.Key
	// PreviousKey (zero: none) is a replaced key whose handshakes are still
	// answered (key rotation, docs/relay.md).
	PreviousKey    proto.Key
	DetourAddress  netip.Addr // zero = the request's destination address
	DetourAddress6 netip.Addr // IPv6 sessions' detour address; zero = the request's destination address
	PortLo         uint16
	PortHi         uint16
	Lease          time.Duration
	Members        map[proto.Key]string // public key -> name

	Allow     []netip.Prefix
	Deny      []netip.Prefix
	DenyPorts map[uint16]bool

	QuotaPerMember int
	QuotaGlobal    int
	Rate           float64
	Burst          int

	AttributionLog   string
	AttributionFlush time.Duration

	LegacyLease     time.Duration
	LegacyPerClient int

	// Trust is the collective's authority and the revocation list of
	// CRLFile as read from the file (nil: static members only). The
	// running relay's live trust is its trust part's (trust.go), which
	// keeps the newest list seen across reloads; CRLFile is re-read when
	// it changes.
	Trust   *collective.Trust
	CRLFile string
	// Gossip: relay discovery (nil: off; gossip.go). Applied at start, and
	// again when the relay key changes.
	Gossip *GossipConfig

	// Fair is the validated `fair_share:` section (its ledger_file applies
	// at start only).
	Fair FairConfig
}

// ConvertConfig are the validated `convert:` section.
type ConvertConfig struct {
	Enabled bool
	Listen  netip.AddrPort
	// Listen6 is the converter's IPv6 address (invalid: none; members
	// whose session is over IPv6 are then refused tickets).
	Listen6      netip.AddrPort
	MaxConns     int
	StallTimeout time.Duration
}
