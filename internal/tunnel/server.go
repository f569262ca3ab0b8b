package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// IfacePrefix starts the name of every interface this package creates, so
// that leftovers of a crashed process can be recognised.
const IfacePrefix = "mpdt"

// DefaultServerIface is the relay's tunnel interface.
const DefaultServerIface = "mpdt-relay"

// ServerConfig configures the relay side. One Server per network namespace:
// the nftables table has a fixed name so that a restart finds what a crashed
// run left.
type ServerConfig struct {
	// Netns is where the interface and nftables table live: "" for the
	// process's own namespace (the product), a name or path (tests).
	Netns string
	// Iface defaults to DefaultServerIface; must start with IfacePrefix.
	Iface string
	// Subnet is the relay's private tunnel subnet (IPv4, /8../30). The
	// relay takes its first host; clients get the others. It must not
	// overlap any address or route already in the namespace.
	Subnet netip.Prefix
	// Subnet6 is the optional IPv6 tunnel subnet (invalid: IPv4 only): a
	// client's IPv6 tunnel address is Subnet6 plus its IPv4 address's
	// host offset, the relay's is the first host. It needs IPv6 enabled in
	// the namespace; the server turns IPv6 forwarding on (which makes the
	// kernel ignore router advertisements, as a router does).
	Subnet6    netip.Prefix
	ListenPort int
	// PrivateKey is the relay's static key (the control protocol's
	// identity: Curve25519 keys serve both).
	PrivateKey   wgtypes.Key
	MTU          int // 0 = DefaultMTU
	Destinations Destinations
	// StateFile, if set, keeps allocations across restarts: a returning
	// client gets its old address back.
	StateFile string
	// RestorePeers also re-admits the saved keys as WireGuard peers at
	// start, so clients resume with a handshake alone. Only for callers
	// whose authorisation cannot have changed across the restart: the relay
	// (tunnelctl) leaves it off and re-admits a key only when a current
	// member asks again over the control channel.
	RestorePeers bool
	Backend      Backend
	Logger       *slog.Logger
}

// Server is the relay's WireGuard endpoint: one interface, one peer per
// member, masquerading to the relay's address.
type Server struct {
	cfg   ServerConfig
	ns    *nsRef
	nl    *netlink.Handle
	dev   wgDevice
	log   *slog.Logger
	mu    sync.Mutex
	alloc *allocator
	// the refusal log (refused.go)
	stopWatch func()
	watchDone chan struct{}
}

