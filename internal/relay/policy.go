package relay

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// special lists destination ranges refused unless a configured allow prefix
// covers them: a relay must not become a way into its own or anyone's
// private networks.
var special = []struct {
	p    netip.Prefix
	what string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
}

// policy decides which destinations a relay maps to.
type policy struct {
	allow     []netip.Prefix
	deny      []netip.Prefix
	denyPorts map[uint16]bool
	// own: the relay's addresses (always refused) and networks (refused
	// unless allowed), refreshed from the kernel.
	ownAddrs []netip.Addr
	ownNets  []netip.Prefix
}

// check returns nil if server may be mapped to, else why not.
func (p *policy) check(server netip.AddrPort) error {
	a := server.Addr().Unmap()
	if !a.Is4() {
		return fmt.Errorf("%v: the NAT data plane is IPv4 only", a)
	}
	if p.denyPorts[server.Port()] {
		return fmt.Errorf("port %d is denied", server.Port())
	}
	for _, d := range p.deny {
		if d.Contains(a) {
			return fmt.Errorf("%v is in denied %v", a, d)
		}
	}
	if a.IsUnspecified() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("%v is not a unicast address", a)
	}
	for _, o := range p.ownAddrs {
		if o == a {
			return fmt.Errorf("%v is the relay's own address", a)
		}
	}
	allowed := func() bool {
		for _, al := range p.allow {
			if al.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, s := range special {
		if s.p.Contains(a) && !allowed() {
			return fmt.Errorf("%v is %s (%v) and not in allow_destinations", a, s.what, s.p)
		}
	}
	for _, n := range p.ownNets {
		if n.Contains(a) && !allowed() {
			return fmt.Errorf("%v is in the relay's own network %v and not in allow_destinations", a, n)
		}
	}
	return nil
}

// refreshOwn reads the relay's addresses from the kernel (its namespace).
func (p *policy) refreshOwn() error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing own addresses: %w", err)
	}
	p.ownAddrs, p.ownNets = nil, nil
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		p.ownAddrs = append(p.ownAddrs, ip)
		if !ip.IsLoopback() {
			p.ownNets = append(p.ownNets, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	return nil
}

// listeners tracks the TCP ports the relay's namespace listens on, so that
// a mapping never hides a local service. It caches /proc/net/tcp{,6} for a
// second: grants arrive in bursts.
type listeners struct {
	at    time.Time
	ports map[uint16]bool
	read  func() (map[uint16]bool, error)
}

func (l *listeners) has(port uint16, now time.Time) bool {
	if now.Sub(l.at) > time.Second || l.ports == nil {
		read := l.read
		if read == nil {
			read = listeningPorts
		}
		ports, err := read()
		if err == nil {
			l.ports, l.at = ports, now
		}
	}
	return l.ports[port]
}

// listeningPorts parses the kernel's TCP socket tables for LISTEN sockets.
func listeningPorts() (map[uint16]bool, error) {
	ports := map[uint16]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		err = parseProcNetTCP(bufio.NewScanner(fh), ports)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return ports, nil
}

// parseProcNetTCP adds the local ports of sockets in state 0A (LISTEN).
func parseProcNetTCP(sc *bufio.Scanner, ports map[uint16]bool) error {
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		_, port, ok := strings.Cut(fields[1], ":")
		if !ok {
			return fmt.Errorf("bad local address %q", fields[1])
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			return fmt.Errorf("bad port in %q", fields[1])
		}
		ports[uint16(p)] = true
	}
	return sc.Err()
}

// bucket is a token bucket for per-member and per-address rate limits.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) take(now time.Time, rate float64, burst int) bool {
	if b.last.IsZero() {
		b.tokens = float64(burst)
	} else {
		b.tokens += now.Sub(b.last).Seconds() * rate
		if b.tokens > float64(burst) {
			b.tokens = float64(burst)
		}
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
