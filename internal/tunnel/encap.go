package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Unencrypted encapsulation (VXLAN), the opt-in tunnel kind for detours
// inside a trusted network (docs/tunnel.md, "VXLAN"). The kernel does all
// the work: one VXLAN device per member on the relay (VNI = the member's
// host number in the subnet, remote = the member's address), one on the
// client, and an nftables table on the relay that accepts encapsulated
// packets only from the member's address with the member's VNI. Nothing is
// encrypted or authenticated on the wire: anyone who can send packets with
// the member's source address can inject into its tunnel.
const (
	// EncapServerIfacePrefix + VNI names the relay's per-member devices.
	EncapServerIfacePrefix = IfacePrefix + "vr"
	// EncapClientIfacePrefix + index names the client's devices.
	EncapClientIfacePrefix = IfacePrefix + "vc"
	// EncapTableName is the relay's nftables tables: family ip (outer
	// filter of IPv4 members, forwarding of the IPv4 inside) and family
	// ip6 (outer filter of IPv6 members, forwarding of the IPv6 inside
	// with a subnet6).
	EncapTableName = "mpdetour_encap"
	// DefaultEncapPort is the IANA VXLAN port.
	DefaultEncapPort = 4789
	// DefaultEncapMTU fits VXLAN over IPv4 (50 bytes of outer headers) on
	// a 1500-byte path.
	DefaultEncapMTU = 1450
	// EncapIPv6Overhead is what an IPv6 outer header costs beyond an IPv4
	// one (70 bytes of outer headers instead of 50): a member reached over
	// IPv6 gets the configured MTU minus this.
	EncapIPv6Overhead = 20
	// DefaultEncapLease: a member that does not renew within this is torn
	// down (clients renew at a third of it).
	DefaultEncapLease = 5 * time.Minute
	// Client-side routing: table EncapTableBase+index, rule at
	// EncapRulePriority (beside the WireGuard client's 52000/5200).
	EncapTableBase    = 53000
	EncapRulePriority = 5300
)

// EncapServerConfig configures the relay side of the VXLAN kind.
type EncapServerConfig struct {
	Netns  string       // "" = the process's namespace
	Subnet netip.Prefix // inner addresses; must not overlap the namespace's
	// Subnet6 is the optional IPv6 inside (invalid: IPv4 only): a member's
	// inner IPv6 address is Subnet6 plus its IPv4 address's host offset
	// (CheckSubnet6; no allocation of its own), the relay's is the first
	// host. The server turns IPv6 forwarding on.
	Subnet6 netip.Prefix
	Port    int // UDP port, 0 = DefaultEncapPort
	MTU     int // inner MTU over an IPv4 underlay (IPv6: 20 less), 0 = DefaultEncapMTU
	Lease   time.Duration
	// Seed spreads addresses like the WireGuard allocator (the relay's
	// public key): a returning member gets the same address.
	Seed         wgtypes.Key
	Destinations Destinations
	Logger       *slog.Logger
	now          func() time.Time
}

// EncapAllocation is one member's tunnel, as sent to the client.
type EncapAllocation struct {
	Address  netip.Prefix   // client inner address (prefix length of the subnet)
	Gateway  netip.Addr     // relay inner address: the client's next hop
	Endpoint netip.AddrPort // relay VXLAN endpoint
	Member   netip.Addr     // client underlay address the relay accepts packets from
	VNI      uint32
	MTU      int
	// Address6 and Gateway6 are the IPv6 inside (both invalid: IPv4 only):
	// the client's inner IPv6 address (prefix length of the subnet6) and
	// the relay's, the client's IPv6 next hop.
	Address6 netip.Prefix
	Gateway6 netip.Addr
}

type encapMember struct {
	alloc   EncapAllocation
	iface   string
	expires time.Time
}

