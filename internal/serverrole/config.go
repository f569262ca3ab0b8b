// Package serverrole is the server half of `mpdetour agent`: on every
// MPTCP connection this host accepts, it announces addresses with ADD_ADDR
// (the userspace path manager's ANNOUNCE command) so that clients without
// any detour software open subflows to them: detour addresses granted for
// this server (a waypoint that forwards to it) and, behind a layer-4 load
// balancer, the server's own unique address. It also checks, and on request
// sets, the C flag (net.mptcp.allow_join_initial_addr_port=0: "do not join
// my initial address", the address a load balancer hashes on).
//
// The data plane stays the kernel's: the announcement is the kernel's
// ADD_ADDR (retransmitted by the kernel until the client echoes it), the
// subflows are opened by the client's kernel. See docs/agent.md, "Server
// role".
package serverrole

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// MaxAnnounce bounds the announcements per connection: the kernel keeps
// one retransmission timer per announced address and a client accepts at
// most 8 (net.mptcp limits).
const MaxAnnounce = 8

// Announcement is one address announced to every selected connection.
type Announcement struct {
	// Name is for logs (a relay or waypoint name, "unique").
	Name string
	// Addr is the address clients connect to; port 0 = the connection's
	// own port (ADD_ADDR without a port).
	Addr netip.Addr
	Port uint16
	// ID is the address id announced (1-255, unique per configuration).
	ID uint8
}

func (a Announcement) String() string {
	s := a.Addr.String()
	if a.Port != 0 {
		s = netip.AddrPortFrom(a.Addr, a.Port).String()
	}
	return fmt.Sprintf("%s (%s, id %d)", s, a.Name, a.ID)
}

// Config is the validated server section.
type Config struct {
	Announce []Announcement
	// Ports selects the connections by their local (listening) port; none
	// = every server-side connection.
	Ports []policy.PortRange
	// DenyJoinInitial, when set, is written to the namespace at start as
	// net.mptcp.allow_join_initial_addr_port (true -> 0: the C flag is set
	// on new connections) and restored at stop; nil = leave it, report it.
	DenyJoinInitial *bool
	// Interval separates one connection's announcements: the kernel holds
	// one pending ADD_ADDR per connection, and an ANNOUNCE issued before
	// the previous one went out on the wire is dropped without an error
	// (only the MIB counter AddAddrTxDrop says so), to be retransmitted
	// after net.mptcp.add_addr_timeout (120 s by default).
	Interval time.Duration
	// Repeat: a connection with fewer joins than announced addresses
	// after Repeat gets its announcements again (then after 2x, 4x); 0 =
	// rely on the kernel's retransmission (add_addr_timeout, 120 s).
	Repeat time.Duration
}

// DefaultRepeat is Config.Repeat when not configured.
const DefaultRepeat = time.Second

// DefaultInterval is Config.Interval when not configured.
const DefaultInterval = 50 * time.Millisecond

// File is the YAML form (the agent config's `server:` section).
type File struct {
	Announce        []FileAnnouncement `yaml:"announce"`
	Ports           []string           `yaml:"ports"`
	DenyJoinInitial *bool              `yaml:"deny_join_initial"`
	Interval        *config.Duration   `yaml:"announce_interval"`
	Repeat          *config.Duration   `yaml:"announce_repeat"`
}

// FileAnnouncement is one entry of announce.
type FileAnnouncement struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"`
	ID      int    `yaml:"id"`
}

