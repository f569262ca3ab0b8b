package tunnels

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/config"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

func TestParseConfig(t *testing.T) {
	parse := func(s string) error {
		var top struct {
			Tunnel config.Node `yaml:"tunnel"`
		}
		if _, err := config.Parse("relay.yaml", []byte("tunnel:\n"+indent(s)), &top); err != nil {
			t.Fatal(err)
		}
		_, err := ParseConfig(config.NewDoc("relay.yaml", "tunnel", &top.Tunnel))
		return err
	}
	if err := parse("subnet: 100.90.0.0/16\nlisten_port: 5000\nendpoint: 192.0.2.1:5000\nallow_destinations: [10.1.0.0/16]\n"); err != nil {
		t.Errorf("valid config: %v", err)
	}
	if c, err := ParseConfig(nil); err != nil || c.Server.ListenPort != 51820 || c.Server.Subnet.String() != "100.80.0.0/16" || len(c.Server.Destinations.Restricted) == 0 || !c.WireGuard || c.VXLAN {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	if err := parse("subnet: 100.90.0.0/16\nsubnet6: 'fd64:1::/64'\n"); err != nil {
		t.Errorf("valid subnet6: %v", err)
	}
	for _, bad := range []string{"subnett: 1.0.0.0/8", "subnet: nope", "endpoint: 1.2.3.4", "backend: magic", "allow_destinations: [x]", "listen_port: [1]",
		"subnet6: 10.0.0.0/8", "subnet6: nope", "subnet6: '::ffff:0:0/96'", "subnet6: 'fd64::1/64'", "subnet6: 'fd64::/120'",
		// the IPv4-mapped form would be an ip6 rule no IPv4 packet meets, host bits a silent mask
		"allow_destinations: ['::ffff:10.0.0.0/104']", "deny_destinations: ['::ffff:8.8.8.8']", "allow_destinations: [10.0.0.1/8]"} {
		if err := parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n  ") + "\n"
}

// Tunnel-section errors are positioned in the whole relay file.
func TestParseConfigPositions(t *testing.T) {
	src := "listen: 0.0.0.0:45673\ntunnel:\n  subnet: 100.90.0.0/16\n  allow_destinations: [10.0.0.0/8, nope]\n  endpoint: 192.0.2.1\n"
	var top struct {
		Listen string      `yaml:"listen"`
		Tunnel config.Node `yaml:"tunnel"`
	}
	if _, err := config.Parse("relay.yaml", []byte(src), &top); err != nil {
		t.Fatal(err)
	}
	_, err := ParseConfig(config.NewDoc("relay.yaml", "tunnel", &top.Tunnel))
	if err == nil || !strings.HasPrefix(err.Error(), "relay.yaml:5:13: tunnel.endpoint:") {
		t.Fatalf("error %v, want relay.yaml:5:13: tunnel.endpoint: ...", err)
	}
	bad := strings.Replace(src, "  subnet:", "  subnett:", 1)
	if _, err := config.Parse("relay.yaml", []byte(bad), &top); err != nil {
		t.Fatal(err)
	}
	_, err = ParseConfig(config.NewDoc("relay.yaml", "tunnel", &top.Tunnel))
	if err == nil || !strings.HasPrefix(err.Error(), "relay.yaml:3:3: tunnel.subnett: unknown key") {
		t.Fatalf("error %v, want relay.yaml:3:3: tunnel.subnett: unknown key", err)
	}
}

func parseSection(t *testing.T, s string) (Config, error) {
	t.Helper()
	var top struct {
		Tunnel config.Node `yaml:"tunnel"`
	}
	if _, err := config.Parse("relay.yaml", []byte("tunnel:\n"+indent(s)), &top); err != nil {
		t.Fatal(err)
	}
	return ParseConfig(config.NewDoc("relay.yaml", "tunnel", &top.Tunnel))
}

func TestParseKinds(t *testing.T) {
	st, err := parseSection(t, "subnet: 100.90.0.0/16\n")
	if err != nil || !st.WireGuard || st.VXLAN {
		t.Errorf("default kinds: %+v %v", st, err)
	}
	st, err = parseSection(t, "kinds: [vxlan]\nvxlan: {subnet: 100.91.0.0/16, port: 4790, mtu: 1400, lease: 1m}\n")
	if err != nil || st.WireGuard || !st.VXLAN || st.Encap.Port != 4790 || st.Encap.MTU != 1400 || st.Encap.Lease != time.Minute ||
		st.Encap.Subnet != netip.MustParsePrefix("100.91.0.0/16") {
		t.Errorf("vxlan only: %+v %v", st, err)
	}
	if st, err = parseSection(t, "kinds: [wireguard, vxlan]\n"); err != nil || st.Encap.Subnet != netip.MustParsePrefix("100.81.0.0/16") {
		t.Errorf("vxlan defaults: %+v %v", st.Encap, err)
	}
	st, err = parseSection(t, "subnet6: 'fd64:1::/64'\nkinds: [wireguard, vxlan]\nvxlan: {subnet6: 'fd64:81::/64'}\n")
	if err != nil || st.Encap.Subnet6 != netip.MustParsePrefix("fd64:81::/64") {
		t.Errorf("vxlan subnet6: %+v %v", st.Encap, err)
	}
	if st, err = parseSection(t, "kinds: [vxlan]\n"); err != nil || st.Encap.Subnet6.IsValid() {
		t.Errorf("vxlan without subnet6 has an IPv6 inside: %+v %v", st.Encap, err)
	}
	for bad, want := range map[string]string{
		"kinds: [gre]\n":                                              "relay.yaml:2:11: tunnel.kinds[0]: \"gre\" is not wireguard or vxlan",
		"kinds: [vxlan, vxlan]\n":                                     "tunnel.kinds[1]: \"vxlan\" listed twice",
		"vxlan: {port: 4789}\n":                                       "tunnel.vxlan: set, but kinds does not list vxlan",
		"kinds: [vxlan]\nvxlan: {subnet: x}\n":                        "tunnel.vxlan.subnet:",
		"kinds: [vxlan]\nvxlan: {mtu: 100}\n":                         "tunnel.vxlan.mtu: 100 out of range",
		"kinds: [vxlan]\nvxlan: {lease: 1s}\n":                        "tunnel.vxlan.lease: 1s is shorter than 10s",
		"kinds: [vxlan]\nvxlan: {port: 70000}\n":                      "tunnel.vxlan.port: 70000 out of range",
		"kinds: [vxlan]\nvxlan: {sbnet: 1.0.0.0/8}\n":                 "tunnel.vxlan.sbnet: unknown key",
		"kinds: [wireguard, vxlan]\nvxlan: {subnet: 100.80.5.0/24}\n": "overlaps the WireGuard subnet",
		// vxlan.subnet6: the IPv6 inside.
		"kinds: [vxlan]\nvxlan: {subnet6: 100.82.0.0/16}\n":                                   "tunnel.vxlan.subnet6: \"100.82.0.0/16\" is not an IPv6 prefix",
		"kinds: [vxlan]\nvxlan: {subnet6: '::ffff:0:0/96'}\n":                                 "tunnel.vxlan.subnet6:",
		"kinds: [vxlan]\nvxlan: {subnet6: 'fd64:81::/120'}\n":                                 "tunnel.vxlan.subnet6: tunnel subnet6 fd64:81::/120: needs at least 16 host bits",
		"kinds: [vxlan]\nvxlan: {subnet6: 'fd64:81::1/64'}\n":                                 "host bits set",
		"subnet6: 'fd64::/16'\nkinds: [wireguard, vxlan]\nvxlan: {subnet6: 'fd64:81::/64'}\n": "overlaps the WireGuard subnet6",
		// An inner MTU IPv6 cannot use would grant no IPv6 inside at all.
		"kinds: [vxlan]\nvxlan: {subnet6: 'fd64:81::/64', mtu: 1200}\n": "tunnel.vxlan.mtu: 1200 is below IPv6's minimum 1280",
	} {
		if _, err := parseSection(t, bad); err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "relay.yaml:") {
			t.Errorf("%q: got %v, want a positioned error containing %q", bad, err, want)
		}
	}
}

// TestControlChannelEncap: `mpdetour relay` with kinds [wireguard, vxlan]
// serves the encap request over the Noise control channel; the member's
// VXLAN tunnel carries TCP to the server (masqueraded); a non-member gets
// nothing; release removes the relay's device; SIGTERM leaves nothing.
// A relay whose section does not enable vxlan refuses the request.
func TestEncapNotOffered(t *testing.T) {
	a := &Allocator{}
	_, _, err := a.Encap(proto.Key{1}, netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.1"))
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Reason != proto.ReasonUnsupported {
		t.Fatalf("got %v, want unsupported", err)
	}
}

// The relay config's tunnel section.
func FuzzParseTunnelSection(f *testing.F) {
	f.Add([]byte("tunnel:\n  subnet: 100.90.0.0/16\n  listen_port: 5000\n  allow_destinations: [10.0.0.0/8]\n"))
	f.Add([]byte("tunnel: {backend: magic, endpoint: 1.2.3.4}\n"))
	f.Add([]byte("tunnel:\n  kinds: [wireguard, vxlan]\n  vxlan: {subnet: 100.81.0.0/16, port: 4789, mtu: 1450, lease: 5m}\n"))
	f.Add([]byte("tunnel: {kinds: [vxlan, gre], vxlan: {lease: 1s}}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var top struct {
			Tunnel config.Node `yaml:"tunnel"`
		}
		if _, err := config.Parse("f.yaml", b, &top); err != nil || top.Tunnel.Kind == 0 {
			return
		}
		st, err := ParseConfig(config.NewDoc("f.yaml", "tunnel", &top.Tunnel))
		sc := st.Server
		if err == nil && (!sc.Subnet.IsValid() || sc.ListenPort == 0 || (!st.WireGuard && !st.VXLAN) ||
			(st.VXLAN && !st.Encap.Subnet.IsValid())) {
			t.Fatalf("accepted an inconsistent section: %+v", st)
		}
	})
}

// TestEncapMixedFamilies: VXLAN is served over IPv4 and IPv6 control
// sessions; a session whose two ends are of different families (never
// seen from a real socket) is refused unsupported before the server is
// touched.
func TestEncapMixedFamilies(t *testing.T) {
	a := &Allocator{encap: new(tunnel.EncapServer)}
	_, _, err := a.Encap(proto.Key{1}, netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("192.0.2.1"))
	var pe *proto.Error
	if !errors.As(err, &pe) || pe.Reason != proto.ReasonUnsupported || !strings.Contains(err.Error(), "one family") {
		t.Fatalf("got %v, want unsupported naming the families", err)
	}
}