// EncapServer is the relay's VXLAN side.
type EncapServer struct {
	cfg     EncapServerConfig
	ns      *nsRef
	nl      *netlink.Handle
	log     *slog.Logger
	stop    chan struct{}
	stopped chan struct{}

	mu      sync.Mutex
	alloc   *allocator
	members map[wgtypes.Key]*encapMember
	closed  bool
}

func (c *EncapServerConfig) check() error {
	if err := checkSubnet(c.Subnet); err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	if err := CheckSubnet6(c.Subnet6, c.Subnet); err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	if c.Port == 0 {
		c.Port = DefaultEncapPort
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("vxlan: port %d out of range 1-65535", c.Port)
	}
	if c.MTU == 0 {
		c.MTU = DefaultEncapMTU
	}
	if c.MTU < 576 || c.MTU > 9000 {
		return fmt.Errorf("vxlan: MTU %d out of range 576-9000", c.MTU)
	}
	if c.Lease == 0 {
		c.Lease = DefaultEncapLease
	}
	if c.Lease < time.Second {
		return fmt.Errorf("vxlan: lease %s shorter than 1s", c.Lease)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c.Destinations.Validate()
}

// NewEncapServer removes what a crashed run left (devices, table), checks
// the subnet against the namespace, enables forwarding and installs the
// nftables table (which drops every VXLAN packet until a member is added).
// On error nothing it created is left.
func NewEncapServer(cfg EncapServerConfig) (_ *EncapServer, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &EncapServer{cfg: cfg, log: cfg.Logger.With("component", "encap-server"),
		members: map[wgtypes.Key]*encapMember{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	defer func() {
		if err != nil {
			close(s.stopped)
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
		return nil, fmt.Errorf("vxlan: %w", err)
	}
	if cfg.Subnet6.IsValid() {
		if err = checkOverlap(s.nl, cfg.Subnet6); err != nil {
			return nil, fmt.Errorf("vxlan: %w", err)
		}
	}
	if s.alloc, err = newAllocator(cfg.Subnet, cfg.Seed); err != nil {
		return nil, err
	}
	if err = s.ns.do(enableForwarding); err != nil {
		return nil, err
	}
	if cfg.Subnet6.IsValid() {
		if err = s.ns.do(enableForwarding6); err != nil {
			return nil, err
		}
	}
	if err = s.install(); err != nil {
		return nil, err
	}
	go s.expire()
	s.log.Info("vxlan encapsulation up (unencrypted)", "subnet", cfg.Subnet, "subnet6", cfg.Subnet6, "port", cfg.Port, "mtu", cfg.MTU, "lease", cfg.Lease)
	if !cfg.Subnet6.IsValid() {
		s.log.Info("vxlan tunnels carry IPv4 only inside: no vxlan subnet6 set (members asking for IPv6 get IPv4 alone)")
	}
	return s, nil
}

func (s *EncapServer) removeStale() error {
	links, err := s.nl.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, EncapServerIfacePrefix) {
			s.log.Warn("removing stale vxlan interface", "iface", l.Attrs().Name)
			if err := s.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("remove stale interface %s: %w", l.Attrs().Name, err)
			}
		}
	}
	nc, err := s.ns.nft()
	if err != nil {
		return err
	}
	return deleteEncapTables(nc)
}

// install (re)builds the table for the current members in one transaction.
func (s *EncapServer) install() error {
	nc, err := s.ns.nft()
	if err != nil {
		return err
	}
	ms := make([]encapRule, 0, len(s.members))
	for _, m := range s.members {
		ms = append(ms, encapRule{iface: m.iface, member: m.alloc.Member, inner: m.alloc.Address.Addr(),
			inner6: m.alloc.Address6.Addr(), vni: m.alloc.VNI, mtu: m.alloc.MTU})
	}
	return installEncapTable(nc, s.cfg.Subnet, s.cfg.Subnet6, s.cfg.Port, s.cfg.MTU, s.cfg.Destinations, ms)
}

// Open admits (or renews) member's tunnel from underlay address from, with
// relayAddr as the relay's VXLAN endpoint address. A member coming back from
// another address gets its device re-created toward the new one (and the
// filter follows). The lease restarts. The underlay is IPv4 or IPv6 (both
// addresses of one family; over IPv6 the inner MTU is 20 bytes smaller);
// the inside is IPv4, and IPv6 too with a subnet6 (Address6; the caller
// passes it on only to members that asked).
func (s *EncapServer) Open(key wgtypes.Key, from, relayAddr netip.Addr) (EncapAllocation, error) {
	from, relayAddr = from.Unmap(), relayAddr.Unmap()
	if !from.IsValid() || !relayAddr.IsValid() || from.Is4() != relayAddr.Is4() {
		return EncapAllocation{}, fmt.Errorf("vxlan: member %s and relay %s are not addresses of one family", from, relayAddr)
	}
	if from.Zone() != "" || relayAddr.Zone() != "" || !from.IsGlobalUnicast() || !relayAddr.IsGlobalUnicast() {
		return EncapAllocation{}, fmt.Errorf("vxlan: member %s and relay %s must be global unicast addresses", from, relayAddr)
	}
	mtu := s.cfg.MTU
	if from.Is6() {
		if mtu -= EncapIPv6Overhead; mtu < 576 {
			return EncapAllocation{}, fmt.Errorf("vxlan: MTU %d leaves %d over an IPv6 underlay, below 576 (raise tunnel.vxlan.mtu to serve IPv6 members)", s.cfg.MTU, mtu)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return EncapAllocation{}, errors.New("vxlan: server closed")
	}
	now := s.cfg.now()
	if m := s.members[key]; m != nil {
		if m.alloc.Member == from && m.alloc.Endpoint.Addr() == relayAddr {
			m.expires = now.Add(s.cfg.Lease)
			return m.alloc, nil
		}
		s.log.Info("vxlan member moved", "from", m.alloc.Member, "to", from)
		if err := s.removeLocked(key); err != nil {
			return EncapAllocation{}, err
		}
	}
	ad, err := s.alloc.alloc(key)
	if err != nil {
		return EncapAllocation{}, err
	}
	vni := uint32(ad.As4()[0])<<24 | uint32(ad.As4()[1])<<16 | uint32(ad.As4()[2])<<8 | uint32(ad.As4()[3])
	base := s.alloc.subnet.Addr().As4()
	vni -= uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	a := EncapAllocation{
		Address: netip.PrefixFrom(ad, s.alloc.subnet.Bits()), Gateway: gateway(s.alloc.subnet),
		Endpoint: netip.AddrPortFrom(relayAddr, uint16(s.cfg.Port)), Member: from, VNI: vni, MTU: mtu,
	}
	a.Address6, a.Gateway6 = s.inside6(a)
	m := &encapMember{alloc: a, iface: fmt.Sprintf("%s%d", EncapServerIfacePrefix, vni), expires: now.Add(s.cfg.Lease)}
	if err := s.addDevice(m); err != nil {
		s.alloc.free(key)
		return EncapAllocation{}, err
	}
	s.members[key] = m
	if err := s.install(); err != nil {
		delete(s.members, key)
		s.alloc.free(key)
		return EncapAllocation{}, errors.Join(err, s.delDevice(m.iface))
	}
	s.log.Info("vxlan member admitted", "member", from, "address", ad, "address6", m.alloc.Address6, "vni", vni, "iface", m.iface)
	return m.alloc, nil
}

// addDevice creates the member's VXLAN device: VNI, local = relay address,
// remote = member address (IPv4 or IPv6: the library picks the attribute
// by the address's length), no learning (the remote is fixed), the relay's
// inner address and a host route to the member's inner address.
func (s *EncapServer) addDevice(m *encapMember) (err error) {
	link := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: m.iface, MTU: m.alloc.MTU, HardwareAddr: encapRelayMAC(m.alloc.VNI)},
		VxlanId:   int(m.alloc.VNI), SrcAddr: m.alloc.Endpoint.Addr().AsSlice(), Group: m.alloc.Member.AsSlice(),
		Port: s.cfg.Port, Learning: false, UDPCSum: true,
	}
	if err := s.nl.LinkAdd(link); err != nil {
		return fmt.Errorf("create vxlan %s (vni %d): %w", m.iface, m.alloc.VNI, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.delDevice(m.iface))
		}
	}()
	l, err := s.nl.LinkByName(m.iface)
	if err != nil {
		return fmt.Errorf("vxlan %s vanished: %w", m.iface, err)
	}
	if err := s.nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(m.alloc.Gateway, 32))}); err != nil {
		return fmt.Errorf("address %s on %s: %w", m.alloc.Gateway, m.iface, err)
	}
	if err := s.nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", m.iface, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: prefixNet(netip.PrefixFrom(m.alloc.Address.Addr(), 32)), Src: m.alloc.Gateway.AsSlice()}
	if err := s.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s dev %s: %w", m.alloc.Address.Addr(), m.iface, err)
	}
	s.addDevice6(m, l)
	return nil
}

