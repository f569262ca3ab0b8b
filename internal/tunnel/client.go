package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Client-side kernel object naming. Index i gets interface ClientIfacePrefix+i,
// routing table TableBase+i and one rule at RulePriority.
const (
	ClientIfacePrefix = IfacePrefix + "c"
	TableBase         = 52000
	MaxClients        = 1000
	// RulePriority is below the main table's 32766 so the tunnel table is
	// consulted first, but only for packets from a tunnel address.
	RulePriority = 5200
	// DefaultKeepalive keeps NAT bindings between client and relay open.
	DefaultKeepalive = 25 * time.Second
	// DefaultStaleAfter: WireGuard re-handshakes at least every 2 minutes
	// while the persistent keepalive runs and rejects sessions older than
	// 3 minutes, so no handshake for this long means the tunnel is dead.
	DefaultStaleAfter = 200 * time.Second
	// DefaultDeadAfter: traffic went into the tunnel (more than deadBytes)
	// but nothing came back for this long. TCP through the tunnel always
	// gets something back (ACKs) within a few RTTs, so this is how a relay
	// restart that lost our peer shows up while subflows are in use. 3 s
	// (5 s before) brings a tunnel back within 5 s of a relay restart
	// (docs/results/relay-restart); a path whose round trip exceeds 3 s
	// would be re-established needlessly (once per DeadAfter), which
	// costs a handshake, not the connections.
	DefaultDeadAfter = 3 * time.Second
	deadBytes        = 1024
)

// Allocation is what a relay's control channel hands a client.
type Allocation struct {
	Address  netip.Prefix   // client tunnel address (prefix length of the relay's subnet)
	Endpoint netip.AddrPort // relay WireGuard endpoint
	RelayKey wgtypes.Key    // relay WireGuard public key
	MTU      int            // 0 = DefaultMTU
	// Address6 is the IPv6 tunnel address (relay's subnet6 prefix length;
	// zero when the relay grants none): client6.go.
	Address6 netip.Prefix
}

// Validate checks an allocation received from the network.
func (a Allocation) Validate() error {
	ad := a.Address.Addr()
	switch {
	case !a.Address.IsValid() || !ad.Is4():
		return fmt.Errorf("tunnel allocation: address %s is not an IPv4 prefix", a.Address)
	case ad.IsUnspecified() || ad.IsLoopback() || ad.IsMulticast() || ad.IsLinkLocalUnicast() || ad == netip.IPv4Unspecified():
		return fmt.Errorf("tunnel allocation: address %s is not a usable unicast address", ad)
	case !a.Endpoint.IsValid() || a.Endpoint.Port() == 0 || a.Endpoint.Addr().IsUnspecified():
		return fmt.Errorf("tunnel allocation: endpoint %s is not an address:port", a.Endpoint)
	case a.RelayKey == (wgtypes.Key{}):
		return errors.New("tunnel allocation: relay key is zero")
	case a.MTU != 0 && (a.MTU < 576 || a.MTU > 9000):
		return fmt.Errorf("tunnel allocation: MTU %d out of range 576-9000", a.MTU)
	}
	return validate6(a.Address6)
}

// ClientConfig configures one tunnel to one relay.
type ClientConfig struct {
	Netns string // "" = process namespace
	Relay string // relay name, for detours and logs
	// Index (0..MaxClients-1) names the interface, table and rule; the agent
	// gives each relay its own.
	Index      int
	PrivateKey wgtypes.Key // the member's static key
	Allocation Allocation
	// Refresh re-requests the allocation over the control channel. The
	// watchdog calls it when the tunnel carried traffic out but nothing back
	// for DeadAfter, or had no handshake for StaleAfter (the relay restarted
	// without our peer, or gave our address away). nil: the watchdog only
	// restarts the handshake.
	Refresh    func(ctx context.Context) (Allocation, error)
	StaleAfter time.Duration // 0 = DefaultStaleAfter
	DeadAfter  time.Duration // 0 = DefaultDeadAfter
	Keepalive  time.Duration // 0 = DefaultKeepalive
	Backend    Backend
	Logger     *slog.Logger
}

// Client is one tunnel detour toward one relay. It implements detour.Source:
// every IPv4 server is reachable through the tunnel once it is up.
type Client struct {
	cfg    ClientConfig
	ns     *nsRef
	nl     *netlink.Handle
	dev    wgDevice
	iface  string
	table  int
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	alloc Allocation
	since time.Time // when the current peer configuration was applied
	// dead: the watchdog found the tunnel dead and nothing has come back
	// since; Detours offers nothing meanwhile so the agent does not open
	// subflows into a black hole.
	dead atomic.Bool
}

