package tunnel

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func mustKey(t testing.TB) wgtypes.Key { return genKey(t).PublicKey() }

func TestAllocatorStableDistinctAndFull(t *testing.T) {
	seed := mustKey(t)
	subnet := netip.MustParsePrefix("100.80.0.0/29") // 8 addresses: 5 for clients
	a, err := newAllocator(subnet, seed)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]bool{}
	keys := []wgtypes.Key{}
	for i := 0; i < 5; i++ {
		k := mustKey(t)
		keys = append(keys, k)
		ad, err := a.alloc(k)
		if err != nil {
			t.Fatalf("alloc %d: %v", i, err)
		}
		if seen[ad] || !subnet.Contains(ad) || ad == gateway(subnet) || ad == subnet.Addr() || ad == netip.MustParseAddr("100.80.0.7") {
			t.Fatalf("alloc %d gave %s (seen %v)", i, ad, seen)
		}
		seen[ad] = true
	}
	if _, err := a.alloc(mustKey(t)); !errors.Is(err, ErrSubnetFull) {
		t.Fatalf("6th client in a /29: err = %v, want full", err)
	}
	// Same key, same address; after a fresh start too (no collisions: one key).
	first, _ := a.alloc(keys[0])
	b, _ := newAllocator(netip.MustParsePrefix("100.80.0.0/16"), seed)
	c, _ := newAllocator(netip.MustParsePrefix("100.80.0.0/16"), seed)
	x, _ := b.alloc(keys[0])
	y, _ := c.alloc(keys[0])
	if x != y {
		t.Errorf("same seed and key gave %s and %s", x, y)
	}
	if again, _ := a.alloc(keys[0]); again != first {
		t.Errorf("re-alloc gave %s, want %s", again, first)
	}
	// A different relay key moves the client elsewhere (most of the time;
	// with 65533 slots a clash is a 1 in 65533 event).
	d, _ := newAllocator(netip.MustParsePrefix("100.80.0.0/16"), mustKey(t))
	if z, _ := d.alloc(keys[0]); z == x {
		t.Logf("two relay keys gave the same address %s (rare but possible)", z)
	}
	a.free(keys[0])
	if _, err := a.alloc(mustKey(t)); err != nil {
		t.Errorf("alloc after free: %v", err)
	}
}

func TestSubnetChecks(t *testing.T) {
	for _, s := range []string{"2001:db8::/64", "10.0.0.0/31", "10.0.0.0/32", "0.0.0.0/0"} {
		if _, err := newAllocator(netip.MustParsePrefix(s), wgtypes.Key{}); err == nil {
			t.Errorf("subnet %s accepted", s)
		}
	}
	if _, err := newAllocator(netip.Prefix{}, wgtypes.Key{}); err == nil {
		t.Error("zero subnet accepted")
	}
}

func TestStateRoundTripAndValidation(t *testing.T) {
	subnet := netip.MustParsePrefix("100.80.0.0/24")
	a, _ := newAllocator(subnet, mustKey(t))
	k1, k2 := mustKey(t), mustKey(t)
	a1, _ := a.alloc(k1)
	a2, _ := a.alloc(k2)
	b, err := a.marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, peers, err := parseState(b)
	if err != nil || got != subnet || len(peers) != 2 {
		t.Fatalf("parseState = %s, %v, %v", got, peers, err)
	}
	r, _ := newAllocator(subnet, wgtypes.Key{})
	for _, p := range peers {
		if err := r.restore(p.key, p.addr); err != nil {
			t.Fatal(err)
		}
	}
	if r.byKey[k1] != a1 || r.byKey[k2] != a2 {
		t.Errorf("restored %v", r.byKey)
	}
	for _, bad := range []netip.Addr{
		netip.MustParseAddr("100.80.0.0"), netip.MustParseAddr("100.80.0.1"),
		netip.MustParseAddr("100.80.0.255"), netip.MustParseAddr("100.81.0.5"), a2,
	} {
		if err := r.restore(k1, bad); err == nil {
			t.Errorf("restore %s accepted", bad)
		}
	}
	for _, in := range []string{``, `{}`, `{"subnet":"x"}`, `{"subnet":"10.0.0.0/8","peers":[{"key":"zz","address":"10.0.0.2"}]}`,
		`{"subnet":"10.0.0.0/8","peers":[{"key":"` + k1.String() + `","address":"nope"}]}`} {
		if _, _, err := parseState([]byte(in)); err == nil {
			t.Errorf("parseState(%q) accepted", in)
		}
	}
}

