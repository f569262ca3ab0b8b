package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Validate checks an allocation received from the network: the checks of
// the grant it arrives as (proto.EncapGrant.Validate), which it carries
// field for field.
func (a EncapAllocation) Validate() error {
	if a.MTU < 0 || a.MTU > math.MaxUint16 {
		return fmt.Errorf("vxlan allocation: MTU %d out of range 576-9000", a.MTU)
	}
	g := proto.EncapGrant{ClientPrefix: a.Address, Gateway: a.Gateway, Endpoint: a.Endpoint, Member: a.Member, VNI: a.VNI, MTU: uint16(a.MTU),
		ClientPrefix6: a.Address6, Gateway6: a.Gateway6}
	if err := g.Validate(); err != nil {
		return fmt.Errorf("vxlan allocation: %w", err)
	}
	return nil
}

// EncapClientConfig configures one VXLAN tunnel to one relay.
type EncapClientConfig struct {
	Netns      string
	Relay      string // for detours and logs
	Index      int    // 0..MaxClients-1: interface, table and rule
	Allocation EncapAllocation
	// Lease as granted; the client renews through Refresh at a third of
	// it. 0 = no renewal (tests).
	Lease   time.Duration
	Refresh func(ctx context.Context) (EncapAllocation, time.Duration, error)
	Logger  *slog.Logger
}

// EncapClient is an unencrypted VXLAN detour to one relay; like Client it
// is a detour.Source for every IPv4 server, selected by source address,
// and for every IPv6 server when the relay granted an IPv6 inside.
type EncapClient struct {
	cfg    EncapClientConfig
	ns     *nsRef
	nl     *netlink.Handle
	iface  string
	table  int
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	alloc   EncapAllocation // as granted
	addr6   netip.Addr      // the IPv6 inside in use (encap_inside6.go), invalid: none
	expires time.Time
	dead    atomic.Bool
}

var _ detour.Source = (*EncapClient)(nil)

// EncapClientIface names the client device of index i.
func EncapClientIface(i int) string { return fmt.Sprintf("%s%d", EncapClientIfacePrefix, i) }

// NewEncapClient brings the tunnel up: device with VNI, local = the member
// address the relay accepts (it must be an address of this host: VXLAN
// does not cross NAT), remote = the relay; the inner address as a /32; a
// table whose default route goes via the relay's inner address; a rule
// for packets from the inner address. Leftovers of the index are removed
// first; on error nothing is left.
func NewEncapClient(cfg EncapClientConfig) (_ *EncapClient, err error) {
	if cfg.Index < 0 || cfg.Index >= MaxClients {
		return nil, fmt.Errorf("vxlan index %d out of range 0-%d", cfg.Index, MaxClients-1)
	}
	if err := cfg.Allocation.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &EncapClient{cfg: cfg, iface: EncapClientIface(cfg.Index), table: EncapTableBase + cfg.Index}
	c.log = cfg.Logger.With("component", "encap-client", "relay", cfg.Relay, "iface", c.iface)
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
	if err = c.apply(cfg.Allocation); err != nil {
		return nil, err
	}
	c.alloc = cfg.Allocation
	if cfg.Lease > 0 {
		c.expires = time.Now().Add(cfg.Lease)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan struct{})
	go c.renew(ctx)
	inside := "IPv4 and IPv6"
	if !c.addr6.IsValid() {
		inside = "IPv4 only (the relay granted no IPv6 inner address: it has no vxlan subnet6, or is older)"
		if cfg.Allocation.Address6.IsValid() {
			inside = "IPv4 only (the IPv6 inner address could not be configured, see above)"
		}
	}
	c.log.Info("vxlan tunnel up (unencrypted)", "address", cfg.Allocation.Address.Addr(), "address6", c.addr6, "vni", cfg.Allocation.VNI,
		"relay", cfg.Allocation.Endpoint, "local", cfg.Allocation.Member, "inside", inside)
	return c, nil
}

func (c *EncapClient) apply(a EncapAllocation) error {
	c.addr6 = netip.Addr{}
	if err := c.checkLocal(a.Member); err != nil {
		return err
	}
	link := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: c.iface, MTU: a.MTU},
		VxlanId:   int(a.VNI), SrcAddr: a.Member.AsSlice(), Group: a.Endpoint.Addr().AsSlice(),
		Port: int(a.Endpoint.Port()), Learning: false, UDPCSum: true,
	}
	if err := c.nl.LinkAdd(link); err != nil {
		return fmt.Errorf("create vxlan %s (vni %d): %w", c.iface, a.VNI, err)
	}
	l, err := c.nl.LinkByName(c.iface)
	if err != nil {
		return fmt.Errorf("vxlan %s vanished: %w", c.iface, err)
	}
	if err := c.nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a.Address.Addr(), 32))}); err != nil {
		return fmt.Errorf("address %s on %s: %w", a.Address.Addr(), c.iface, err)
	}
	if err := c.nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", c.iface, err)
	}
	idx := l.Attrs().Index
	if err := c.nl.RouteAdd(&netlink.Route{LinkIndex: idx, Table: c.table, Scope: netlink.SCOPE_LINK,
		Dst: prefixNet(netip.PrefixFrom(a.Gateway, 32))}); err != nil {
		return fmt.Errorf("route to gateway %s in table %d: %w", a.Gateway, c.table, err)
	}
	if err := c.nl.RouteAdd(&netlink.Route{LinkIndex: idx, Table: c.table, Gw: a.Gateway.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("default route via %s in table %d: %w", a.Gateway, c.table, err)
	}
	r := netlink.NewRule()
	r.Family = unix.AF_INET
	r.Priority = EncapRulePriority
	r.Table = c.table
	r.Src = prefixNet(netip.PrefixFrom(a.Address.Addr(), 32))
	if err := c.nl.RuleAdd(r); err != nil {
		return fmt.Errorf("rule from %s lookup %d: %w", a.Address.Addr(), c.table, err)
	}
	c.addr6 = c.setup6(l, a)
	return nil
}

