package tunnel

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// allocator hands out client tunnel addresses. The first choice for a key is
// a hash of (relay key, client key), so a relay that lost its state still
// gives a returning client the same address most of the time, and two relays
// sharing a subnet are unlikely to give one client the same address (the
// client's policy routing needs a distinct source address per tunnel).
// Collisions probe linearly. The state file makes allocations survive a
// relay restart exactly.
type allocator struct {
	subnet netip.Prefix
	seed   wgtypes.Key
	byKey  map[wgtypes.Key]netip.Addr
	byAddr map[netip.Addr]wgtypes.Key
}

func newAllocator(subnet netip.Prefix, seed wgtypes.Key) (*allocator, error) {
	if err := checkSubnet(subnet); err != nil {
		return nil, err
	}
	return &allocator{
		subnet: subnet.Masked(), seed: seed,
		byKey: map[wgtypes.Key]netip.Addr{}, byAddr: map[netip.Addr]wgtypes.Key{},
	}, nil
}

func checkSubnet(p netip.Prefix) error {
	if !p.IsValid() {
		return errors.New("tunnel subnet not set")
	}
	if !p.Addr().Is4() {
		return fmt.Errorf("tunnel subnet %s: only IPv4 subnets are supported", p)
	}
	if p.Bits() > 30 || p.Bits() < 8 {
		return fmt.Errorf("tunnel subnet %s: prefix length must be between /8 and /30", p)
	}
	return nil
}

// gateway is the relay's own address in the subnet (first host).
func gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

// CheckSubnet6 checks the optional IPv6 tunnel subnet p6 beside the IPv4
// subnet p4 (configuration parsers call it to name the field): an IPv6 prefix with
// room for every host offset of the IPv4 subnet (a client's IPv6 address
// is the IPv6 subnet plus its IPv4 address's offset, so it needs no
// allocation or state of its own).
func CheckSubnet6(p6, p4 netip.Prefix) error {
	if !p6.IsValid() {
		return nil
	}
	a := p6.Addr()
	if !a.Is6() || a.Is4In6() || a.Zone() != "" || a.IsMulticast() || a.IsLinkLocalUnicast() || a.IsLoopback() {
		return fmt.Errorf("tunnel subnet6 %s: not an IPv6 unicast prefix", p6)
	}
	if p6.Masked() != p6 {
		return fmt.Errorf("tunnel subnet6 %s has host bits set (did you mean %v?)", p6, p6.Masked())
	}
	if p6.Bits() < 8 || 128-p6.Bits() < 32-p4.Bits() {
		return fmt.Errorf("tunnel subnet6 %s: needs at least %d host bits (as many as subnet %s) and a prefix of /8 or longer", p6, 32-p4.Bits(), p4)
	}
	return nil
}

// addr6 maps a client's (or the gateway's) IPv4 tunnel address to its
// IPv6 one: the same host offset in p6.
func addr6(p4, p6 netip.Prefix, a4 netip.Addr) netip.Addr {
	off := binary.BigEndian.Uint32(a4.AsSlice()) - binary.BigEndian.Uint32(p4.Masked().Addr().AsSlice())
	b := p6.Masked().Addr().As16()
	binary.BigEndian.PutUint32(b[12:], binary.BigEndian.Uint32(b[12:])+off)
	return netip.AddrFrom16(b)
}

// hostAt returns network address + off.
func hostAt(p netip.Prefix, off uint32) netip.Addr {
	b := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) + off
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// clients returns how many client addresses the subnet holds: all hosts but
// the network, broadcast and gateway addresses.
func clients(p netip.Prefix) uint32 { return uint32(1)<<(32-p.Bits()) - 3 }

func (a *allocator) alloc(key wgtypes.Key) (netip.Addr, error) {
	if ad, ok := a.byKey[key]; ok {
		return ad, nil
	}
	n := clients(a.subnet)
	h := sha256.New()
	h.Write(a.seed[:])
	h.Write(key[:])
	start := uint32(binary.BigEndian.Uint64(h.Sum(nil)[:8]) % uint64(n))
	for i := uint32(0); i < n; i++ {
		ad := hostAt(a.subnet, 2+(start+i)%n)
		if _, used := a.byAddr[ad]; !used {
			a.byKey[key], a.byAddr[ad] = ad, key
			return ad, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("tunnel subnet %s: %w (%d clients)", a.subnet, ErrSubnetFull, n)
}

func (a *allocator) free(key wgtypes.Key) {
	if ad, ok := a.byKey[key]; ok {
		delete(a.byKey, key)
		delete(a.byAddr, ad)
	}
}

// restore re-installs an allocation read from the state file.
func (a *allocator) restore(key wgtypes.Key, ad netip.Addr) error {
	if !a.subnet.Contains(ad) || ad == gateway(a.subnet) || ad == a.subnet.Addr() ||
		ad == hostAt(a.subnet, clients(a.subnet)+2) {
		return fmt.Errorf("address %s is not a client address of %s", ad, a.subnet)
	}
	if k, used := a.byAddr[ad]; used && k != key {
		return fmt.Errorf("address %s allocated twice", ad)
	}
	if old, ok := a.byKey[key]; ok && old != ad {
		return fmt.Errorf("key %s allocated twice", key)
	}
	a.byKey[key], a.byAddr[ad] = ad, key
	return nil
}

// ErrSubnetFull: every client address of the relay's subnet is taken.
var ErrSubnetFull = errors.New("subnet full")

// stateFile is the persisted allocation table.
type stateFile struct {
	Subnet string      `json:"subnet"`
	Peers  []statePeer `json:"peers"`
}

type statePeer struct {
	Key     string `json:"key"` // base64, as wg(8) prints keys
	Address string `json:"address"`
}

type allocation struct {
	key  wgtypes.Key
	addr netip.Addr
}

// parseState decodes a state file. Entries are validated individually
// against the subnet by the caller.
func parseState(b []byte) (netip.Prefix, []allocation, error) {
	var sf stateFile
	if err := json.Unmarshal(b, &sf); err != nil {
		return netip.Prefix{}, nil, fmt.Errorf("tunnel state: %w", err)
	}
	subnet, err := netip.ParsePrefix(sf.Subnet)
	if err != nil {
		return netip.Prefix{}, nil, fmt.Errorf("tunnel state: subnet: %w", err)
	}
	out := make([]allocation, 0, len(sf.Peers))
	for i, p := range sf.Peers {
		k, err := wgtypes.ParseKey(p.Key)
		if err != nil {
			return netip.Prefix{}, nil, fmt.Errorf("tunnel state: peer %d: key: %w", i, err)
		}
		ad, err := netip.ParseAddr(p.Address)
		if err != nil {
			return netip.Prefix{}, nil, fmt.Errorf("tunnel state: peer %d: address: %w", i, err)
		}
		out = append(out, allocation{k, ad})
	}
	return subnet, out, nil
}

func (a *allocator) marshal() ([]byte, error) {
	sf := stateFile{Subnet: a.subnet.String(), Peers: []statePeer{}}
	for k, ad := range a.byKey {
		sf.Peers = append(sf.Peers, statePeer{Key: k.String(), Address: ad.String()})
	}
	sort.Slice(sf.Peers, func(i, j int) bool { return sf.Peers[i].Address < sf.Peers[j].Address })
	return json.MarshalIndent(sf, "", "  ")
}

// writeFileAtomic replaces path so that a crash leaves the old or the new
// content, never a torn file.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tunnel-state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