func TestUAPIRoundTrip(t *testing.T) {
	priv := genKey(t)
	peer := mustKey(t)
	port := 51820
	ka := 25 * time.Second
	cfg := wgtypes.Config{PrivateKey: &priv, ListenPort: &port, ReplacePeers: true, Peers: []wgtypes.PeerConfig{{
		PublicKey: peer, Endpoint: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 51820},
		PersistentKeepaliveInterval: &ka, ReplaceAllowedIPs: true,
		AllowedIPs: []net.IPNet{{IP: net.IPv4(0, 0, 0, 0).To4(), Mask: net.CIDRMask(0, 32)}},
	}, {PublicKey: mustKey(t), Remove: true}}}
	set := uapiSet(cfg)
	for _, want := range []string{"private_key=", "listen_port=51820\n", "replace_peers=true\n", "endpoint=192.0.2.1:51820\n",
		"persistent_keepalive_interval=25\n", "allowed_ip=0.0.0.0/0\n", "remove=true\n"} {
		if !strings.Contains(set, want) {
			t.Errorf("uapiSet lacks %q:\n%s", want, set)
		}
	}
	get := strings.Join([]string{
		"private_key=" + hexKey(priv), "listen_port=51820", "fwmark=0",
		"public_key=" + hexKey(peer), "preshared_key=" + hexKey(wgtypes.Key{}), "protocol_version=1",
		"endpoint=192.0.2.1:51820", "last_handshake_time_sec=1700000000", "last_handshake_time_nsec=5",
		"tx_bytes=100", "rx_bytes=200", "persistent_keepalive_interval=25", "allowed_ip=0.0.0.0/0", "errno=0", "",
	}, "\n")
	dev, err := parseUAPIGet(get)
	if err != nil {
		t.Fatal(err)
	}
	if dev.PublicKey != priv.PublicKey() || dev.ListenPort != 51820 || len(dev.Peers) != 1 {
		t.Fatalf("device %+v", dev)
	}
	p := dev.Peers[0]
	if p.PublicKey != peer || p.TransmitBytes != 100 || p.ReceiveBytes != 200 || p.LastHandshakeTime.Unix() != 1700000000 ||
		p.PersistentKeepaliveInterval != ka || len(p.AllowedIPs) != 1 || p.Endpoint.String() != "192.0.2.1:51820" {
		t.Errorf("peer %+v", p)
	}
	for _, bad := range []string{"nonsense", "listen_port=99999", "public_key=00", "private_key=" + hexKey(priv) + "\nbogus=1",
		"public_key=" + hexKey(peer) + "\nallowed_ip=1.2.3.4", "errno=5"} {
		if _, err := parseUAPIGet(bad); err == nil {
			t.Errorf("parseUAPIGet(%q) accepted", bad)
		}
	}
}

func hexKey(k wgtypes.Key) string {
	const h = "0123456789abcdef"
	b := make([]byte, 0, 64)
	for _, c := range k {
		b = append(b, h[c>>4], h[c&15])
	}
	return string(b)
}

