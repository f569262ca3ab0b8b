package relayclient

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/policy"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// File is the `relays:` section of the agent's configuration file:
//
//	relays:
//	  key_file: /etc/mpdetour/member.key     # or key: <base64 private key>
//	  certificate_file: /etc/mpdetour/member.cert  # optional: collective certificate (mpdetour collective issue)
//	  servers:
//	    - {name: detour1, address: 203.0.113.1:45673, public_key: <relay's base64 public key>}
//	    - {name: detour2, address: 198.51.100.1:45673, public_key: <...>, backup: true}  # its NAT detours are backups
//	    - {name: detour3, addresses: [192.0.2.3:45673, '[2001:db8::3]:45673'], public_key: <...>}  # one relay, both families
//	  discovery:                             # optional: also use relays of the collective's roster
//	    authority: mpdetour-authority-v1:... # the collective's authority (entries are verified against it)
//	    max: 4                               # discovered relays used per family
//	    interval: 500ms                       # how often the roster is read from a configured relay
type File struct {
	Key     string `yaml:"key"`
	KeyFile string `yaml:"key_file"`
	// CertificateFile holds the member's collective certificate (text
	// form); every relay connection presents it (relays that accept the
	// collective's certificates serve the member without listing its key).
	CertificateFile string      `yaml:"certificate_file"`
	Servers         []FileRelay `yaml:"servers"`
	// Discovery: relays from the collective's roster (roster.go).
	Discovery *FileDiscovery `yaml:"discovery"`
}

// FileDiscovery is the `relays.discovery` section.
type FileDiscovery struct {
	Authority string          `yaml:"authority"`
	Max       int             `yaml:"max"`
	Interval  config.Duration `yaml:"interval"`
}

// FileRelay is one relay in File.
type FileRelay struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"`
	// Addresses: the relay's control addresses, at most one per family
	// (instead of Address). A relay grants only within a control session's
	// family, so a relay with both is asked over each: the entry becomes
	// one session per address, named NAME/v4 and NAME/v6 in status, logs
	// and metrics; tunnels are asked over the first address only (one
	// tunnel per relay, carrying both families inside when the relay has
	// tunnel.subnet6, or tunnel.vxlan.subnet6 for VXLAN).
	Addresses []string `yaml:"addresses"`
	PublicKey string   `yaml:"public_key"`
	// Backup: its NAT detours are backup subflows (MPTCP B flag).
	Backup bool `yaml:"backup"`
}

