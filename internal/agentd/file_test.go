package agentd

import (
	"github.com/mpdetour/mpdetour/internal/agent"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/policy"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
)

const goodConfig = `
netns: client
socket: /tmp/x.sock
subflows: 3
announced_subflows: 1
backoff: 500ms
max_backoff: 30s
command_workers: 4
log_level: debug
selectors:
  - prefixes: [10.0.3.0/24, 192.0.2.7]
    ports: ["5201", "8000-8100"]
detours:
  - kind: nat
    relay: d1
    address: 10.1.1.2:4000
    server: 10.0.3.2:5201
  - kind: tunnel
    relay: wg
    local: 10.9.0.2
    servers: [10.0.3.0/24]
`

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.NetNS != "client" || c.Agent.Subflows != 3 || c.Agent.AnnouncedSubflows != 1 || c.Agent.Backoff != 500*time.Millisecond ||
		c.Agent.MaxBackoff != 30*time.Second || c.Agent.CommandWorkers != 4 || len(c.Agent.Selectors) != 1 || len(c.Detours) != 2 {
		t.Fatalf("parsed %+v", c)
	}
	if p := c.Agent.Selectors[0].Prefixes[1]; p != netip.MustParsePrefix("192.0.2.7/32") {
		t.Errorf("bare address parsed as %s", p)
	}
	src := static.New(c.Detours)
	ds := src.Detours(netip.MustParseAddrPort("10.0.3.2:5201"))
	if len(ds) != 2 || ds[0].Kind != detour.NAT || ds[0].Remote != netip.MustParseAddrPort("10.1.1.2:4000") ||
		ds[1].Kind != detour.Tunnel || ds[1].Remote != netip.MustParseAddrPort("10.0.3.2:5201") {
		t.Fatalf("detours toward the server: %v", ds)
	}
	// The NAT port leads to one server:port only; the tunnel reaches the prefix.
	if ds := src.Detours(netip.MustParseAddrPort("10.0.3.2:80")); len(ds) != 1 || ds[0].Kind != detour.Tunnel {
		t.Fatalf("detours toward another port: %v", ds)
	}
	if ds := src.Detours(netip.MustParseAddrPort("10.7.0.1:5201")); len(ds) != 0 {
		t.Fatalf("detours toward an unrelated server: %v", ds)
	}

	if c, err := ParseConfig([]byte("probe_interval: 0\nconnect_timeout: 5s\nstall_retransmits: 5\n")); err != nil || c.Agent.ProbeInterval != 0 || c.Agent.ConnectTimeout != 5*time.Second || c.Agent.StallRetransmits != 5 {
		t.Fatalf("probe_interval 0: %+v %v", c, err)
	}
	def, err := ParseConfig(nil)
	if err != nil || def.Agent.Subflows != 2 || def.Agent.Socket != agent.DefaultSocket || def.Agent.Backoff != time.Second {
		t.Fatalf("empty config: %+v %v", def, err)
	}
}