func TestAllocationValidate(t *testing.T) {
	good := Allocation{Address: netip.MustParsePrefix("100.80.1.2/16"), Endpoint: netip.MustParseAddrPort("192.0.2.1:51820"), RelayKey: mustKey(t)}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Allocation){
		"v6 address":  func(a *Allocation) { a.Address = netip.MustParsePrefix("2001:db8::1/64") },
		"no address":  func(a *Allocation) { a.Address = netip.Prefix{} },
		"loopback":    func(a *Allocation) { a.Address = netip.MustParsePrefix("127.0.0.2/8") },
		"multicast":   func(a *Allocation) { a.Address = netip.MustParsePrefix("224.0.0.1/4") },
		"port 0":      func(a *Allocation) { a.Endpoint = netip.MustParseAddrPort("192.0.2.1:0") },
		"no endpoint": func(a *Allocation) { a.Endpoint = netip.AddrPort{} },
		"zero key":    func(a *Allocation) { a.RelayKey = wgtypes.Key{} },
		"tiny mtu":    func(a *Allocation) { a.MTU = 100 },
	} {
		a := good
		mut(&a)
		if err := a.Validate(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	k := genKey(t)
	base := ServerConfig{Subnet: tunSubnet, ListenPort: 51820, PrivateKey: k}
	for name, mut := range map[string]func(*ServerConfig){
		"iface prefix": func(c *ServerConfig) { c.Iface = "wg0" },
		"iface long":   func(c *ServerConfig) { c.Iface = "mpdt-very-long-name" },
		"port":         func(c *ServerConfig) { c.ListenPort = 0 },
		"key":          func(c *ServerConfig) { c.PrivateKey = wgtypes.Key{} },
		"mtu":          func(c *ServerConfig) { c.MTU = 100000 },
		"subnet":       func(c *ServerConfig) { c.Subnet = netip.MustParsePrefix("10.0.0.0/31") },
		"policy":       func(c *ServerConfig) { c.Destinations.Deny = []netip.Prefix{{}} },
		"backend":      func(c *ServerConfig) { c.Backend = "magic"; c.Netns = "/nonexistent" },
	} {
		c := base
		mut(&c)
		if _, err := NewServer(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewClient(ClientConfig{Index: -1, PrivateKey: k}); err == nil {
		t.Error("negative index accepted")
	}
	if _, err := NewClient(ClientConfig{Index: 0, PrivateKey: k}); err == nil {
		t.Error("empty allocation accepted")
	}
}

func FuzzParseUAPIGet(f *testing.F) {
	f.Add("private_key=0000000000000000000000000000000000000000000000000000000000000000\nlisten_port=1\npublic_key=0000000000000000000000000000000000000000000000000000000000000001\nallowed_ip=0.0.0.0/0\nendpoint=1.2.3.4:5\n")
	f.Add("errno=0\n")
	f.Fuzz(func(t *testing.T, s string) {
		dev, err := parseUAPIGet(s)
		if err == nil && dev == nil {
			t.Fatal("nil device without error")
		}
	})
}

func FuzzParseState(f *testing.F) {
	f.Add([]byte(`{"subnet":"100.80.0.0/16","peers":[{"key":"eLy9PM+Zz0jrbaR9L1wCg0CEuFtoQlxPUeY+2XB6JiI=","address":"100.80.1.2"}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		subnet, peers, err := parseState(b)
		if err != nil {
			return
		}
		a, err := newAllocator(subnet, wgtypes.Key{})
		if err != nil {
			return
		}
		for _, p := range peers {
			_ = a.restore(p.key, p.addr) // must not panic on any input
		}
	})
}

// TestEncapAllocationValidate: an allocation is held to its grant's checks
// (proto.EncapGrant.Validate), plus an MTU that fits the grant's field.
func TestEncapAllocationValidate(t *testing.T) {
	good := EncapAllocation{Address: netip.MustParsePrefix("100.81.0.9/16"), Gateway: netip.MustParseAddr("100.81.0.1"),
		Endpoint: netip.MustParseAddrPort("198.18.1.1:4789"), Member: netip.MustParseAddr("198.18.1.2"), VNI: 8, MTU: 1450}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	six := good
	six.Endpoint, six.Member = netip.MustParseAddrPort("[2001:db8::1]:4789"), netip.MustParseAddr("2001:db8::2")
	if err := six.Validate(); err != nil {
		t.Fatalf("IPv6 underlay: %v", err)
	}
	for name, c := range map[string]struct {
		mut  func(*EncapAllocation)
		want string
	}{
		"v6 address":     {func(a *EncapAllocation) { a.Address = netip.MustParsePrefix("2001:db8::9/64") }, "client prefix"},
		"short prefix":   {func(a *EncapAllocation) { a.Address = netip.MustParsePrefix("100.81.0.9/4") }, "client prefix"},
		"gateway = self": {func(a *EncapAllocation) { a.Gateway = a.Address.Addr() }, "gateway"},
		"broadcast gw":   {func(a *EncapAllocation) { a.Gateway = netip.MustParseAddr("255.255.255.255") }, "gateway"},
		"port 0":         {func(a *EncapAllocation) { a.Endpoint = netip.MustParseAddrPort("198.18.1.1:0") }, "endpoint"},
		"link-local v6":  {func(a *EncapAllocation) { a.Member = netip.MustParseAddr("fe80::1") }, "member"},
		"mixed families": {func(a *EncapAllocation) { a.Member = netip.MustParseAddr("2001:db8::2") }, "different families"},
		"vni 0":          {func(a *EncapAllocation) { a.VNI = 0 }, "VNI"},
		"vni 2^24":       {func(a *EncapAllocation) { a.VNI = 1 << 24 }, "VNI"},
		"tiny mtu":       {func(a *EncapAllocation) { a.MTU = 100 }, "MTU"},
		"mtu 65536+576":  {func(a *EncapAllocation) { a.MTU = 1<<16 + 576 }, "MTU"},
		"negative mtu":   {func(a *EncapAllocation) { a.MTU = -1 }, "MTU"},
	} {
		a := good
		c.mut(&a)
		err := a.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "vxlan allocation: ") {
			t.Errorf("%s: got %v, want a vxlan allocation error naming %q", name, err, c.want)
		}
	}
}