func (c *ServerConfig) check() error {
	if c.Iface == "" {
		c.Iface = DefaultServerIface
	}
	if err := checkIface(c.Iface); err != nil {
		return err
	}
	if err := checkSubnet(c.Subnet); err != nil {
		return err
	}
	if err := CheckSubnet6(c.Subnet6, c.Subnet); err != nil {
		return err
	}
	if c.ListenPort < 1 || c.ListenPort > 65535 {
		return fmt.Errorf("tunnel listen port %d out of range 1-65535", c.ListenPort)
	}
	if c.PrivateKey == (wgtypes.Key{}) {
		return errors.New("tunnel private key not set")
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 576 || c.MTU > 9000 {
		return fmt.Errorf("tunnel MTU %d out of range 576-9000", c.MTU)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Destinations.Validate()
}

func checkIface(name string) error {
	if !strings.HasPrefix(name, IfacePrefix) || len(name) >= unix.IFNAMSIZ {
		return fmt.Errorf("tunnel interface name %q must start with %q and be at most %d bytes", name, IfacePrefix, unix.IFNAMSIZ-1)
	}
	return nil
}

// NewServer creates the relay's tunnel: it removes what a previous run left
// (interface, nftables table), checks the subnet against the namespace,
// brings up the interface with the relay's address, restores peers from the
// state file, enables IPv4 forwarding and installs the nftables table. On
// error nothing it created is left behind.
func NewServer(cfg ServerConfig) (_ *Server, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "tunnel-server", "iface", cfg.Iface)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.ns, err = openNetns(cfg.Netns); err != nil {
		return nil, err
	}
	if s.nl, err = s.ns.netlink(); err != nil {
		return nil, err
	}
	if err = s.removeStale(); err != nil {
		return nil, err
	}
	if err = checkOverlap(s.nl, cfg.Subnet); err != nil {
		return nil, err
	}
	if cfg.Subnet6.IsValid() {
		if err = checkOverlap(s.nl, cfg.Subnet6); err != nil {
			return nil, err
		}
	}
	if s.alloc, err = newAllocator(cfg.Subnet, cfg.PrivateKey.PublicKey()); err != nil {
		return nil, err
	}
	s.loadState()
	if s.dev, err = newDevice(s.ns, s.nl, cfg.Iface, cfg.MTU, cfg.Backend, s.log); err != nil {
		return nil, err
	}
	wc := wgtypes.Config{PrivateKey: &cfg.PrivateKey, ListenPort: &cfg.ListenPort, ReplacePeers: true}
	if cfg.RestorePeers {
		for k, ad := range s.alloc.byKey {
			wc.Peers = append(wc.Peers, s.peer(k, ad))
		}
	}
	if err = s.dev.Configure(wc); err != nil {
		return nil, err
	}
	link, err := s.nl.LinkByName(cfg.Iface)
	if err != nil {
		return nil, fmt.Errorf("tunnel interface %s vanished: %w", cfg.Iface, err)
	}
	gw := netip.PrefixFrom(gateway(cfg.Subnet), cfg.Subnet.Bits())
	if err = s.nl.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(gw)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", gw, cfg.Iface, err)
	}
	if cfg.Subnet6.IsValid() {
		gw6 := netip.PrefixFrom(addr6(cfg.Subnet, cfg.Subnet6, gateway(cfg.Subnet)), cfg.Subnet6.Bits())
		if err = s.nl.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(gw6), Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("address %s on %s (is IPv6 disabled in this namespace? net.ipv6.conf.default.disable_ipv6): %w", gw6, cfg.Iface, err)
		}
	}
	if err = s.nl.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", cfg.Iface, err)
	}
	if err = s.ns.do(enableForwarding); err != nil {
		return nil, err
	}
	if cfg.Subnet6.IsValid() {
		if err = s.ns.do(enableForwarding6); err != nil {
			return nil, err
		}
	}
	nc, err := s.ns.nft()
	if err != nil {
		return nil, err
	}
	if err = installTable(nc, cfg.Iface, cfg.Subnet, cfg.Subnet6, cfg.MTU, cfg.Destinations); err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	s.stopWatch, s.watchDone = stop, make(chan struct{})
	go func() {
		defer close(s.watchDone)
		watchRefused(wctx, s.Refused, RefusedLogEvery, s.log)
	}()
	s.log.Info("tunnel server up", "backend", s.dev.Backend(), "subnet", cfg.Subnet, "subnet6", cfg.Subnet6,
		"port", cfg.ListenPort, "peers", len(wc.Peers), "reserved", len(s.alloc.byKey), "mtu", cfg.MTU)
	return s, nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// peer is a client's WireGuard peer: its IPv4 tunnel address and, with an
// IPv6 subnet, its IPv6 one.
func (s *Server) peer(k wgtypes.Key, ad netip.Addr) wgtypes.PeerConfig {
	p := wgtypes.PeerConfig{
		PublicKey: k, ReplaceAllowedIPs: true,
		AllowedIPs: []net.IPNet{*prefixNet(netip.PrefixFrom(ad, 32))},
	}
	if s.cfg.Subnet6.IsValid() {
		p.AllowedIPs = append(p.AllowedIPs, *prefixNet(netip.PrefixFrom(addr6(s.cfg.Subnet, s.cfg.Subnet6, ad), 128)))
	}
	return p
}

// Address6 is the IPv6 tunnel address (with the IPv6 subnet's prefix
// length) of the client whose IPv4 tunnel address is p (AddPeer's); invalid
// without an IPv6 subnet.
func (s *Server) Address6(p netip.Prefix) netip.Prefix {
	if !s.cfg.Subnet6.IsValid() || !p.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(addr6(s.cfg.Subnet, s.cfg.Subnet6, p.Addr()), s.cfg.Subnet6.Bits())
}

// enableForwarding turns on IPv4 forwarding in the calling thread's
// namespace; the relay is a router for its tunnel clients.
func enableForwarding() error {
	return enableSysctl("/proc/sys/net/ipv4/ip_forward", "IPv4 forwarding")
}

// enableForwarding6 turns on IPv6 forwarding (an IPv6 tunnel subnet).
func enableForwarding6() error {
	return enableSysctl("/proc/sys/net/ipv6/conf/all/forwarding", "IPv6 forwarding")
}

// enableSysctl writes 1 to the sysctl file p (of the calling thread's
// namespace) unless it reads 1 already.
func enableSysctl(p, what string) error {
	b, err := os.ReadFile(p)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable %s: %w", what, err)
	}
	return nil
}

// removeStale deletes the interface and table a previous (crashed) run may
// have left. An embedded device's TUN vanishes with its process, a kernel
// WireGuard link does not.
func (s *Server) removeStale() error {
	if l, err := s.nl.LinkByName(s.cfg.Iface); err == nil {
		s.log.Warn("removing stale tunnel interface", "type", l.Type())
		if err := s.nl.LinkDel(l); err != nil {
			return fmt.Errorf("remove stale interface %s: %w", s.cfg.Iface, err)
		}
	}
	nc, err := s.ns.nft()
	if err != nil {
		return err
	}
	return deleteTable(nc)
}