// Build validates the section; errors name the field.
func (f *File) Build() (SourceConfig, error) {
	var sc SourceConfig
	var k proto.Key
	var err error
	switch {
	case f.Key != "" && f.KeyFile != "":
		return sc, errors.New("key and key_file are exclusive")
	case f.KeyFile != "":
		if k, err = config.ReadKeyFile(f.KeyFile, proto.ParseKey); err != nil {
			return sc, fmt.Errorf("key_file: %w", err)
		}
	case f.Key == "":
		return sc, errors.New("key (or key_file) is required: the member's private key (`mpdetour relay genkey`)")
	default:
		if k, err = proto.ParseKey(f.Key); err != nil {
			return sc, fmt.Errorf("key: %w", err)
		}
	}
	sc.PrivateKey = k
	if f.CertificateFile != "" {
		b, err := os.ReadFile(f.CertificateFile)
		if err != nil {
			return sc, fmt.Errorf("certificate_file: %w", err)
		}
		c, err := collective.ParseCertificate(string(b))
		if err != nil {
			return sc, fmt.Errorf("certificate_file: %s: %w", f.CertificateFile, err)
		}
		if c.Member != k.Public() {
			return sc, fmt.Errorf("certificate_file: %s is for key %s, not this member's %s", f.CertificateFile, c.Member.ID(), k.Public().ID())
		}
		sc.Options.Certificate = c.Bytes()
	}
	if len(f.Servers) == 0 {
		return sc, errors.New("servers: at least one relay is required")
	}
	names := map[string]bool{}
	// relay (address and key) -> the field that gave it. The same address
	// with another key is allowed: only one of them can be right, and the
	// agent says which (status: no-answer for the wrong key).
	type relayID struct {
		addr netip.AddrPort
		key  proto.Key
	}
	addrs := map[relayID]string{}
	for i, r := range f.Servers {
		if r.Name == "" || names[r.Name] {
			return sc, fmt.Errorf("servers[%d].name: missing or duplicate %q", i, r.Name)
		}
		names[r.Name] = true
		type field struct {
			path, value string
		}
		var given []field
		switch {
		case r.Address != "" && len(r.Addresses) > 0:
			return sc, fmt.Errorf("servers[%d].addresses: address and addresses are exclusive (addresses holds one per family)", i)
		case r.Address != "":
			given = []field{{fmt.Sprintf("servers[%d].address", i), r.Address}}
		case len(r.Addresses) > 2:
			return sc, fmt.Errorf("servers[%d].addresses: %d addresses; at most two, one IPv4 and one IPv6", i, len(r.Addresses))
		case len(r.Addresses) > 0:
			for j, a := range r.Addresses {
				given = append(given, field{fmt.Sprintf("servers[%d].addresses[%d]", i, j), a})
			}
		default:
			return sc, fmt.Errorf("servers[%d].address: missing (the relay's control ADDRESS:PORT; addresses: [IPv4:PORT, '[IPv6]:PORT'] for a relay with both families)", i)
		}
		pub, err := proto.ParseKey(r.PublicKey)
		if err != nil {
			return sc, fmt.Errorf("servers[%d].public_key: %w", i, err)
		}
		var fams [2]string // the field of the IPv4, IPv6 address
		for _, g := range given {
			ap, err := parseRelayAddr(g.value)
			if err != nil {
				return sc, fmt.Errorf("%s: %w", g.path, err)
			}
			fam := 0
			if ap.Addr().Is6() {
				fam = 1
			}
			if fams[fam] != "" {
				return sc, fmt.Errorf("%s: a second %s address (%s has one): one address per family", g.path, policy.FamilyName(ap.Addr()), fams[fam])
			}
			fams[fam] = g.path
			if other, dup := addrs[relayID{ap, pub}]; dup {
				return sc, fmt.Errorf("%s: %s with this public_key is also %s: the same relay listed twice", g.path, ap, other)
			}
			addrs[relayID{ap, pub}] = g.path
			rel := relayconn.Relay{Name: r.Name, Entry: r.Name, Addr: ap, PublicKey: pub, Backup: r.Backup}
			if len(given) > 1 {
				rel.Name = r.Name + "/v" + map[int]string{0: "4", 1: "6"}[fam]
				rel.NoTunnel = len(sc.Relays) > 0 && sc.Relays[len(sc.Relays)-1].Entry == r.Name
			}
			sc.Relays = append(sc.Relays, rel)
		}
	}
	for _, rel := range sc.Relays {
		// NAME/v4 of one entry must not be another entry's plain name.
		if rel.Name != rel.Entry && names[rel.Name] {
			return sc, fmt.Errorf("servers: %q names a relay and is also the IPv%s session of relay %q's addresses", rel.Name, rel.Name[len(rel.Name)-1:], rel.Entry)
		}
	}
	if d := f.Discovery; d != nil {
		ak, err := collective.ParseAuthorityKey(d.Authority)
		if err != nil {
			return sc, fmt.Errorf("discovery.authority: %w", err)
		}
		if f.CertificateFile == "" {
			return sc, errors.New("discovery: needs certificate_file: discovered relays serve certified members, they do not list this key")
		}
		if d.Max < 0 || d.Max > 32 {
			return sc, fmt.Errorf("discovery.max: %d is outside 1..32", d.Max)
		}
		if d.Interval != 0 && (time.Duration(d.Interval) < 100*time.Millisecond || time.Duration(d.Interval) > 10*time.Minute) {
			return sc, fmt.Errorf("discovery.interval: %v is outside 100ms..10m", time.Duration(d.Interval))
		}
		sc.Discovery = &Discovery{Trust: collective.NewTrust(ak), Max: d.Max, Every: time.Duration(d.Interval)}
	}
	return sc, nil
}

// parseRelayAddr reads a relay's control address: IPv4:PORT or
// [IPv6]:PORT, a unicast address usable without a zone.
func parseRelayAddr(v string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(v)
	a := ap.Addr()
	switch {
	case err != nil || ap.Port() == 0:
		return ap, fmt.Errorf("%q is not an IPv4 ADDRESS:PORT or [IPv6]:PORT (the relay's control port, 45673 by default; quote an IPv6 one in YAML)", v)
	case a.Is4In6():
		return ap, fmt.Errorf("%q is an IPv4-mapped IPv6 address: write the IPv4 address %v (a relay's family is the session's)", v, netip.AddrPortFrom(a.Unmap(), ap.Port()))
	case a.Zone() != "" || (a.Is6() && a.IsLinkLocalUnicast()):
		return ap, fmt.Errorf("%q is link-local: a relay needs an address that routes without a zone", v)
	case a.IsUnspecified() || a.IsMulticast():
		return ap, fmt.Errorf("%q is not a unicast address", v)
	}
	return ap, nil
}