func (s *EncapServer) delDevice(name string) error {
	l, err := s.nl.LinkByName(name)
	if err != nil {
		return nil // already gone
	}
	if err := s.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// Remove tears member's tunnel down (release, member removed). Removing a
// member without a tunnel is not an error.
func (s *EncapServer) Remove(key wgtypes.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.members[key] == nil {
		return nil
	}
	return s.removeLocked(key)
}

// removeLocked drops the filter first (no packet of the member is accepted
// any more), then the device.
func (s *EncapServer) removeLocked(key wgtypes.Key) error {
	m := s.members[key]
	delete(s.members, key)
	s.alloc.free(key)
	var err error
	if !s.closed {
		err = s.install()
	}
	s.log.Info("vxlan member removed", "member", m.alloc.Member, "address", m.alloc.Address.Addr())
	return errors.Join(err, s.delDevice(m.iface))
}

// expire removes members whose lease ran out.
func (s *EncapServer) expire() {
	defer close(s.stopped)
	every := s.cfg.Lease / 10
	every = max(min(every, 10*time.Second), 200*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		now := s.cfg.now()
		for k, m := range s.members {
			if now.After(m.expires) {
				s.log.Info("vxlan lease expired", "member", m.alloc.Member)
				if err := s.removeLocked(k); err != nil {
					s.log.Warn("vxlan expiry", "err", err)
				}
			}
		}
		s.mu.Unlock()
	}
}

// Members lists the current tunnels (for status and tests).
func (s *EncapServer) Members() map[wgtypes.Key]EncapAllocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[wgtypes.Key]EncapAllocation, len(s.members))
	for k, m := range s.members {
		out[k] = m.alloc
	}
	return out
}

// Close removes the table and every device.
func (s *EncapServer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.nl != nil {
		if nc, err := s.ns.nft(); err == nil {
			errs = append(errs, deleteEncapTables(nc))
		} else {
			errs = append(errs, err)
		}
		for k, m := range s.members {
			errs = append(errs, s.delDevice(m.iface))
			delete(s.members, k)
		}
		s.nl.Close()
		s.nl = nil
	}
	s.ns.close()
	return errors.Join(errs...)
}

// encapRelayMAC is the relay device's hardware address for a VNI: fixed
// (locally administered, unicast) so that a device rebuilt for the same member
// and VNI (lease expiry then renewal, a relay restart) answers at the address
// the member's neighbour entry already holds. With a random address the
// member's packets went to the old device's address until that entry went
// stale (seconds of lost traffic after every rebuild).
func encapRelayMAC(vni uint32) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x6d, 0x64, byte(vni >> 16), byte(vni >> 8), byte(vni)}
}
