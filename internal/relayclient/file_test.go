package relayclient

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

func TestFileConfig(t *testing.T) {
	priv, _ := proto.GenerateKey()
	rk, _ := proto.GenerateKey()
	good := File{Key: priv.String(), Servers: []FileRelay{{Name: "r1", Address: "203.0.113.1:45673", PublicKey: rk.Public().String()}}}
	sc, err := good.Build()
	if err != nil || sc.PrivateKey != priv || len(sc.Relays) != 1 || sc.Relays[0].PublicKey != rk.Public() || sc.Relays[0].Addr.Port() != 45673 {
		t.Fatalf("%+v %v", sc, err)
	}
	bad := map[string]File{
		"key (or key_file)":     {Servers: good.Servers},
		"exclusive":             {Key: "a", KeyFile: "b", Servers: good.Servers},
		"servers: at least":     {Key: priv.String()},
		"servers[0].address":    {Key: priv.String(), Servers: []FileRelay{{Name: "r", Address: "nowhere", PublicKey: rk.String()}}},
		"servers[0].public_key": {Key: priv.String(), Servers: []FileRelay{{Name: "r", Address: "1.2.3.4:1", PublicKey: "x"}}},
		"servers[1].name":       {Key: priv.String(), Servers: append(append([]FileRelay{}, good.Servers...), good.Servers...)},
	}
	for want, fc := range bad {
		if _, err := fc.Build(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want %q", fc, err, want)
		}
	}
}

