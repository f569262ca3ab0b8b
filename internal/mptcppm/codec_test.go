package mptcppm

import (
	"sort"

	"github.com/mdlayher/netlink"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fixtures are raw event attributes recorded from the kernel (go test
// -record), named <test>-<side>-<seq>-<TYPE>.bin.
func fixtures(t testing.TB) map[string][]byte {
	files, err := filepath.Glob("testdata/*.bin")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in testdata: %v", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = b
	}
	return out
}

func typeFromName(t testing.TB, name string) EventType {
	s := strings.TrimSuffix(name[strings.LastIndex(name, "-")+1:], ".bin")
	for typ, n := range eventNames {
		if n == s {
			return typ
		}
	}
	t.Fatalf("fixture %s: unknown event type %q", name, s)
	return 0
}

func TestFixturesRoundTrip(t *testing.T) {
	seen := map[EventType]bool{}
	for name, b := range fixtures(t) {
		typ := typeFromName(t, name)
		seen[typ] = true
		ev, err := DecodeEvent(typ, b)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if ev.Token == 0 || !ev.Present.Has(AttrToken) {
			t.Errorf("%s: no token: %v", name, ev)
		}
		if len(ev.Unknown) != 0 {
			t.Errorf("%s: attributes this codec does not know: %v", name, ev.Unknown)
		}
		switch typ {
		case EventCreated, EventEstablished, EventSubEstablished, EventSubClosed, EventSubPriority:
			if !ev.Local.Addr().IsValid() || !ev.Remote.Addr().IsValid() || ev.Local.Port() == 0 || ev.Remote.Port() == 0 {
				t.Errorf("%s: incomplete addresses: %v", name, ev)
			}
		case EventAnnounced:
			if !ev.Remote.Addr().IsValid() || !ev.Present.Has(AttrRemID) {
				t.Errorf("%s: announcement without address or id: %v", name, ev)
			}
		}
		enc, err := ev.Encode()
		if err != nil {
			t.Errorf("%s: encode: %v", name, err)
			continue
		}
		// The kernel's attribute order differs between event types; each
		// attribute must come back byte for byte.
		if got, want := sortedAttrs(t, enc), sortedAttrs(t, b); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: re-encoded attributes differ\n got %x\nwant %x", name, got, want)
		}
		again, err := DecodeEvent(typ, enc)
		if err != nil || !reflect.DeepEqual(again, ev) {
			t.Errorf("%s: decode(encode(x)) = %v, %v; want %v", name, again, err, ev)
		}
	}
	for _, typ := range []EventType{EventCreated, EventEstablished, EventClosed, EventAnnounced, EventRemoved, EventSubEstablished, EventSubClosed, EventSubPriority} {
		if !seen[typ] {
			t.Errorf("no recorded fixture for %s", typ)
		}
	}
}

func sortedAttrs(t *testing.T, b []byte) []netlink.Attribute {
	as, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Type < as[j].Type })
	return as
}

func TestDecodeRejects(t *testing.T) {
	good := Event{Type: EventSubClosed, Token: 7, Present: 1 << evToken}
	good.SetAddrs(netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("[2001:db8::1]:2"))
	b, err := good.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := DecodeEvent(EventSubClosed, b); err != nil || ev.Remote != good.Remote || ev.Local != good.Local {
		t.Fatalf("mixed-family event: %v %v", ev, err)
	}
	for name, in := range map[string][]byte{
		"truncated attribute": b[:len(b)-3],
		"short token":         {6, 0, evToken, 0, 1, 2, 0, 0},
		"short saddr6":        {8, 0, evSaddr6, 0, 1, 2, 3, 4},
		"repeated token":      {8, 0, evToken, 0, 1, 0, 0, 0, 8, 0, evToken, 0, 2, 0, 0, 0},
		"v4 and v6 source":    append([]byte{8, 0, evSaddr4, 0, 1, 2, 3, 4, 20, 0, evSaddr6, 0}, make([]byte, 16)...),
	} {
		if _, err := DecodeEvent(EventCreated, in); err == nil {
			t.Errorf("%s: decoded without error", name)
		} else if !strings.Contains(err.Error(), "CREATED") {
			t.Errorf("%s: error does not name the event: %v", name, err)
		}
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for name, b := range fixtures(f) {
		f.Add(uint8(typeFromName(f, name)), b)
	}
	f.Fuzz(func(t *testing.T, typ uint8, b []byte) {
		ev, err := DecodeEvent(EventType(typ), b)
		if err != nil {
			return
		}
		_ = ev.String()
		enc, err := ev.Encode()
		if err != nil {
			t.Fatalf("decoded event does not encode: %v", err)
		}
		again, err := DecodeEvent(EventType(typ), enc)
		if err != nil || !reflect.DeepEqual(again, ev) {
			t.Fatalf("round trip: %v %v != %v", again, err, ev)
		}
	})
}

func FuzzDecodeDiag(f *testing.F) {
	f.Add(make([]byte, diagMsgLen))
	f.Add(append(append([]byte{afInet, 1}, make([]byte, diagMsgLen-2)...), 8, 0, diagInfo, 0, 1, 2, 3, 4))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseMPTCPDiag(b)
		_, _, _ = parseSubflowDiag(b)
		_, _ = DecodeMPTCPInfo(b)
	})
}

// The address attribute of mptcp_pm messages (bytes from the kernel: fuzzed like every parser of untrusted input).
func FuzzDecodeAddr(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x08, 0x00, 0x03, 0x00, 0x0a, 0x00, 0x00, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeAddr(b)
	})
}
