package relayclient

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/config"

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
//	  discovery:                             # optional: also use relays of the collective's roster
//	    authority: mpdetour-authority-v1:... # the collective's authority (entries are verified against it)
//	    max: 4                               # discovered relays used at once
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
	Name      string `yaml:"name"`
	Address   string `yaml:"address"`
	PublicKey string `yaml:"public_key"`
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
	for i, r := range f.Servers {
		if r.Name == "" || names[r.Name] {
			return sc, fmt.Errorf("servers[%d].name: missing or duplicate %q", i, r.Name)
		}
		names[r.Name] = true
		ap, err := netip.ParseAddrPort(r.Address)
		if err != nil || ap.Addr().Is4In6() || ap.Addr().Zone() != "" || ap.Port() == 0 {
			return sc, fmt.Errorf("servers[%d].address: %q is not an IPv4 ADDRESS:PORT or [IPv6]:PORT without zone (the relay's control port, 45673 by default; a relay's IPv6 address grants IPv6 detours)", i, r.Address)
		}
		pub, err := proto.ParseKey(r.PublicKey)
		if err != nil {
			return sc, fmt.Errorf("servers[%d].public_key: %w", i, err)
		}
		sc.Relays = append(sc.Relays, relayconn.Relay{Name: r.Name, Addr: ap, PublicKey: pub, Backup: r.Backup})
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