// checkOverlap refuses a subnet that overlaps an address or a route (any
// table except default routes) already present: masquerading and the
// connected route of the tunnel would hijack that traffic.
func checkOverlap(nl *netlink.Handle, subnet netip.Prefix) error {
	fam := netlink.FAMILY_V4
	if subnet.Addr().Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := nl.AddrList(nil, fam)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		p, ok := netipPrefix(a.IPNet)
		if ok && p.Overlaps(subnet) {
			return fmt.Errorf("tunnel subnet %s overlaps address %s on interface index %d", subnet, p, a.LinkIndex)
		}
	}
	routes, err := nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		p, ok := netipPrefix(r.Dst)
		if !ok || p.Bits() == 0 {
			continue
		}
		if p.Overlaps(subnet) {
			return fmt.Errorf("tunnel subnet %s overlaps route %s (table %d)", subnet, p, r.Table)
		}
	}
	return nil
}

// ConnectedNetworks lists the networks (both families; IPv6 link-local
// left out, the policy refuses it anyway) of namespace spec's addresses
// (except this package's interfaces): the relay's own networks, which the
// destination policy restricts like private ranges.
func ConnectedNetworks(spec string) ([]netip.Prefix, error) {
	ns, err := openNetns(spec)
	if err != nil {
		return nil, err
	}
	defer ns.close()
	nl, err := ns.netlink()
	if err != nil {
		return nil, err
	}
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []netip.Prefix
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, IfacePrefix) {
			continue
		}
		addrs, err := nl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			if p, ok := netipPrefix(a.IPNet); ok && !p.Addr().IsLinkLocalUnicast() {
				out = append(out, p.Masked())
			}
		}
	}
	return out, nil
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), bits), true
}

func (s *Server) loadState() {
	if s.cfg.StateFile == "" {
		return
	}
	b, err := os.ReadFile(s.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		s.log.Warn("tunnel state unreadable, starting empty", "file", s.cfg.StateFile, "err", err)
		return
	}
	subnet, peers, err := parseState(b)
	if err != nil {
		s.log.Warn("tunnel state invalid, starting empty", "file", s.cfg.StateFile, "err", err)
		return
	}
	if subnet.Masked() != s.alloc.subnet {
		s.log.Warn("tunnel subnet changed, dropping saved allocations", "saved", subnet, "now", s.alloc.subnet)
		return
	}
	for _, p := range peers {
		if err := s.alloc.restore(p.key, p.addr); err != nil {
			s.log.Warn("skipping saved tunnel peer", "key", p.key, "err", err)
		}
	}
}

func (s *Server) saveState() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	b, err := s.alloc.marshal()
	if err != nil {
		return err
	}
	if err := writeFileAtomic(s.cfg.StateFile, b); err != nil {
		return fmt.Errorf("save tunnel state: %w", err)
	}
	return nil
}

// PublicKey is the relay's WireGuard key, returned to clients.
func (s *Server) PublicKey() wgtypes.Key { return s.cfg.PrivateKey.PublicKey() }

// ListenPort is the relay's WireGuard UDP port.
func (s *Server) ListenPort() int { return s.cfg.ListenPort }

// Subnet is the tunnel subnet.
func (s *Server) Subnet() netip.Prefix { return s.alloc.subnet }

// Backend says which WireGuard implementation runs.
func (s *Server) Backend() Backend { return s.dev.Backend() }

// AddPeer admits a member's key and returns its tunnel address (with the
// subnet's prefix length). The same key always gets the same address while
// it is admitted; calling AddPeer again is cheap and idempotent.
func (s *Server) AddPeer(key wgtypes.Key) (netip.Prefix, error) {
	if key == (wgtypes.Key{}) {
		return netip.Prefix{}, errors.New("tunnel peer key is zero")
	}
	if key == s.PublicKey() {
		return netip.Prefix{}, errors.New("tunnel peer key is the relay's own key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, known := s.alloc.byKey[key]
	ad, err := s.alloc.alloc(key)
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := s.dev.Configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{s.peer(key, ad)}}); err != nil {
		if !known {
			s.alloc.free(key)
		}
		return netip.Prefix{}, err
	}
	if !known {
		if err := s.saveState(); err != nil {
			s.log.Warn("tunnel state not saved", "err", err)
		}
	}
	s.log.Debug("tunnel peer admitted", "key", key, "address", ad, "new", !known)
	return netip.PrefixFrom(ad, s.alloc.subnet.Bits()), nil
}