func TestParseConfigRejects(t *testing.T) {
	for in, want := range map[string]string{
		"subflows: 9":                            "subflows",
		"subflows: many":                         "subflows",
		"sublows: 2":                             "sublows",
		"backoff: soon":                          "backoff",
		"backoff: 2s\nmax_backoff: 1s":           "max_backoff",
		"log_level: loud":                        "log_level",
		"command_workers: -1":                    "command_workers",
		"selectors: [{prefixes: [10.0.0.0/40]}]": "selectors[0].prefixes[0]",
		"selectors: [{ports: [\"0\"]}]":          "selectors[0].ports[0]",
		"other_family: [{server: 10.0.2.2, addresses: [10.0.2.3]}]":                                                  "other_family[0].addresses[0]: 10.0.2.3 is of the server's own family",
		"other_family: [{server: 10.0.2.2, addresses: [\"::ffff:1.2.3.4\"]}]":                                        "IPv4-mapped",
		"other_family: [{server: 10.0.2.2, addresses: [\"fe80::1\"]}]":                                               "other_family[0].addresses[0]",
		"other_family: [{server: 10.0.2.2}]":                                                                         "other_family[0].addresses: missing",
		"other_family: [{server: x, addresses: [\"fd00::2\"]}]":                                                      "other_family[0].server",
		"other_family: [{server: 10.0.2.2, addresses: [\"fd00::2\"]}, {server: 10.0.2.2, addresses: [\"fd00::3\"]}]": "other_family[1].server: 10.0.2.2 listed twice",
		"selectors: [{ports: [\"9-3\"]}]":                                                                            "selectors[0].ports[0]",
		"detours: [{kind: nat, relay: a, address: 10.1.1.2, server: 10.0.3.2:1}]":                                    "detours[0].address",
		"detours: [{kind: nat, relay: a, address: 127.0.0.1:4000, server: 10.0.3.2:1}]":                              "detours[0].address",
		"detours: [{kind: nat, relay: a, address: 10.1.1.2:4000}]":                                                   "detours[0].server",
		"detours: [{kind: nat, address: 10.1.1.2:4000, server: 10.0.3.2:1}]":                                         "detours[0].relay",
		"detours: [{kind: gre, relay: a}]":                                                                           "detours[0].kind",
		"detours: [{relay: a}]":                                                                                      "detours[0].kind",
		"detours: [{kind: tunnel, relay: a, local: fe80::1}]":                                                        "detours[0].local",
		"detours: [{kind: tunnel, relay: a, local: 10.9.0.2, servers: [x]}]":                                         "detours[0].servers[0]",
		"detours: [{kind: tunnel, relay: a, local: 10.9.0.2, address: 10.1.1.2:4000}]":                               "detours[0].kind",
		"detours: [{kind: tunnel, relay: a, local: 10.9.0.2}, {kind: tunnel, relay: a, local: 10.9.0.2}]":            "detours[1]",
		"{":                                    "",
		"policy: greedy":                       "policy",
		"watchdog: 0s":                         "watchdog",
		"window: -1s":                          "window",
		"metrics: {listen: nowhere}":           "metrics.listen",
		"metrics: {listen: \"unix:rel.sock\"}": "metrics.listen",
		"metrics: {token_file: /nonexistent}":  "metrics.token_file: set without metrics.listen",
		"metrics: {listen: 127.0.0.1:9465, token_file: /nonexistent/t}":                         "metrics.token_file",
		"legacy_v1: [{name: v1, address: \"[::1]:45672\"}]":                                     "legacy_v1[0].address",
		"legacy_v1: [{address: 10.1.1.2:45672}]":                                                "legacy_v1[0].name",
		"legacy_v1: [{name: v1, address: 10.1.1.2:45672, lease: 1s}]":                           "legacy_v1[0].lease",
		"legacy_v1: [{name: v1, address: 10.1.1.2:45672}, {name: v1, address: 10.1.1.3:45672}]": "legacy_v1[1].name",
		"server: {announce: [{name: d, address: 127.0.0.1}]}":                                   "server.announce[0].address",
		"server: {}":         "server.announce: nothing to do",
		"tunnel_kind: vxlan": "tunnel_kind: set, but tunnels is not true",
		"tunnel_kind: gre":   "tunnel_kind",
		"path_check: true":   "path_check",
		"relay_ping: 5s":     "relay_ping: set, but there is no relays section",
	} {
		_, err := ParseConfig([]byte(in))
		if err == nil {
			t.Errorf("%q: accepted", in)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %q does not name %q", in, err, want)
		}
	}
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("subflows: 20\n"), 0o644)
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "subflows") {
		t.Errorf("LoadConfig error %v: want the file and the field named", err)
	}
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

