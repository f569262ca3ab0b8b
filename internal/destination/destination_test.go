package destination

import (
	"net/netip"
	"strings"
	"testing"
)

func policy() *Policy {
	p := &Policy{
		Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:1::/48"),
			netip.MustParsePrefix("2001:db8:77::/48")},
		Deny:      []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2a00:dead::/32")},
		DenyPorts: map[uint16]bool{25: true},
	}
	p.SetOwn([]netip.Addr{netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("10.1.0.1"),
		netip.MustParseAddr("2a01:4f8::5"), netip.MustParseAddr("fd00:1::1")},
		[]netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.1.0.0/24"),
			netip.MustParsePrefix("2a01:4f8::/64"), netip.MustParsePrefix("fd00:1::/64")})
	return p
}

func TestCheckIPv4(t *testing.T) {
	p := policy()
	for _, s := range []string{"8.8.8.8:443", "10.1.2.3:80", "10.1.0.9:80", "203.0.114.1:80"} {
		if err := p.Check(netip.MustParseAddrPort(s)); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	for _, s := range []string{"8.8.8.8:25", "127.0.0.1:80", "10.2.0.1:80", "192.168.1.1:80", "172.16.0.1:80", "169.254.0.1:80",
		"224.0.0.1:80", "255.255.255.255:80", "0.0.0.0:80", "203.0.113.5:80", "203.0.113.9:80", "10.1.0.1:80",
		"198.51.100.1:80", "100.64.0.1:80",
		"192.88.99.1:80"} { // the IPv4 counterpart of 2002::/16
		if err := p.Check(netip.MustParseAddrPort(s)); err == nil {
			t.Errorf("%s allowed", s)
		}
	}
}

// The IPv4 documentation ranges are refused like their IPv6 counterpart
// 2001:db8::/32, unless an allow prefix covers them.
func TestCheckIPv4Documentation(t *testing.T) {
	p := &Policy{}
	for _, s := range []string{"192.0.2.1:80", "192.0.2.255:443", "198.51.100.7:80", "203.0.113.200:80"} {
		if err := p.Check(netip.MustParseAddrPort(s)); err == nil || !strings.Contains(err.Error(), "documentation") {
			t.Errorf("%s: %v, want refused as documentation", s, err)
		}
	}
	for _, s := range []string{"192.0.3.1:80", "198.51.101.1:80", "203.0.112.255:80"} { // the neighbours
		if err := p.Check(netip.MustParseAddrPort(s)); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	p.Allow = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/25")}
	if err := p.Check(netip.MustParseAddrPort("192.0.2.9:80")); err != nil {
		t.Errorf("192.0.2.9 refused with 192.0.2.0/25 allowed: %v", err)
	}
	if err := p.Check(netip.MustParseAddrPort("192.0.2.200:80")); err == nil {
		t.Error("192.0.2.200 allowed outside the allowed 192.0.2.0/25")
	}
}

func TestCheckIPv6(t *testing.T) {
	p := policy()
	for _, s := range []string{
		"[2606:4700::1111]:443", // global unicast
		"[2a01:4f8:1::9]:80",    // beside the relay's own /64
		"[fd00:1:0:2::7]:80",    // ULA, allowed
		"[fd00:1::9]:80",        // in the relay's own ULA network, allowed
		"[2001:db8:77::1]:80",   // documentation, allowed
		"[::ffff:8.8.8.8]:443",  // IPv4-mapped: judged as 8.8.8.8
		"[::ffff:10.1.2.3]:80",  // IPv4-mapped: judged as 10.1.2.3 (allowed)
	} {
		if err := p.Check(netip.MustParseAddrPort(s)); err != nil {
			t.Errorf("%s refused: %v", s, err)
		}
	}
	for _, c := range []struct{ addr, why string }{
		{"[2606:4700::1111]:25", "port 25"},
		{"[::]:80", "not a unicast"},
		{"[::1]:80", "loopback"},
		{"[::1.2.3.4]:80", "IPv4-compatible"},
		{"[::ffff:127.0.0.1]:80", "loopback"},
		{"[::ffff:192.168.1.1]:80", "private"},
		{"[::ffff:203.0.113.5]:80", "own address"},
		{"[fe80::1]:80", "link-local"},
		{"[fe80::1%eth0]:80", "zone"},
		{"[fd12::1]:80", "unique local"},
		{"[fc00::1]:80", "unique local"},
		{"[fec0::1]:80", "site-local"},
		{"[ff02::1]:80", "multicast"},
		{"[ff0e::1]:80", "multicast"},
		{"[2001:db8::1]:80", "documentation"},
		{"[3fff::1]:80", "documentation"},
		{"[64:ff9b::808:808]:80", "NAT64"},
		{"[64:ff9b:1::1]:80", "NAT64"},
		{"[2002:a00:1::1]:80", "6to4"},
		{"[2001::1]:80", "IETF"},
		{"[100::1]:80", "discard"},
		{"[5f00::1]:80", "SRv6"},
		{"[4000::1]:80", "outside global unicast"},
		{"[8000::1]:80", "outside global unicast"},
		{"[::ffff:0:102:304]:80", "outside global unicast"}, // IPv4-translated (SIIT)
		{"[2a01:4f8::5]:80", "own address"},
		{"[2a01:4f8::6]:80", "own network"},
		{"[fd00:1::1]:80", "own address"},
		{"[2a00:dead::1]:80", "denied"},
	} {
		err := p.Check(netip.MustParseAddrPort(c.addr))
		if err == nil {
			t.Errorf("%s allowed", c.addr)
		} else if !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s refused for %q, want a reason naming %q", c.addr, err, c.why)
		}
	}
}

// An allowed NAT64 prefix still judges the IPv4 address it stands for.
func TestCheckNAT64Allowed(t *testing.T) {
	p := policy()
	p.Allow = append(p.Allow, netip.MustParsePrefix("64:ff9b::/96"))
	if err := p.Check(netip.MustParseAddrPort("[64:ff9b::808:808]:443")); err != nil {
		t.Errorf("NAT64 of 8.8.8.8 refused with the prefix allowed: %v", err)
	}
	for _, s := range []string{"[64:ff9b::7f00:1]:80", "[64:ff9b::c0a8:101]:80", "[64:ff9b::cb00:7105]:80"} {
		if err := p.Check(netip.MustParseAddrPort(s)); err == nil || !strings.Contains(err.Error(), "NAT64 for a refused IPv4") {
			t.Errorf("%s: %v, want refused as NAT64 of a refused IPv4 address", s, err)
		}
	}
}

func TestSpecialBothFamilies(t *testing.T) {
	var v4, v6 int
	for _, p := range Special() {
		if p.Addr().Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 == 0 || v6 == 0 {
		t.Fatalf("Special() has %d IPv4 and %d IPv6 ranges", v4, v6)
	}
}

// Allowed 6to4 and Teredo ranges judge the IPv4 address they lead to, as
// NAT64 does: allowing them must not open the relay's private networks.
func TestCheckEmbeddedAllowed(t *testing.T) {
	p := policy()
	p.Allow = append(p.Allow, netip.MustParsePrefix("2002::/16"), netip.MustParsePrefix("2001::/32"))
	for _, s := range []string{"[2002:808:808::1]:443", "[2001:0:4136:e378:8000:63bf:f7f7:f7f7]:443"} { // 8.8.8.8
		if err := p.Check(netip.MustParseAddrPort(s)); err != nil {
			t.Errorf("%s refused with its range allowed: %v", s, err)
		}
	}
	for _, c := range []struct{ addr, why string }{
		{"[2002:7f00:1::1]:80", "6to4 for a refused IPv4"},                         // 127.0.0.1
		{"[2002:c0a8:101::1]:80", "6to4 for a refused IPv4"},                       // 192.168.1.1
		{"[2001:0:4136:e378:8000:63bf:53ef:fffe]:80", "Teredo for a refused IPv4"}, // 172.16.0.1 (stored inverted)
		{"[2001:0:4136:e378:8000:63bf:f5ff:fffe]:80", "Teredo for a refused IPv4"}, // 10.0.0.1
	} {
		err := p.Check(netip.MustParseAddrPort(c.addr))
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v, want refused naming %q", c.addr, err, c.why)
		}
	}
}

func TestEmbedded(t *testing.T) {
	refused := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fc00::/7")}
	if got := Embedded(refused, []netip.Prefix{netip.MustParsePrefix("fd00::/8")}); len(got) != 0 {
		t.Errorf("no embedding range allowed, got %v", got)
	}
	got := Embedded(refused, []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("2000::/3")})
	want := []netip.Prefix{netip.MustParsePrefix("64:ff9b::a00:0/104"), netip.MustParsePrefix("2002:a00::/24")}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Embedded = %v, want %v", got, want)
	}
}

func TestParsePrefix(t *testing.T) {
	for s, want := range map[string]string{"10.0.0.0/8": "10.0.0.0/8", "2001:db8::1": "2001:db8::1/128", "8.8.8.8": "8.8.8.8/32"} {
		if p, err := ParsePrefix(s); err != nil || p.String() != want {
			t.Errorf("ParsePrefix(%q) = %v, %v", s, p, err)
		}
	}
	for s, why := range map[string]string{"10.0.0.1/8": "host bits", "::ffff:10.0.0.0/104": "IPv4-mapped", "::ffff:10.0.0.1": "IPv4-mapped",
		"fe80::1%eth0": "zone", "nope": "neither"} {
		if _, err := ParsePrefix(s); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParsePrefix(%q): %v, want %q", s, err, why)
		}
	}
}