var _ detour.Source = (*Client)(nil)

// ClientIface returns the interface name of tunnel index i.
func ClientIface(i int) string { return fmt.Sprintf("%s%d", ClientIfacePrefix, i) }

func (c *ClientConfig) check() error {
	if c.Index < 0 || c.Index >= MaxClients {
		return fmt.Errorf("tunnel index %d out of range 0-%d", c.Index, MaxClients-1)
	}
	if c.PrivateKey == (wgtypes.Key{}) {
		return errors.New("tunnel private key not set")
	}
	if err := c.Allocation.Validate(); err != nil {
		return err
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.Keepalive == 0 {
		c.Keepalive = DefaultKeepalive
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// NewClient brings up the tunnel: interface with the allocated address (as
// a /32: the client routes nothing to the relay's subnet, and two relays may
// use the same one), the relay as the only peer with AllowedIPs 0.0.0.0/0, a
// routing table whose default route is the tunnel, and a rule sending
// packets from the tunnel address to that table. Leftovers of the same index
// from a crashed run are removed first.
func NewClient(cfg ClientConfig) (_ *Client, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, iface: ClientIface(cfg.Index), table: TableBase + cfg.Index, done: make(chan struct{})}
	c.log = cfg.Logger.With("component", "tunnel-client", "relay", cfg.Relay, "iface", c.iface)
	defer func() {
		if err != nil {
			c.teardown()
		}
	}()
	if c.ns, err = openNetns(cfg.Netns); err != nil {
		return nil, err
	}
	if c.nl, err = c.ns.netlink(); err != nil {
		return nil, err
	}
	if err = removeClientState(c.nl, c.iface, c.table); err != nil {
		return nil, err
	}
	mtu := cfg.Allocation.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	if c.dev, err = newDevice(c.ns, c.nl, c.iface, mtu, cfg.Backend, c.log); err != nil {
		return nil, err
	}
	port := 0
	if err = c.dev.Configure(wgtypes.Config{PrivateKey: &cfg.PrivateKey, ListenPort: &port, ReplacePeers: true}); err != nil {
		return nil, err
	}
	link, err := c.nl.LinkByName(c.iface)
	if err != nil {
		return nil, fmt.Errorf("tunnel interface %s vanished: %w", c.iface, err)
	}
	if err = c.nl.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", c.iface, err)
	}
	if err = c.apply(cfg.Allocation, Allocation{}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.watchdog(ctx)
	c.log.Info("tunnel up", "backend", c.dev.Backend(), "address", cfg.Allocation.Address.Addr(),
		"endpoint", cfg.Allocation.Endpoint, "table", c.table)
	return c, nil
}

// apply moves the client from allocation old (zero at start) to a: peer,
// address and rule. The peer is always re-created, which discards the
// session and starts a fresh handshake at once instead of waiting out
// WireGuard's 15 s retry timer after a relay restart.
func (c *Client) apply(a, old Allocation) error {
	keepalive := c.cfg.Keepalive
	peers := []wgtypes.PeerConfig{}
	if old.RelayKey != (wgtypes.Key{}) {
		peers = append(peers, wgtypes.PeerConfig{PublicKey: old.RelayKey, Remove: true})
	}
	if err := c.dev.Configure(wgtypes.Config{Peers: peers}); err != nil && len(peers) > 0 {
		return err
	}
	link, err := c.nl.LinkByName(c.iface)
	if err != nil {
		return fmt.Errorf("tunnel interface %s vanished: %w", c.iface, err)
	}
	newA, oldA := a.Address.Addr(), old.Address.Addr()
	if newA != oldA {
		// New address before removing the old one: removing a device's last
		// IPv4 address makes the kernel flush the routes through it.
		if err := c.nl.AddrReplace(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(newA, 32))}); err != nil {
			return fmt.Errorf("address %s on %s: %w", newA, c.iface, err)
		}
		if err := c.nl.RuleAdd(c.rule(newA)); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("rule from %s lookup %d: %w", newA, c.table, err)
		}
		if oldA.IsValid() {
			_ = c.nl.RuleDel(c.rule(oldA))
			_ = c.nl.AddrDel(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(oldA, 32))})
		}
	}
	if err := c.nl.RouteReplace(&netlink.Route{
		LinkIndex: link.Attrs().Index, Table: c.table, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
	}); err != nil {
		return fmt.Errorf("default route in table %d: %w", c.table, err)
	}
	a = c.setup6(link, a, old)
	// Peer last: packets only flow once address and routing are in place.
	if err := c.dev.Configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{
		PublicKey: a.RelayKey, Endpoint: net.UDPAddrFromAddrPort(a.Endpoint),
		PersistentKeepaliveInterval: &keepalive, ReplaceAllowedIPs: true,
		AllowedIPs: allowedIPs(a),
	}}}); err != nil {
		return err
	}
	c.mu.Lock()
	c.alloc, c.since = a, time.Now()
	c.mu.Unlock()
	return nil
}