// The adaptive policy's knobs, backup detours, metrics and v1 daemons.
func TestParseConfigPolicyAndExtras(t *testing.T) {
	c, err := ParseConfig([]byte(`policy: adaptive
watchdog: 300ms
window: 4s
hold: 20s
metrics: {listen: 127.0.0.1:9465}
log_level: debug
detours:
  - {kind: nat, relay: a, address: 10.1.1.2:4000, server: 10.0.3.2:5201, backup: true}
legacy_v1:
  - {name: old, address: 10.1.1.3:45672, lease: 5m}
  - {name: older, address: 10.1.1.4:45672}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.Policy != policy.Adaptive || c.Agent.Watchdog != 300*time.Millisecond || c.Agent.Window != 4*time.Second || c.Agent.Hold != 20*time.Second ||
		c.Agent.MetricsListen != "127.0.0.1:9465" || c.Agent.LogLevel != slog.LevelDebug || !c.Detours[0].Detour.Backup ||
		len(c.LegacyV1) != 2 || c.LegacyV1[0].Name != "old" || c.LegacyV1[0].Lease != 5*time.Minute ||
		c.LegacyV1[1].Lease != 10*time.Minute { // per daemon (issue 28: one lease was stored for all)
		t.Fatalf("parsed %+v", c)
	}
	if d, _ := ParseConfig(nil); d.Agent.Policy != policy.Static || d.Agent.Subflows != 2 || d.Agent.ProbeInterval != time.Second {
		t.Fatalf("default policy %v, subflows %d, probe %s; want static, 2, 1s", d.Agent.Policy, d.Agent.Subflows, d.Agent.ProbeInterval)
	}
	// The adaptive policy's own defaults, unless set.
	if a, _ := ParseConfig([]byte("policy: adaptive\n")); a.Agent.Subflows != 8 || a.Agent.ProbeInterval != 100*time.Millisecond {
		t.Fatalf("adaptive defaults: subflows %d, probe %s; want 8, 100ms", a.Agent.Subflows, a.Agent.ProbeInterval)
	}
	if a, _ := ParseConfig([]byte("policy: adaptive\nsubflows: 3\nprobe_interval: 1s\n")); a.Agent.Subflows != 3 || a.Agent.ProbeInterval != time.Second {
		t.Fatalf("adaptive with subflows/probe_interval set: %d, %s", a.Agent.Subflows, a.Agent.ProbeInterval)
	}
	if _, err := ParseConfig([]byte("policy: adaptive\nprobe_interval: 0s\n")); err == nil || !strings.Contains(err.Error(), "probe_interval") {
		t.Fatalf("adaptive without measurements accepted: %v", err)
	}
	// backup-first: measured every 100 ms, the general subflow default.
	if b, err := ParseConfig([]byte("policy: backup-first\n")); err != nil || b.Agent.Policy != policy.BackupFirst || b.Agent.Subflows != 2 || b.Agent.ProbeInterval != 100*time.Millisecond {
		t.Fatalf("backup-first: %v, subflows %d, probe %s, err %v; want 2, 100ms", b.Agent.Policy, b.Agent.Subflows, b.Agent.ProbeInterval, err)
	}
	if _, err := ParseConfig([]byte("policy: backup-first\nprobe_interval: 0s\n")); err == nil || !strings.Contains(err.Error(), "backup-first") {
		t.Fatalf("backup-first without measurements accepted: %v", err)
	}
	if b, err := ParseConfig([]byte("buffer_sizing: true\n")); err != nil || !b.Agent.BufferSizing {
		t.Fatalf("buffer_sizing: %v %v", b.Agent.BufferSizing, err)
	}
	// On by default (docs/agent.md, "Host buffer sizing"); false turns it
	// off; without measurements the default is off, an explicit true refused.
	for in, want := range map[string]bool{"subflows: 1\n": true, "buffer_sizing: false\n": false,
		"probe_interval: 0s\n": false, "probe_interval: 0s\nbuffer_sizing: false\n": false, "policy: adaptive\n": true} {
		if b, err := ParseConfig([]byte(in)); err != nil || b.Agent.BufferSizing != want {
			t.Fatalf("%q: buffer sizing %v (err %v), want %v", in, b.Agent.BufferSizing, err, want)
		}
	}
	if _, err := ParseConfig([]byte("buffer_sizing: true\nprobe_interval: 0s\n")); err == nil || !strings.Contains(err.Error(), "buffer_sizing") {
		t.Fatalf("buffer_sizing without measurements accepted: %v", err)
	}
	if b, err := ParseConfig([]byte("stale_loss_cnt: 2\n")); err != nil || b.Agent.StaleLossCnt != 2 {
		t.Fatalf("stale_loss_cnt: %d %v", b.Agent.StaleLossCnt, err)
	}
	if b, err := ParseConfig([]byte("subflows: 1\n")); err != nil || b.Agent.StaleLossCnt != 0 {
		t.Fatalf("stale_loss_cnt unset: %d %v, want 0 (leave the namespace's)", b.Agent.StaleLossCnt, err)
	}
	for _, bad := range []string{"0", "-1", "256", "two"} {
		if _, err := ParseConfig([]byte("stale_loss_cnt: " + bad + "\n")); err == nil || !strings.Contains(err.Error(), "stale_loss_cnt") {
			t.Fatalf("stale_loss_cnt: %s accepted or unclear: %v", bad, err)
		}
	}
}

// Errors carry file:line:column of the whole file and the field.
func TestConfigErrorPositions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("subflows: 2\ndetours:\n  - kind: nat\n    relay: a\n    address: 10.1.1.2\n    server: 10.0.3.2:1\n"), 0o644)
	_, err := LoadConfig(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":5:14: detours[0].address:") {
		t.Fatalf("error %v, want %s:5:14: detours[0].address: ...", err, path)
	}
	os.WriteFile(path, []byte("server:\n  announce:\n    - {name: d, address: 10.0.6.2:0}\n"), 0o644)
	if _, err := LoadConfig(path); err == nil || !strings.HasPrefix(err.Error(), path+":3:26: server.announce[0].address:") {
		t.Fatalf("error %v, want %s:3:26: server.announce[0].address: ...", err, path)
	}
	os.WriteFile(path, []byte("subflows: 2\nwatchdog: soon\n"), 0o644)
	if _, err := LoadConfig(path); err == nil || !strings.HasPrefix(err.Error(), path+":2:11: watchdog:") {
		t.Fatalf("error %v, want %s:2:11: watchdog: ...", err, path)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte("detours: [{kind: nat, relay: a, address: 10.1.1.2:4000, server: 10.0.3.2:1}]"))
	f.Add([]byte("server: {announce: [{name: d, address: 10.0.6.2:5201}, {name: u, address: 10.0.31.2, id: 9}], ports: [\"5201\"], deny_join_initial: true}"))
	f.Add([]byte(dualRelays))
	f.Add([]byte(strings.Replace(dualRelays, "192.0.2.10:45673", "'[::ffff:192.0.2.10]:45673'", 1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		if c.Agent.Subflows < 0 || c.Agent.Subflows > 8 || c.Agent.Backoff <= 0 || c.Agent.MaxBackoff < c.Agent.Backoff {
			t.Fatalf("accepted out-of-range config %+v", c)
		}
		_ = static.New(c.Detours).Detours(netip.MustParseAddrPort("10.0.3.2:5201"))
	})
}

// other_family maps a server address to its addresses of the other family.
func TestParseConfigOtherFamily(t *testing.T) {
	c, err := ParseConfig([]byte("other_family:\n  - {server: 10.0.2.2, addresses: [\"fd00:2::2\"]}\n  - {server: \"fd00:5::5\", addresses: [10.0.5.5]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := c.Agent.OtherFamily
	if got := m[netip.MustParseAddr("10.0.2.2")]; len(got) != 1 || got[0] != netip.MustParseAddr("fd00:2::2") {
		t.Fatalf("10.0.2.2 -> %v", got)
	}
	if got := m[netip.MustParseAddr("fd00:5::5")]; len(got) != 1 || got[0] != netip.MustParseAddr("10.0.5.5") {
		t.Fatalf("fd00:5::5 -> %v", got)
	}
}

// The guard block: parsed into the agent's options with the policy, refused
// with another policy, out of range or misspelt, each naming the key.
func TestParseConfigGuard(t *testing.T) {
	c, err := ParseConfig([]byte("policy: guard\nguard:\n  share: 0.3\n  window: 1500ms\n"))
	if err != nil || c.Agent.Policy != policy.Guard || c.Agent.GuardShare != 0.3 || c.Agent.GuardWindow != 1500*time.Millisecond || c.Agent.ProbeInterval != 100*time.Millisecond {
		t.Fatalf("guard config: %+v %v", c.Agent, err)
	}
	if c, err := ParseConfig([]byte("policy: guard\n")); err != nil || c.Agent.GuardShare != 0 || c.Agent.GuardWindow != 0 || c.Agent.GuardStarve != 0 {
		t.Fatalf("guard without its block (the policy's defaults): %+v %v", c.Agent, err)
	}
	// starve: 1 turns the starvation condition off (the rule before it).
	for in, want := range map[string]float64{"policy: guard\nguard: {starve: 1}\n": 1, "policy: guard\nguard: {starve: 0.3}\n": 0.3, "policy: guard\nguard:\n": 0} {
		if c, err := ParseConfig([]byte(in)); err != nil || c.Agent.GuardStarve != want {
			t.Fatalf("%q: starve %g, %v; want %g", in, c.Agent.GuardStarve, err, want)
		}
	}
	// rtt: 0 drops the RTT condition (negative for the policy), unset is
	// the policy's default (0).
	for in, want := range map[string]float64{"policy: guard\nguard: {rtt: 0}\n": -1, "policy: guard\nguard: {rtt: 1.5}\n": 1.5, "policy: guard\nguard: {share: 0.2}\n": 0} {
		if c, err := ParseConfig([]byte(in)); err != nil || c.Agent.GuardRTT != want {
			t.Fatalf("%q: rtt %g, %v; want %g", in, c.Agent.GuardRTT, err, want)
		}
	}
	// outage: 0 judges subflows through outages (negative for the policy),
	// unset is the policy's default (0).
	for in, want := range map[string]int{"policy: guard\nguard: {outage: 0}\n": -1, "policy: guard\nguard: {outage: 3}\n": 3, "policy: guard\nguard: {rtt: 0}\n": 0} {
		if c, err := ParseConfig([]byte(in)); err != nil || c.Agent.GuardOutage != want {
			t.Fatalf("%q: outage %d, %v; want %d", in, c.Agent.GuardOutage, err, want)
		}
	}
	// An empty guard block under another policy is refused as a full one
	// is, at its line.
	for _, in := range []string{"policy: static\nguard:\n", "policy: adaptive\nguard: {}\n"} {
		if _, err := ParseConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), "config:2:") || !strings.Contains(err.Error(), "guard: set, but the policy is") {
			t.Errorf("%q: error %v, want one at config:2 saying the block tunes policy: guard", in, err)
		}
	}
	for in, want := range map[string]string{
		"guard: {share: 0.3}":                  "guard: set, but the policy is static",
		"policy: guard\nguard: {share: 0}":     "guard.share: 0 out of range",
		"policy: guard\nguard: {share: 1}":     "guard.share: 1 out of range",
		"policy: guard\nguard: {window: 50ms}": "guard.window: 50ms out of range",
		// The rule judges over at most 8 s (it keeps no longer history):
		// a longer window would be cut short without a word.
		"policy: guard\nguard: {window: 9s}":  "guard.window: 9s out of range 200ms-8s",
		"policy: guard\nguard: {shar: 0.3}":   "unknown key \"shar\"",
		"policy: guard\nguard: {starve: 0}":   "guard.starve: 0 out of range",
		"policy: guard\nguard: {starve: 1.5}": "guard.starve: 1.5 out of range",
		"policy: guard\nguard: {starve: -1}":  "guard.starve: -1 out of range",
		"policy: guard\nguard: {rtt: 0.5}":    "guard.rtt: 0.5 out of range",
		"policy: guard\nguard: {rtt: 11}":     "guard.rtt: 11 out of range",
		"policy: guard\nguard: {outage: 16}":  "guard.outage: 16 out of range",
		"policy: guard\nguard: {outage: -1}":  "guard.outage: -1 out of range",
		"policy: guard\nguard: {outage: 1.5}": "guard.outage",
	} {
		if _, err := ParseConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", in, err, want)
		}
	}
}

// ParseFragment: a fragment's errors name its own lines, a key the filler
// also writes is "given twice", and what the fragment sets is in the
// Config (the defaults elsewhere).
func TestParseFragment(t *testing.T) {
	c, err := ParseFragment("policy: static\nsubflow_lowat: 0") // no final newline
	if err != nil {
		t.Fatal(err)
	}
	if c.SubflowLowat != 0 || c.SubflowLowatDefault {
		t.Errorf("subflow_lowat: 0 read as %d (default %v)", c.SubflowLowat, c.SubflowLowatDefault)
	}
	if _, err := ParseFragment(""); err != nil {
		t.Errorf("empty fragment: %v", err)
	}
	for _, c := range []struct{ text, want string }{
		{"policy: static\nbogus_key: 1\n", "config:2"},
		{"subflows: 2\n", "given twice"},
	} {
		_, err := ParseFragment(c.text)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseFragment(%q) = %v, want an error with %q", c.text, err, c.want)
		}
	}
}
