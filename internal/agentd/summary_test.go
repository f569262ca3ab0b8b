package agentd

import (
	"bytes"
	"strings"
	"testing"
)

// `mpdetour agent --check` prints what the file asks for: the policy,
// subflows, static detours, relays, the server role and legacy daemons.
func TestSummary(t *testing.T) {
	c, err := ParseConfig([]byte(`policy: adaptive
socket: /tmp/a.sock
detours:
  - {kind: nat, relay: r1, address: 10.0.2.2:40000, server: 10.0.3.2:5201}
relays:
  key: 8G3fPZ2bYBwF0uLqBdZ9X1Jt3K4r7mVb6y2N5a8cQ1E=
  servers:
    - {name: fra1, address: 192.0.2.10:45673, public_key: hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=}
legacy_v1:
  - {name: old, address: 10.0.4.2:45672, lease: 1m}
server:
  announce: [{name: a, address: 10.0.6.2:5201}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	Summary(&b, "agent.yaml", c)
	want := "agent.yaml: valid: policy adaptive, 8 detour subflows per connection, 1 static detours, 1 relays, server role announcing 1 addresses, socket /tmp/a.sock\n" +
		"  relay fra1 at 192.0.2.10:45673\n" +
		"  legacy v1 daemon old at 10.0.4.2:45672 (unauthenticated), lease 1m0s\n" +
		"  subflow lowat 131072 bytes (default)\n" +
		"  BPF sock_ops program attaches to cgroup v2 root\n"
	if b.String() != want {
		t.Errorf("summary:\n%s\nwant:\n%s", b.String(), want)
	}
}

// The summary says the per-subflow unsent limit: its value and whether it
// is the default, or off.
func TestSummaryLowat(t *testing.T) {
	for in, want := range map[string]string{
		"":                               "  subflow lowat 131072 bytes (default)\n  BPF sock_ops program attaches to cgroup v2 root\n",
		"bpf_cgroup: /sys/fs/cgroup/m\n": "  subflow lowat 131072 bytes (default)\n  BPF sock_ops program attaches to /sys/fs/cgroup/m\n",
		"subflow_lowat: 65536\n":         "  subflow lowat 65536 bytes\n",
		"subflow_lowat: 0\n":             "  subflow lowat off\n",
		"subflow_lowat: 131072\nsubflow_lowat_scale: rtt\n":          "  subflow lowat 131072 bytes, scaled to the subflows' RTTs (subflow_lowat_scale: rtt; the floor, up to the namespace's tcp_wmem maximum)\n",
		"subflow_lowat: 131072\nsubflow_lowat_scale: none\n":         "  subflow lowat 131072 bytes\n",
		"server:\n  announce: [{name: a, address: 10.0.6.2:5201}]\n": "  subflow lowat off (default without a client role)\n",
	} {
		c, err := ParseConfig([]byte("socket: /tmp/a.sock\n" + in))
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		Summary(&b, "agent.yaml", c)
		if !strings.Contains(b.String(), want) {
			t.Errorf("%q: summary\n%s\nwant a line %q", in, b.String(), want)
		}
	}
}