// Readmit re-admits, as WireGuard peers, the saved allocations (StateFile)
// whose key allowed accepts: a caller that knows who is authorised now (the
// relay: its current members) lets clients resume after a restart with a
// handshake alone, instead of after their watchdog noticed. It returns how
// many it admitted.
func (s *Server) Readmit(allowed func(wgtypes.Key) bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var peers []wgtypes.PeerConfig
	for k, ad := range s.alloc.byKey {
		if allowed(k) {
			peers = append(peers, s.peer(k, ad))
		}
	}
	if len(peers) == 0 {
		return 0, nil
	}
	if err := s.dev.Configure(wgtypes.Config{Peers: peers}); err != nil {
		return 0, err
	}
	return len(peers), nil
}

// Offer admits key and returns everything the client needs; relayAddr is
// the relay's address as the client reaches it.
func (s *Server) Offer(key wgtypes.Key, relayAddr netip.Addr) (Allocation, error) {
	p, err := s.AddPeer(key)
	if err != nil {
		return Allocation{}, err
	}
	return Allocation{
		Address:  p,
		Endpoint: netip.AddrPortFrom(relayAddr, uint16(s.cfg.ListenPort)),
		RelayKey: s.PublicKey(),
		MTU:      s.cfg.MTU,
	}, nil
}

// RemovePeer revokes a member: its handshakes are dropped from now on.
func (s *Server) RemovePeer(key wgtypes.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.alloc.byKey[key]; !ok {
		return nil
	}
	if err := s.dev.Configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: key, Remove: true}}}); err != nil {
		return err
	}
	s.alloc.free(key)
	s.log.Info("tunnel peer removed", "key", key)
	return s.saveState()
}

// RekeyPeer moves the tunnel of old to the key successor (a member's key
// rotation): the peer of old is replaced, in one device configuration, by
// a peer of successor with the same tunnel address (allowed IPs), so the
// connections inside the tunnel keep their addresses and continue once
// the client hand shakes with its new key. A tunnel successor held
// already is replaced by old's. It says whether old had a tunnel.
func (s *Server) RekeyPeer(old, successor wgtypes.Key) (bool, error) {
	if successor == (wgtypes.Key{}) || successor == s.PublicKey() || successor == old {
		return false, errors.New("tunnel peer rekey: bad successor key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ad, ok := s.alloc.byKey[old]
	if !ok {
		return false, nil
	}
	peers := []wgtypes.PeerConfig{{PublicKey: old, Remove: true}}
	if _, held := s.alloc.byKey[successor]; held {
		peers = append(peers, wgtypes.PeerConfig{PublicKey: successor, Remove: true})
	}
	peers = append(peers, s.peer(successor, ad))
	if err := s.dev.Configure(wgtypes.Config{Peers: peers}); err != nil {
		return true, err
	}
	s.alloc.free(successor)
	s.alloc.free(old)
	if err := s.alloc.restore(successor, ad); err != nil {
		return true, err // cannot happen: the address was just freed
	}
	s.log.Info("tunnel peer rekeyed", "old", old, "new", successor, "address", ad)
	return true, s.saveState()
}

// SetDestinations replaces the destination policy (e.g. on a relay config
// reload). The table is rebuilt in one transaction; established
// connections keep their conntrack state.
func (s *Server) SetDestinations(p Destinations) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	nc, err := s.ns.nft()
	if err != nil {
		return err
	}
	if err := installTable(nc, s.cfg.Iface, s.cfg.Subnet, s.cfg.Subnet6, s.cfg.MTU, p); err != nil {
		return err
	}
	s.cfg.Destinations = p
	return nil
}

// Status reports the device and its peers (handshakes, byte counters).
func (s *Server) Status() (*wgtypes.Device, error) { return s.dev.Status() }

// Close removes the nftables table and the interface (with its address and
// connected route). IPv4 forwarding stays on: NAT detours need it too. The
// state file is kept for the next start.
func (s *Server) Close() error {
	var errs []error
	if s.stopWatch != nil {
		s.stopWatch()
		<-s.watchDone
		s.stopWatch = nil
	}
	if s.ns != nil && s.ns.handle.IsOpen() {
		if nc, err := s.ns.nft(); err == nil {
			errs = append(errs, deleteTable(nc))
		} else {
			errs = append(errs, err)
		}
	}
	if s.dev != nil {
		errs = append(errs, s.dev.Close())
		s.dev = nil
	}
	if s.nl != nil {
		s.nl.Close()
		s.nl = nil
	}
	s.ns.close()
	return errors.Join(errs...)
}