func TestFileConfigCertificate(t *testing.T) {
	auth, _ := collective.NewAuthority()
	k, _ := proto.GenerateKey()
	other, _ := proto.GenerateKey()
	relay, _ := proto.GenerateKey()
	dir := t.TempDir()
	write := func(member proto.Key) string {
		c, err := auth.Issue(member.Public(), "m", collective.RoleClient, time.Now(), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, member.Public().ID()+".cert")
		if err := os.WriteFile(p, []byte(c.String()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := File{Key: k.String(), Servers: []FileRelay{{Name: "r", Address: "192.0.2.1:45673", PublicKey: relay.Public().String()}}}
	f := base
	f.CertificateFile = write(k)
	sc, err := f.Build()
	if err != nil || len(sc.Options.Certificate) == 0 {
		t.Fatalf("valid certificate: %v, %d bytes", err, len(sc.Options.Certificate))
	}
	f.CertificateFile = write(other)
	if _, err := f.Build(); err == nil || !strings.Contains(err.Error(), "certificate_file") {
		t.Fatalf("certificate for another key: %v", err)
	}
	f.CertificateFile = filepath.Join(dir, "missing")
	if _, err := f.Build(); err == nil || !strings.Contains(err.Error(), "certificate_file") {
		t.Fatalf("missing certificate: %v", err)
	}
}

func TestFileConfigDiscovery(t *testing.T) {
	auth, _ := collective.NewAuthority()
	k, _ := proto.GenerateKey()
	relay, _ := proto.GenerateKey()
	c, err := auth.Issue(k.Public(), "m", collective.RoleClient, time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert := filepath.Join(t.TempDir(), "m.cert")
	if err := os.WriteFile(cert, []byte(c.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	base := File{Key: k.String(), CertificateFile: cert, Servers: []FileRelay{{Name: "r", Address: "192.0.2.1:45673", PublicKey: relay.Public().String()}}}
	f := base
	f.Discovery = &FileDiscovery{Authority: auth.Public().String(), Max: 3}
	sc, err := f.Build()
	if err != nil || sc.Discovery == nil || sc.Discovery.Max != 3 || sc.Discovery.Trust.Authority() != auth.Public() {
		t.Fatalf("discovery: %+v %v", sc.Discovery, err)
	}
	bad := map[string]*FileDiscovery{
		"discovery.authority": {Authority: "x"},
		"discovery.max":       {Authority: auth.Public().String(), Max: 99},
		"discovery.interval":  {Authority: auth.Public().String(), Interval: 1},
	}
	for want, d := range bad {
		f := base
		f.Discovery = d
		if _, err := f.Build(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want %q", d, err, want)
		}
	}
	f = base
	f.CertificateFile = ""
	f.Discovery = &FileDiscovery{Authority: auth.Public().String()}
	if _, err := f.Build(); err == nil || !strings.Contains(err.Error(), "certificate_file") {
		t.Errorf("discovery without a certificate: %v", err)
	}
}

// One entry with an address per family: two sessions named NAME/v4 and
// NAME/v6 sharing the entry's key and backup mark, the tunnel asked over
// the first; bad addresses refused naming the field.
func TestFileConfigAddresses(t *testing.T) {
	priv, _ := proto.GenerateKey()
	rk, _ := proto.GenerateKey()
	pub := rk.Public().String()
	good := File{Key: priv.String(), Servers: []FileRelay{
		{Name: "r1", Addresses: []string{"[2001:db8::1]:45673", "203.0.113.1:45673"}, PublicKey: pub, Backup: true},
		{Name: "r2", Address: "198.51.100.2:45673", PublicKey: pub},
		{Name: "r3", Addresses: []string{"[2001:db8::3]:45673"}, PublicKey: pub},
	}}
	sc, err := good.Build()
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		name, entry, addr string
		noTunnel, backup  bool
	}
	want := []row{
		{"r1/v6", "r1", "[2001:db8::1]:45673", false, true},
		{"r1/v4", "r1", "203.0.113.1:45673", true, true},
		{"r2", "r2", "198.51.100.2:45673", false, false},
		{"r3", "r3", "[2001:db8::3]:45673", false, false},
	}
	if len(sc.Relays) != len(want) {
		t.Fatalf("%d relays, want %d: %+v", len(sc.Relays), len(want), sc.Relays)
	}
	for i, w := range want {
		r := sc.Relays[i]
		if got := (row{r.Name, r.Entry, r.Addr.String(), r.NoTunnel, r.Backup}); got != w || r.PublicKey != rk.Public() {
			t.Errorf("relay %d: %+v, want %+v", i, got, w)
		}
	}
	one := func(r ...FileRelay) File { return File{Key: priv.String(), Servers: r} }
	other, _ := proto.GenerateKey()
	twoKeys := one(FileRelay{Name: "good", Address: "192.0.2.1:1", PublicKey: pub}, FileRelay{Name: "wrongkey", Address: "192.0.2.1:1", PublicKey: other.Public().String()})
	if _, err := twoKeys.Build(); err != nil {
		t.Errorf("one address with two keys (only one can be right; status tells which): %v", err)
	}
	for want, fc := range map[string]File{
		"servers[0].addresses: address and addresses are exclusive":                                                         one(FileRelay{Name: "a", Address: "192.0.2.1:1", Addresses: []string{"[2001:db8::1]:1"}, PublicKey: pub}),
		"servers[0].addresses[1]: a second IPv4 address (servers[0].addresses[0] has one)":                                  one(FileRelay{Name: "a", Addresses: []string{"192.0.2.1:1", "192.0.2.2:1"}, PublicKey: pub}),
		"servers[0].addresses: 3 addresses":                                                                                 one(FileRelay{Name: "a", Addresses: []string{"192.0.2.1:1", "[2001:db8::1]:1", "192.0.2.2:1"}, PublicKey: pub}),
		"servers[0].addresses[1]: \"[::ffff:192.0.2.1]:1\" is an IPv4-mapped":                                               one(FileRelay{Name: "a", Addresses: []string{"[2001:db8::1]:1", "[::ffff:192.0.2.1]:1"}, PublicKey: pub}),
		"servers[0].addresses[0]: \"[fe80::1%eth0]:1\" is link-local":                                                       one(FileRelay{Name: "a", Addresses: []string{"[fe80::1%eth0]:1"}, PublicKey: pub}),
		"servers[0].address: \"[fe80::1]:1\" is link-local":                                                                 one(FileRelay{Name: "a", Address: "[fe80::1]:1", PublicKey: pub}),
		"servers[0].address: \"[::]:1\" is not a unicast":                                                                   one(FileRelay{Name: "a", Address: "[::]:1", PublicKey: pub}),
		"servers[0].address: missing":                                                                                       one(FileRelay{Name: "a", PublicKey: pub}),
		"servers[1].addresses[0]: 192.0.2.1:1 with this public_key is also servers[0].address: the same relay listed twice": one(FileRelay{Name: "a", Address: "192.0.2.1:1", PublicKey: pub}, FileRelay{Name: "b", Addresses: []string{"192.0.2.1:1"}, PublicKey: pub}),
		"\"a/v6\" names a relay and is also the IPv6 session of relay \"a\"":                                                one(FileRelay{Name: "a", Addresses: []string{"192.0.2.1:1", "[2001:db8::1]:1"}, PublicKey: pub}, FileRelay{Name: "a/v6", Address: "192.0.2.9:1", PublicKey: pub}),
	} {
		if _, err := fc.Build(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
}

// One config entry with both addresses (a fake relay's key on 127.0.0.1
// and on ::1): each session is asked only for servers of its own family
// (a relay grants only within a session's family; asking the other one
// would only bring policy-denied answers), and each server gets the
// detour of its family's session, named NAME/v4 or NAME/v6.
func TestSourceDualEntryAsksPerFamily(t *testing.T) {
	m := memberKey(t)
	relayKey, _ := proto.GenerateKey()
	r4 := newFakeRelayAt(t, m.Public(), relayKey, net.IPv4(127, 0, 0, 1))
	r6 := newFakeRelayAt(t, m.Public(), relayKey, net.IPv6loopback)
	f := File{Key: m.String(), Servers: []FileRelay{{Name: "r", PublicKey: relayKey.Public().String(),
		Addresses: []string{r4.relay().Addr.String(), r6.relay().Addr.String()}}}}
	sc, err := f.Build()
	if err != nil {
		t.Fatal(err)
	}
	sc.Options.ListenPacket = relayconn.ListenIn("")
	s, err := NewSource(sc)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v4, v6 := netip.MustParseAddrPort("192.0.2.10:5201"), netip.MustParseAddrPort("[2001:db8::10]:5201")
	s.Prepare(v4)
	s.Prepare(v6)
	deadline := time.Now().Add(5 * time.Second)
	for {
		d4, d6 := s.Detours(v4), s.Detours(v6)
		if len(d4) == 1 && len(d6) == 1 {
			if d4[0].Relay != "r/v4" || d6[0].Relay != "r/v6" {
				t.Fatalf("detours %v and %v, want one through r/v4 and one through r/v6", d4, d6)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("detours %v and %v after 5 s, want one each", d4, d6)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g4, g6 := r4.count(proto.OpGrant), r6.count(proto.OpGrant); g4 != 1 || g6 != 1 {
		t.Errorf("grant requests: %d over IPv4, %d over IPv6; want 1 each (none toward the other family)", g4, g6)
	}
}