func (c *Client) rule(a netip.Addr) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = unix.AF_INET
	if a.Is6() {
		r.Family = unix.AF_INET6 // client6.go
	}
	r.Src = prefixNet(netip.PrefixFrom(a, a.BitLen()))
	r.Table = c.table
	r.Priority = RulePriority
	return r
}

// Update applies a new allocation from the control channel (the relay
// restarted, or the client re-requested). The interface's MTU is not
// changed.
func (c *Client) Update(a Allocation) error {
	if err := a.Validate(); err != nil {
		return err
	}
	c.mu.Lock()
	old := c.alloc
	c.mu.Unlock()
	if err := c.apply(a, old); err != nil {
		return err
	}
	if a != old {
		c.log.Info("tunnel allocation changed", "address", a.Address.Addr(), "endpoint", a.Endpoint)
	}
	return nil
}

// Reconnect restarts the handshake at once (e.g. when the control channel
// notices that the relay restarted).
func (c *Client) Reconnect() error {
	c.mu.Lock()
	a := c.alloc
	c.mu.Unlock()
	return c.apply(a, a)
}

// Rekey switches the device to a new member key (a key rotation: the
// relay has moved this member's peer to the new key, keeping the tunnel
// address). The tunnel's address, routes and rule stay, so connections
// inside it continue. A new private key makes WireGuard (kernel and
// wireguard-go) drop the relay peer's session keys, so the next packet
// starts a handshake with the new key. The peer is not re-created as well:
// that sent a second initiation within WireGuard's 20 ms initiation limit,
// which the relay dropped, and the tunnel then waited 5 s (REKEY_TIMEOUT)
// for the retry (1 run of 10 of TestTunnelKeyRotation).
func (c *Client) Rekey(priv wgtypes.Key) error {
	if err := c.dev.Configure(wgtypes.Config{PrivateKey: &priv}); err != nil {
		return fmt.Errorf("tunnel %s: new private key: %w", c.iface, err)
	}
	c.mu.Lock()
	c.since = time.Now() // the watchdog judges the new handshake from now
	c.mu.Unlock()
	c.log.Info("tunnel rekeyed", "key", priv.PublicKey())
	return nil
}

// Address is the tunnel's local address: subflows from it use the tunnel.
func (c *Client) Address() netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Address.Addr()
}

// Iface is the tunnel interface name.
func (c *Client) Iface() string { return c.iface }

// Table is the tunnel's routing table.
func (c *Client) Table() int { return c.table }

// Backend says which WireGuard implementation runs.
func (c *Client) Backend() Backend { return c.dev.Backend() }

// Status reports the device and the relay peer.
func (c *Client) Status() (*wgtypes.Device, error) { return c.dev.Status() }

// LastHandshake is the time of the last completed handshake with the relay
// (zero if none).
func (c *Client) LastHandshake() (time.Time, error) {
	st, err := c.dev.Status()
	if err != nil {
		return time.Time{}, err
	}
	for _, p := range st.Peers {
		return p.LastHandshakeTime, nil
	}
	return time.Time{}, nil
}

// Prepare implements detour.Source; a tunnel needs no per-server signalling.
func (c *Client) Prepare(netip.AddrPort) {}

// Detours implements detour.Source: the tunnel reaches any IPv4 server,
// with the tunnel address as the subflow's source. Nothing while the
// watchdog is re-establishing a dead tunnel.
func (c *Client) Detours(server netip.AddrPort) []detour.Detour {
	if c.dead.Load() {
		return nil
	}
	if !server.Addr().Unmap().Is4() {
		if l6 := c.Address6(); l6.IsValid() && server.Addr().Is6() {
			return []detour.Detour{{Kind: detour.Tunnel, Relay: c.cfg.Relay, Local: l6, Remote: server}}
		}
		return nil
	}
	return []detour.Detour{{
		Kind: detour.Tunnel, Relay: c.cfg.Relay, Local: c.Address(),
		Remote: netip.AddrPortFrom(server.Addr().Unmap(), server.Port()),
	}}
}