// Build validates the section; errors start with the field path below
// `server.` (the caller adds it and the file position).
func (f *File) Build() (Config, error) {
	var c Config
	if len(f.Announce) == 0 && f.DenyJoinInitial == nil {
		return c, fmt.Errorf("announce: nothing to do (give addresses to announce and/or deny_join_initial)")
	}
	if len(f.Announce) > MaxAnnounce {
		return c, fmt.Errorf("announce: %d addresses, at most %d (a client accepts at most 8)", len(f.Announce), MaxAnnounce)
	}
	ids := map[uint8]int{}
	addrs := map[string]int{}
	next := 1
	for i, a := range f.Announce {
		var an Announcement
		if a.Name == "" {
			return c, fmt.Errorf("announce[%d].name: missing (a name for logs)", i)
		}
		an.Name = a.Name
		ip, port, err := parseAddr(a.Address)
		if err != nil {
			return c, fmt.Errorf("announce[%d].address: %v", i, err)
		}
		an.Addr, an.Port = ip, port
		key := strings.ToLower(a.Address)
		if j, dup := addrs[key]; dup {
			return c, fmt.Errorf("announce[%d].address: %s is already announce[%d]", i, a.Address, j)
		}
		addrs[key] = i
		switch {
		case a.ID < 0 || a.ID > 255:
			return c, fmt.Errorf("announce[%d].id: %d out of range 1-255", i, a.ID)
		case a.ID == 0:
			// Automatic: the lowest id not given explicitly anywhere.
			for explicit(f.Announce, next) || ids[uint8(next)] > 0 {
				next++
			}
			if next > 255 {
				return c, fmt.Errorf("announce[%d].id: no free id left", i)
			}
			an.ID = uint8(next)
		default:
			an.ID = uint8(a.ID)
		}
		if j, dup := ids[an.ID]; dup {
			return c, fmt.Errorf("announce[%d].id: %d is already announce[%d]'s", i, an.ID, j-1)
		}
		ids[an.ID] = i + 1
		c.Announce = append(c.Announce, an)
	}
	for i, p := range f.Ports {
		r, err := policy.ParsePortRange(p)
		if err != nil {
			return c, fmt.Errorf("ports[%d]: %v", i, err)
		}
		c.Ports = append(c.Ports, r)
	}
	c.DenyJoinInitial = f.DenyJoinInitial
	c.Interval = DefaultInterval
	if f.Interval != nil {
		if v := f.Interval.D(); v < 0 || v > 10*time.Second {
			return c, fmt.Errorf("announce_interval: %s out of range 0-10s", v)
		}
		c.Interval = f.Interval.D()
	}
	c.Repeat = DefaultRepeat
	if f.Repeat != nil {
		if v := f.Repeat.D(); v < 0 || v > time.Minute {
			return c, fmt.Errorf("announce_repeat: %s out of range 0-1m", v)
		}
		c.Repeat = f.Repeat.D()
	}
	return c, nil
}

func explicit(as []FileAnnouncement, id int) bool {
	for _, a := range as {
		if a.ID == id {
			return true
		}
	}
	return false
}

// parseAddr accepts ADDRESS or ADDRESS:PORT ([v6]:port).
func parseAddr(s string) (netip.Addr, uint16, error) {
	if s == "" {
		return netip.Addr{}, 0, fmt.Errorf("missing (ADDRESS or ADDRESS:PORT clients connect to)")
	}
	var ip netip.Addr
	var port uint16
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return ip, 0, fmt.Errorf("%q: port 0 (leave the port out to mean the connection's own port)", s)
		}
		ip, port = ap.Addr(), ap.Port()
	} else if a, err := netip.ParseAddr(s); err == nil {
		ip = a
	} else {
		return ip, 0, fmt.Errorf("%q is not ADDRESS or ADDRESS:PORT", s)
	}
	ip = ip.Unmap()
	if ip.Zone() != "" || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() {
		return ip, 0, fmt.Errorf("%q is not an address a client can reach (loopback, link-local, multicast, unspecified or zoned)", s)
	}
	return ip, port, nil
}

// selects reports whether a connection on local port p gets announcements.
func (c *Config) selects(p uint16) bool {
	if len(c.Ports) == 0 {
		return true
	}
	for _, r := range c.Ports {
		if p >= r.Lo && p <= r.Hi {
			return true
		}
	}
	return false
}
