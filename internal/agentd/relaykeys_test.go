package agentd

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// SIGHUP's followRelayKeys gives each running connection the key its relay
// has in the re-read configuration (by name); other relays keep theirs.
func TestFollowRelayKeys(t *testing.T) {
	key := func() proto.Key {
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		return k.Public()
	}
	member, _ := proto.GenerateKey()
	a0, a1, b0 := key(), key(), key()
	dial := func(name string, pub proto.Key) *relayconn.Conn {
		c, err := relayconn.Dial(relayconn.Relay{Name: name, Addr: netip.MustParseAddrPort("127.0.0.1:9"), PublicKey: pub}, member, relayconn.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb := dial("a", a0), dial("b", b0)
	followRelayKeys([]relayconn.Relay{{Name: "a", PublicKey: a1}, {Name: "b", PublicKey: b0}}, []*relayconn.Conn{ca, cb},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if ca.Relay().PublicKey != a1 || cb.Relay().PublicKey != b0 {
		t.Fatalf("after SIGHUP: a has the new key %v, b kept its key %v", ca.Relay().PublicKey == a1, cb.Relay().PublicKey == b0)
	}
}
