package lease

import (
	"bufio"
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
)

func TestParseProcNetTCP(t *testing.T) {
	const table = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0201000A:9C40 0101000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
`
	ports := map[uint16]bool{}
	if err := parseProcNetTCP(bufio.NewScanner(strings.NewReader(table)), ports); err != nil {
		t.Fatal(err)
	}
	if len(ports) != 2 || !ports[8080] || !ports[53] || ports[40000] {
		t.Fatalf("listening ports %v, want 8080 and 53 only (40000 is an established socket)", ports)
	}
	if err := parseProcNetTCP(bufio.NewScanner(strings.NewReader("hdr\n 0: zz 0 0A\n")), ports); err == nil {
		t.Fatal("garbage accepted")
	}
	// The real tables parse.
	if _, err := listeningPorts(); err != nil {
		t.Fatal(err)
	}
}

func TestPickPort(t *testing.T) {
	lt := NewTable()
	c := netip.MustParseAddr("192.0.2.1")
	lt.lis.read = func() (map[uint16]bool, error) { return map[uint16]bool{101: true}, nil } // a listener on 101
	now := time.Now()
	if p, ok := lt.PickPort(c, 100, 100, 102, false, now); !ok || p != 100 {
		t.Fatalf("proposed free port: %d %v", p, ok)
	}
	lt.Add(&Mapping{Key: dataplane.Key{Client: c, Port: 100}, Server: netip.MustParseAddrPort("198.51.100.1:1")})
	if p, ok := lt.PickPort(c, 100, 100, 102, false, now); !ok || p != 102 {
		t.Fatalf("taken proposed port: got %d %v, want 102 (101 is a listener)", p, ok)
	}
	lt.Add(&Mapping{Key: dataplane.Key{Client: c, Port: 102}, Server: netip.MustParseAddrPort("198.51.100.1:2")})
	if _, ok := lt.PickPort(c, 0, 100, 102, false, now); ok {
		t.Fatal("port found in a full range")
	}
	// Another client has the whole range to itself.
	if _, ok := lt.PickPort(netip.MustParseAddr("192.0.2.2"), 100, 100, 102, false, now); !ok {
		t.Fatal("ports are per client")
	}
	// A closing mapping keeps its port until its counter is read.
	m := lt.ByKey[dataplane.Key{Client: c, Port: 100}]
	lt.Remove(m, "release", time.Now())
	if _, ok := lt.PickPort(c, 100, 100, 100, false, now); ok {
		t.Fatal("closing port reused")
	}
	if lt.count[quotaKey(m.Owner, c)] != 1 {
		t.Fatalf("quota count %v", lt.count)
	}
	// Legacy v1 (anywhere): an unprivileged proposal outside the range is
	// echoed; a privileged one is not.
	if p, ok := lt.PickPort(c, 50000, 100, 102, true, now); !ok || p != 50000 {
		t.Fatalf("legacy proposal outside the range: %d %v, want 50000", p, ok)
	}
	if p, ok := lt.PickPort(c, 80, 100, 102, true, now); ok && p == 80 {
		t.Fatal("legacy proposal of a privileged port echoed")
	}
}

// A moved mapping whose (client, server) the new key holds already leaves
// the lookup entry to the new key's mapping; removing or dropping the
// moved one keeps that entry.
func TestRotateLeaseLookupShared(t *testing.T) {
	client := netip.MustParseAddr("10.0.1.1")
	server := netip.MustParseAddrPort("198.51.100.1:443")
	oldO := Owner{Key: testKey(t), Name: "alice"}
	newO := Owner{Key: testKey(t), Name: "alice"}
	for _, how := range []string{"remove", "drop"} {
		lt := NewTable()
		held := &Mapping{Key: dataplane.Key{Client: client, Port: 40001}, Server: server, Owner: newO}
		moved := &Mapping{Key: dataplane.Key{Client: client, Port: 40002}, Server: server, Owner: oldO}
		lt.Add(held)
		lt.Add(moved)
		lt.Rekey(oldO.Key, newO)
		if lt.Find(newO, client, server) != held {
			t.Fatalf("%s: after the rekey the lookup finds %+v, want the mapping the new key held", how, lt.Find(newO, client, server))
		}
		if how == "remove" {
			lt.Remove(moved, "released", time.Now())
		} else {
			lt.Drop(moved)
		}
		if lt.Find(newO, client, server) != held {
			t.Fatalf("%s of the moved mapping took the other mapping's lookup entry", how)
		}
		if lt.count[quotaKey(newO, client)] != 1 {
			t.Fatalf("%s: quota count %d, want 1", how, lt.count[quotaKey(newO, client)])
		}
		lt.Remove(held, "released", time.Now())
		if len(lt.byServer) != 0 || len(lt.ByKey) != 0 {
			t.Fatalf("%s: left %v %v", how, lt.byServer, lt.ByKey)
		}
	}
}

func FuzzParseProcNetTCP(f *testing.F) {
	f.Add([]byte("  sl  local_address rem_address   st\n   0: 00000000:1F90 00000000:0000 0A\n   1: 0100007F:0035 00000000:0000 0A\n"))
	f.Add([]byte("hdr\n 0: zz 0 0A\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ports := map[uint16]bool{}
		_ = parseProcNetTCP(bufio.NewScanner(bytes.NewReader(b)), ports)
	})
}

func testKey(t *testing.T) proto.Key {
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}
