package agentd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const dualRelays = `relays:
  key: 8G3fPZ2bYBwF0uLqBdZ9X1Jt3K4r7mVb6y2N5a8cQ1E=
  servers:
    - name: fra1
      addresses: [192.0.2.10:45673, '[2001:db8::10]:45673']
      public_key: hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=
`

// A relay with both families in one entry: two sessions, the summary
// shows both, convert.relays may name the entry; bad addresses are refused
// at file:line:column of the offending list element.
func TestParseConfigDualRelay(t *testing.T) {
	c, err := ParseConfig([]byte(dualRelays + "convert:\n  enabled: true\n  relays: [fra1]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rs := c.Relays.Relays; len(rs) != 2 || rs[0].Name != "fra1/v4" || rs[1].Name != "fra1/v6" || rs[0].Entry != "fra1" || !rs[1].NoTunnel {
		t.Fatalf("relays: %+v", rs)
	}
	var b bytes.Buffer
	Summary(&b, "agent.yaml", c)
	if !strings.Contains(b.String(), "2 relays") || !strings.Contains(b.String(), "relay fra1/v6 at [2001:db8::10]:45673") {
		t.Errorf("summary:\n%s", b.String())
	}
	if _, err := ParseConfig([]byte(dualRelays + "convert:\n  enabled: true\n  relays: [fra1/v6]\n")); err != nil {
		t.Errorf("convert naming one session: %v", err)
	}
	path := filepath.Join(t.TempDir(), "agent.yaml")
	for _, bad := range []struct{ yaml, want string }{
		{strings.Replace(dualRelays, "192.0.2.10:45673", "'[2001:db8::11]:45673'", 1), ":5:43: relays.servers[0].addresses[1]: a second IPv6 address"},
		{strings.Replace(dualRelays, "192.0.2.10:45673", "'[::ffff:192.0.2.10]:45673'", 1), ":5:19: relays.servers[0].addresses[0]: \"[::ffff:192.0.2.10]:45673\" is an IPv4-mapped IPv6 address"},
		{dualRelays + "    - {name: fra2, address: 192.0.2.10:45673, public_key: hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=}\n", ":7:29: relays.servers[1].address: 192.0.2.10:45673 with this public_key is also servers[0].addresses[0]"},
	} {
		os.WriteFile(path, []byte(bad.yaml), 0o644)
		_, err := LoadConfig(path)
		if err == nil || !strings.Contains(err.Error(), path+bad.want) {
			t.Errorf("got %v, want %s%s", err, path, bad.want)
		}
	}
}