// checkLocal: the relay filters on the address it saw our control request
// come from; VXLAN must be sent from that address, which must be ours.
func (c *EncapClient) checkLocal(member netip.Addr) error {
	addrs, err := c.nl.AddrList(nil, netlink.FAMILY_ALL) // the underlay may be IPv6
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := netipPrefix(a.IPNet); ok && p.Addr() == member {
			return nil
		}
	}
	return fmt.Errorf("vxlan: the relay sees this host as %s, which is not an address of %s (NAT between client and relay? the unencrypted kind needs a routed path)", member, c.ns)
}

// renew asks the relay again at a third of the lease; a changed allocation
// (relay restarted with another subnet, or this host moved) rebuilds the
// device. While the lease has run out without a renewal, no detour is
// offered.
func (c *EncapClient) renew(ctx context.Context) {
	defer close(c.done)
	if c.cfg.Refresh == nil || c.cfg.Lease <= 0 {
		return
	}
	every := max(c.cfg.Lease/3, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		a, lease, err := c.cfg.Refresh(rctx)
		cancel()
		c.mu.Lock()
		switch {
		case err == nil && a.Validate() == nil:
			if a != c.alloc {
				c.log.Info("vxlan allocation changed", "address", a.Address.Addr(), "address6", a.Address6, "vni", a.VNI)
				err = errors.Join(removeClientState(c.nl, c.iface, c.table), c.apply(a))
				c.alloc = a
			}
			if err == nil {
				c.expires = time.Now().Add(lease)
				c.dead.Store(false)
			}
		case err == nil:
			err = a.Validate()
		}
		if err != nil {
			c.log.Warn("vxlan renewal failed", "err", err)
			if time.Now().After(c.expires) {
				c.dead.Store(true)
			}
		}
		c.mu.Unlock()
	}
}

// Address is the tunnel's source address.
func (c *EncapClient) Address() netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Address.Addr()
}

// Iface is the client's VXLAN device.
func (c *EncapClient) Iface() string { return c.iface }

// Prepare implements detour.Source (nothing per server).
func (c *EncapClient) Prepare(netip.AddrPort) {}

// Detours implements detour.Source: any IPv4 server from the inner
// address, any IPv6 server from the inner IPv6 address (when there is one).
func (c *EncapClient) Detours(server netip.AddrPort) []detour.Detour {
	if c.dead.Load() {
		return nil
	}
	local := c.Address()
	if srv := server.Addr().Unmap(); !srv.Is4() {
		if local = c.Address6(); !local.IsValid() || srv.Zone() != "" {
			return nil
		}
	}
	return []detour.Detour{{
		Kind: detour.Tunnel, Relay: c.cfg.Relay, Local: local,
		Remote: netip.AddrPortFrom(server.Addr().Unmap(), server.Port()),
	}}
}

// Close stops renewing and removes rule, routes and device.
func (c *EncapClient) Close() error {
	if c.cancel != nil {
		c.cancel()
		<-c.done
		c.cancel = nil
	}
	return c.teardown()
}

func (c *EncapClient) teardown() error {
	var err error
	if c.nl != nil {
		err = removeClientState(c.nl, c.iface, c.table)
		c.nl.Close()
		c.nl = nil
	}
	c.ns.close()
	return err
}

// CleanupEncapClients removes what a crashed agent left in namespace spec:
// devices EncapClientIfacePrefix*, rules and routes of the encap tables.
func CleanupEncapClients(spec string) error {
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
		if r.Table >= EncapTableBase && r.Table < EncapTableBase+MaxClients {
			tables[r.Table] = true
		}
	}
	if err := clientTables6(nl, tables, EncapTableBase); err != nil {
		return err
	}
	links, err := nl.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		var i int
		if _, err := fmt.Sscanf(l.Attrs().Name, EncapClientIfacePrefix+"%d", &i); err == nil && i >= 0 && i < MaxClients {
			tables[EncapTableBase+i] = true
		}
	}
	var errs []error
	for t := range tables {
		errs = append(errs, removeClientState(nl, EncapClientIface(t-EncapTableBase), t))
	}
	return errors.Join(errs...)
}
