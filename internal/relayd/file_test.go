package relayd

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/roster"
)

func TestParseConfig(t *testing.T) {
	priv, member := testKey(t), testKey(t).Public()
	good := "private_key: " + priv.String() + "\nmembers:\n  - {name: a, public_key: " + member.String() + "}\n"
	s, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if s.Listen.Port() != relay.DefaultPort || s.PortLo != 20000 || !s.DenyPorts[25] || s.Members[member] != "a" || s.Legacy || s.FastPath {
		t.Fatalf("defaults: %+v", s)
	}
	s, err = ParseConfig([]byte(good + "ports: 40000-40010\nlease: 30s\ndeny_ports: [22]\nallow_destinations: [10.0.0.0/8, 192.0.2.1]\nlegacy_v1: {enabled: true}\nquota: {per_member: 5, global: 7}\nfast_path: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.PortLo != 40000 || s.PortHi != 40010 || s.Lease != 30*time.Second || s.DenyPorts[25] || !s.DenyPorts[22] ||
		len(s.Allow) != 2 || s.Allow[1].Bits() != 32 || !s.Legacy || s.LegacyListen.Port() != proto.LegacyPort || s.QuotaPerMember != 5 || s.QuotaGlobal != 7 || !s.FastPath {
		t.Fatalf("parsed: %+v", s)
	}
	if s.ReceiveBuffer != relay.DefaultReceiveBuffer {
		t.Fatalf("receive_buffer default: %d", s.ReceiveBuffer)
	}
	for in, want := range map[string]int{"receive_buffer: 0\n": 0, "receive_buffer: 16777216\n": 16 << 20} {
		if s, err := ParseConfig([]byte(good + in)); err != nil || s.ReceiveBuffer != want {
			t.Fatalf("%q: receive buffer %d, %v; want %d", in, s.ReceiveBuffer, err, want)
		}
	}
	s, err = ParseConfig([]byte(good + "convert: {enabled: true}\n"))
	if err != nil || !s.Convert.Enabled || s.Convert.Listen.Port() != relay.DefaultConvertPort || s.Convert.MaxConns != 1024 {
		t.Fatalf("convert defaults: %+v %v", s.Convert, err)
	}
	bad := map[string]string{
		"":                                                      "empty",
		"private_key: x\n":                                      "private_key",
		good + "ports: 9-1\n":                                   "ports",
		good + "lease: forever\n":                               "duration",
		good + "lease: 1s\n":                                    "lease",
		good + "listen: nowhere\n":                              "listen",
		good + "listen: '[::1]:1'\n":                            "listen6",
		good + "listen6: '10.0.0.1:1'\n":                        "listen6",
		good + "listen6: '[::ffff:10.0.0.1]:1'\n":               "listen6",
		good + "listen6: '[fe80::1%eth0]:1'\n":                  "zone",
		good + "listen6: nowhere\n":                             "listen6",
		good + "detour_address6: 2001:db8::5\n":                 "needs listen6",
		good + "listen6: '[::]:1'\ndetour_address6: 10.0.0.1\n": "detour_address6",
		good + "listen6: '[::]:1'\ndetour_address6: '::ffff:10.0.0.1'\n":              "detour_address6",
		good + "detour_address: 2001:db8::5\n":                                        "detour_address6",
		good + "allow_destinations: ['::ffff:10.0.0.0/104']\n":                        "IPv4-mapped",
		good + "allow_destinations: ['::ffff:10.0.0.1']\n":                            "IPv4-mapped",
		good + "deny_destinations: ['fe80::1%eth0']\n":                                "zone",
		good + "convert: {enabled: true, listen6: '[::]:45674'}\n":                    "needs listen6",
		good + "listen6: '[::]:1'\nconvert: {enabled: true, listen6: '10.0.0.1:1'}\n": "convert.listen6",
		good + "convert: {enabled: true, listen: '[::]:45674'}\n":                     "convert.listen6",
		good + "allow_destinations: [10.0.0.1/8]\n":                                   "host bits",
		good + "unknown_field: 1\n":                                                   "unknown_field",
		"private_key: " + priv.String() + "\n":                                        "members",
		good + "  - {name: a, public_key: " + testKey(t).Public().String() + "}\n":    "duplicate",
		good + "  - {name: b, public_key: " + member.String() + "}\n":                 "same key",
		good + "metrics: {listen: x}\n":                                               "metrics.listen",
		good + "convert: {enabled: true, listen: nowhere}\n":                          "convert.listen",
		good + "convert: {enabled: true, max_conns: -1}\n":                            "convert.max_conns",
		good + "fast_path: sometimes\n":                                               "fast_path",
		good + "receive_buffer: 1000\n":                                               "receive_buffer: 1000 is outside",
		good + "receive_buffer: -1\n":                                                 "receive_buffer",
		good + "receive_buffer: 1073741824\n":                                         "receive_buffer",
		good + "receive_buffer: 4MB\n":                                                "receive_buffer",
	}
	for cfg, want := range bad {
		_, err := ParseConfig([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v, want one mentioning %q", cfg, err, want)
		}
	}
}

func TestFairConfig(t *testing.T) {
	priv, member := testKey(t), testKey(t).Public()
	good := "private_key: " + priv.String() + "\nmembers:\n  - {name: a, public_key: " + member.String() + "}\n"
	s, err := ParseConfig([]byte(good + "state_file: /var/lib/x/state.json\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Fair.LedgerFile != "/var/lib/x/state.json.ledger" || s.Fair.Capacity != 0 || s.Fair.ReceiptEvery != 10*time.Minute || s.Fair.ReceiptsFile != "" {
		t.Fatalf("defaults: %+v", s.Fair)
	}
	s, err = ParseConfig([]byte(good + "fair_share: {capacity: 8, ledger_file: /tmp/l, receipts_file: /tmp/r, receipt_every: 30s}\n"))
	if err != nil || s.Fair != (relay.FairConfig{Capacity: 8, LedgerFile: "/tmp/l", ReceiptsFile: "/tmp/r", ReceiptEvery: 30 * time.Second}) {
		t.Fatalf("parsed %+v %v", s.Fair, err)
	}
	for cfg, want := range map[string]string{
		good + "fair_share: {capacity: -1}\n":         "fair_share.capacity",
		good + "fair_share: {receipt_every: 100ms}\n": "fair_share.receipt_every",
		good + "fair_share: {receipts_file: /tmp}\n":  "fair_share.receipts_file",
		good + "fair_share: {capacity: lots}\n":       "capacity",
		good + "fair_share: {unknown: 1}\n":           "unknown",
	} {
		if _, err := ParseConfig([]byte(cfg)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error mentioning %q", cfg, err, want)
		}
	}
}

func TestPreviousKeyConfig(t *testing.T) {
	cur, prev := testKey(t), testKey(t)
	head := "listen: 10.0.0.1:45673\nmembers: [{name: alice, public_key: " + testKey(t).Public().String() + "}]\nprivate_key: " + cur.String() + "\n"
	s, err := ParseConfig([]byte(head + "previous_private_key: " + prev.String() + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.PrivateKey != cur || s.PreviousKey != prev {
		t.Fatal("keys not parsed")
	}
	if s, err := ParseConfig([]byte(head)); err != nil || !s.PreviousKey.IsZero() {
		t.Fatalf("no previous key: %v %v", s, err)
	}
	for name, bad := range map[string]string{
		"same key":   "previous_private_key: " + cur.String() + "\n",
		"not a key":  "previous_private_key: nope\n",
		"both forms": "previous_private_key: " + prev.String() + "\nprevious_private_key_file: /nonexistent\n",
		"no file":    "previous_private_key_file: /nonexistent/key\n",
	} {
		_, err := ParseConfig([]byte(head + bad))
		if err == nil || !strings.Contains(err.Error(), "previous_private_key") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestParseGossipConfig(t *testing.T) {
	priv := testKey(t)
	auth, _ := collective.NewAuthority()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	issue := func(k [32]byte, roles collective.Roles, nb, na time.Time) string {
		c, err := auth.Issue(k, "relay-a", roles, nb, na)
		if err != nil {
			t.Fatal(err)
		}
		return c.String()
	}
	cert := write("relay.cert", issue(priv.Public(), collective.RoleRelay, now.Add(-time.Hour), now.Add(time.Hour)))
	clientOnly := write("client.cert", issue(priv.Public(), collective.RoleClient, now.Add(-time.Hour), now.Add(time.Hour)))
	expired := write("expired.cert", issue(priv.Public(), collective.RoleRelay, now.Add(-2*time.Hour), now.Add(-time.Hour)))
	otherKey := write("other.cert", issue(testKey(t).Public(), collective.RoleRelay, now.Add(-time.Hour), now.Add(time.Hour)))
	secret := write("secret", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=\n")
	head := "private_key: " + priv.String() + "\nlisten: 10.0.0.1:45673\ncollective:\n  authority: " + auth.Public().String() + "\n"
	good := head + "  certificate_file: " + cert + "\n  gossip:\n    bind: 10.0.0.1:7946\n    join: [10.0.0.2:7946, relay-b.example:7946]\n    region: eu-west\n    secret_file: " + secret + "\n    suspicion_mult: 2\n    push_pull_interval: 90s\n    retransmit_mult: 6\n"
	s, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	g := s.Gossip
	if g == nil || g.Bind.String() != "10.0.0.1:7946" || g.Advertise != g.Bind || len(g.Join) != 2 || g.Region != "eu-west" ||
		len(g.Announce) != 1 || g.Announce[0] != s.Listen || g.Capacity != uint32(s.QuotaGlobal) || len(g.Secret) != 32 ||
		g.Tuning != (relay.GossipTuning{SuspicionMult: 2, PushPullInterval: 90 * time.Second, RetransmitMult: 6}) {
		t.Fatalf("gossip settings: %+v", g)
	}
	s, err = ParseConfig([]byte(head + "  certificate_file: " + cert + "\n  gossip: {advertise: 192.0.2.1:45675, secret_file: " + secret + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Gossip.Bind.Port() != roster.DefaultPort || s.Gossip.Announce[0].String() != "10.0.0.1:45673" {
		t.Fatalf("gossip defaults: %+v", s.Gossip)
	}
	// Gossip over IPv6, and both control addresses announced by default.
	head6 := "private_key: " + priv.String() + "\nlisten: 10.0.0.1:45673\nlisten6: '[2001:db8::1]:45673'\ncollective:\n  authority: " + auth.Public().String() + "\n"
	s, err = ParseConfig([]byte(head6 + "  certificate_file: " + cert + "\n  gossip: {bind: '[2001:db8::1]:7946', join: ['[2001:db8::2]:7946'], secret_file: " + secret + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Gossip.Bind.String() != "[2001:db8::1]:7946" || len(s.Gossip.Announce) != 2 || s.Gossip.Announce[0] != s.Listen || s.Gossip.Announce[1] != s.Listen6 {
		t.Fatalf("gossip over IPv6: bind %v announce %v", s.Gossip.Bind, s.Gossip.Announce)
	}
	s, err = ParseConfig([]byte(head6 + "  certificate_file: " + cert + "\n  gossip: {announce: ['[2001:db8::9]:45673', 192.0.2.9:45673], bind: 10.0.0.1:7946, secret_file: " + secret + "}\n"))
	if err != nil || len(s.Gossip.Announce) != 2 || s.Gossip.Announce[0].String() != "[2001:db8::9]:45673" {
		t.Fatalf("announce of both families: %+v %v", s.Gossip, err)
	}
	bad := map[string]string{
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, announce: ['[2001:db8::9]:1']}\n":                                        "listen6 is not set",
		head6 + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, announce: ['[fe80::1%eth0]:1']}\n":                                      "collective.gossip.announce[0]",
		head6 + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, announce: ['[::ffff:10.0.0.1]:1']}\n":                                   "collective.gossip.announce[0]",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                       "collective.gossip.secret_file: required",
		head + "  gossip: {bind: 10.0.0.1:7946}\n":                                                                                                         "collective.certificate_file: required",
		head + "  certificate_file: " + clientOnly + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                 "role not granted",
		head + "  certificate_file: " + expired + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                    "expired",
		head + "  certificate_file: " + otherKey + "\n  gossip: {bind: 10.0.0.1:7946}\n":                                                                   "not this relay's",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 0.0.0.0:7946}\n":                                                                        "collective.gossip.advertise: required",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: nowhere}\n":                                                                             "collective.gossip.bind",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, join: [nope]}\n":                                                         "collective.gossip.join[0]",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, region: \"\\x01\"}\n":                                                    "collective.gossip.region",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, capacity: -1}\n":                                                         "collective.gossip.capacity",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, secret_file: " + cert + "}\n":                                            "collective.gossip.secret_file",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, probe_timeout: 2s, secret_file: " + secret + "}\n":                       "probe_timeout",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, announce: [0.0.0.0:1]}\n":                                                "collective.gossip.announce[0]",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, suspicion_mult: 99, secret_file: " + secret + "}\n":                      "collective.gossip.suspicion_mult",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, push_pull_interval: 5h, secret_file: " + secret + "}\n":                  "collective.gossip.push_pull_interval",
		head + "  certificate_file: " + cert + "\n  gossip: {bind: 10.0.0.1:7946, bogus: 1}\n":                                                             "bogus",
		"private_key: " + priv.String() + "\nmembers: [{name: a, public_key: " + priv.Public().String() + "}]\ncollective: {gossip: {bind: 10.0.0.1:1}}\n": "needs collective.authority",
	}
	for cfg, want := range bad {
		_, err := ParseConfig([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q:\nerror %v, want one mentioning %q", cfg, err, want)
		}
	}
	// Errors carry the line of the field.
	_, err = ParseConfig([]byte(head + "  certificate_file: " + cert + "\n  gossip:\n    bind: 10.0.0.1:7946\n    join: [nope]\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "config:8:") {
		t.Errorf("join error not at line 8: %v", err)
	}
}

// Key files are checked by the loader: a file others can read is refused
// with the chmod to run, an empty or malformed one is named, and the error
// points at the line of the config that names the file.
func TestConfigKeyFileHygiene(t *testing.T) {
	dir := t.TempDir()
	k, _ := proto.GenerateKey()
	member, _ := proto.GenerateKey()
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"world.key", k.String() + "\n", 0o644, "relay.yaml:2:19: private_key_file: %s holds a private key but is readable or writable by group or others (mode 0644); run: chmod 600 %s"},
		{"empty.key", "", 0o600, "relay.yaml:2:19: private_key_file: %s is empty; create a key with"},
		{"bad.key", "not-a-key\n", 0o600, "relay.yaml:2:19: private_key_file: %s does not hold a valid private key"},
		{"good.key", k.String() + "\n", 0o600, ""},
	} {
		kp := filepath.Join(dir, tc.name)
		if err := os.WriteFile(kp, []byte(tc.content), tc.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(kp, tc.mode)
		cp := filepath.Join(dir, "relay.yaml")
		cfg := "listen: 0.0.0.0:45673\nprivate_key_file: " + kp + "\nmembers:\n  - {name: a, public_key: " + member.Public().String() + "}\n"
		if err := os.WriteFile(cp, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(cp)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		want := strings.ReplaceAll(tc.want, "%s", kp)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, want)
		}
	}
}

func FuzzRelayParseConfig(f *testing.F) {
	f.Add([]byte("listen: 0.0.0.0:45673\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nmembers:\n  - {name: a, public_key: mN2TeWHHug6AVNfO1hbb4+4npFJSyQH6lJZp/9ysN3s=}\n"))
	f.Add([]byte("members: []\nlegacy_v1: {enabled: true}\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nports: 1-2\nlease: 2s\n"))
	f.Add([]byte("tunnel: {subnet: 100.80.0.0/16}\nquota: {per_member: -1}\n"))
	f.Add([]byte("listen6: '[::]:45673'\ndetour_address6: 2001:db8::5\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nmembers:\n  - {name: a, public_key: mN2TeWHHug6AVNfO1hbb4+4npFJSyQH6lJZp/9ysN3s=}\nallow_destinations: ['fd00::/8', '::ffff:10.0.0.1', 'fe80::1%eth0']\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseConfig(b)
		if err != nil {
			return
		}
		if s.PortLo == 0 || s.PortLo > s.PortHi || s.Lease <= 0 || (len(s.Members) == 0 && !s.Legacy) {
			t.Fatalf("accepted an inconsistent config: %+v", s)
		}
		if !s.Listen.Addr().Is4() || s.Listen6.IsValid() && !s.Listen6.Addr().Is6() || s.DetourAddress6.IsValid() && !s.Listen6.IsValid() {
			t.Fatalf("accepted listen %v, listen6 %v, detour_address6 %v", s.Listen, s.Listen6, s.DetourAddress6)
		}
		for _, p := range append(append([]netip.Prefix(nil), s.Allow...), s.Deny...) {
			if p.Addr().Zone() != "" || p.Addr().Is4In6() {
				t.Fatalf("accepted destination prefix %v", p)
			}
		}
	})
}

func testKey(t *testing.T) proto.Key {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestParseConfigIPv6(t *testing.T) {
	priv, member := testKey(t), testKey(t).Public()
	cfg := "private_key: " + priv.String() + "\nmembers:\n  - {name: a, public_key: " + member.String() + "}\n" +
		"listen6: '[::]:45673'\ndetour_address6: 2001:db8:1::5\nallow_destinations: ['fd00:2::/64', 2001:db8:77::1]\ndeny_destinations: ['2a00:dead::/32']\n"
	s, err := ParseConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if s.Listen6 != netip.MustParseAddrPort("[::]:45673") || s.DetourAddress6 != netip.MustParseAddr("2001:db8:1::5") ||
		len(s.Allow) != 2 || s.Allow[1] != netip.MustParsePrefix("2001:db8:77::1/128") || s.Deny[0] != netip.MustParsePrefix("2a00:dead::/32") {
		t.Fatalf("parsed: listen6 %v detour_address6 %v allow %v deny %v", s.Listen6, s.DetourAddress6, s.Allow, s.Deny)
	}
	// Without listen6 there is no IPv6 control socket (the default).
	s, err = ParseConfig([]byte("private_key: " + priv.String() + "\nmembers:\n  - {name: a, public_key: " + member.String() + "}\n"))
	if err != nil || s.Listen6.IsValid() {
		t.Fatalf("default listen6 %v (%v), want none", s.Listen6, err)
	}
}