// watchdog re-requests the allocation (or at least restarts the handshake)
// when the tunnel looks dead: traffic out but nothing back for DeadAfter, or
// no handshake for StaleAfter.
func (c *Client) watchdog(ctx context.Context) {
	defer close(c.done)
	// A tenth of the shorter limit: the silence is noticed at most a
	// tenth late (a fifth cost a second of the restart's recovery).
	tick := min(c.cfg.DeadAfter, c.cfg.StaleAfter) / 10
	tick = max(tick, 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	var (
		lastRx, txAtRx int64
		rxTime         = time.Now()
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := c.dev.Status()
		if err != nil || len(st.Peers) == 0 {
			if err != nil {
				c.log.Warn("tunnel status", "err", err)
			}
			continue
		}
		p := st.Peers[0]
		now := time.Now()
		// A re-created peer starts its counters at zero; anything it
		// received (a handshake response counts) shows the relay has us.
		reset := p.TransmitBytes < txAtRx || p.ReceiveBytes < lastRx
		if reset || p.ReceiveBytes != lastRx {
			if (reset && p.ReceiveBytes > 0 || !reset && p.ReceiveBytes > lastRx) && c.dead.Swap(false) {
				c.log.Info("tunnel alive again")
			}
			lastRx, txAtRx, rxTime = p.ReceiveBytes, p.TransmitBytes, now
		}
		c.mu.Lock()
		since := c.since
		c.mu.Unlock()
		hs := p.LastHandshakeTime
		if hs.Before(since) {
			hs = since
		}
		why := ""
		switch {
		case p.TransmitBytes-txAtRx > deadBytes && now.Sub(rxTime) >= c.cfg.DeadAfter:
			why = "traffic out, nothing back"
		case now.Sub(hs) >= c.cfg.StaleAfter:
			why = "no handshake"
		default:
			continue
		}
		c.log.Warn("tunnel dead, re-establishing", "why", why, "last_handshake", p.LastHandshakeTime)
		c.dead.Store(true)
		if c.cfg.Refresh == nil {
			err = c.Reconnect()
		} else {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var a Allocation
			a, err = c.cfg.Refresh(rctx)
			cancel()
			if err == nil {
				err = c.Update(a)
			}
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn("tunnel re-establishment failed", "err", err)
		}
		// Judge the new attempt afresh.
		lastRx, txAtRx, rxTime = p.ReceiveBytes, p.TransmitBytes, time.Now()
	}
}

// Close removes the rule, the table's route and the interface.
func (c *Client) Close() error {
	if c.cancel != nil {
		c.cancel()
		<-c.done
	}
	return c.teardown()
}

func (c *Client) teardown() error {
	var err error
	// Device first: deleting the link under a running wireguard-go makes it
	// log failed TUN writes.
	if c.dev != nil {
		err = c.dev.Close()
		c.dev = nil
	}
	if c.nl != nil {
		err = errors.Join(err, removeClientState(c.nl, c.iface, c.table))
	}
	if c.nl != nil {
		c.nl.Close()
		c.nl = nil
	}
	c.ns.close()
	return err
}

// removeClientState deletes the rules pointing at table, the table's routes
// and the interface.
func removeClientState(nl *netlink.Handle, iface string, table int) error {
	errs := []error{removeTableState(nl, netlink.FAMILY_V4, table), removeTableState(nl, netlink.FAMILY_V6, table)}
	if l, err := nl.LinkByName(iface); err == nil {
		if err := nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete %s: %w", iface, err))
		}
	}
	return errors.Join(errs...)
}

// CleanupClients removes every client tunnel a crashed agent left in
// namespace spec ("" = current): interfaces named ClientIfacePrefix*, rules
// and routes of tables TableBase..TableBase+MaxClients-1. Call it once at
// agent start, before creating Clients.
func CleanupClients(spec string) error {
	ns, err := openNetns(spec)
	if err != nil {
		return err
	}
	defer ns.close()
	nl, err := ns.netlink()
	if err != nil {
		return err
	}
	defer nl.Close()
	tables := map[int]bool{}
	rules, err := nl.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	for _, r := range rules {
		if r.Table >= TableBase && r.Table < TableBase+MaxClients {
			tables[r.Table] = true
		}
	}
	if err := clientTables6(nl, tables, TableBase); err != nil {
		return err
	}
	links, err := nl.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		var i int
		if _, err := fmt.Sscanf(l.Attrs().Name, ClientIfacePrefix+"%d", &i); err == nil && i >= 0 && i < MaxClients {
			tables[TableBase+i] = true
		}
	}
	for t := range tables {
		errs = append(errs, removeClientState(nl, ClientIface(t-TableBase), t))
	}
	return errors.Join(errs...)
}
