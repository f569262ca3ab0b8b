package mptcppm

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
)

// attrs decodes one level of attributes into type -> payload.
func attrs(t *testing.T, b []byte) map[uint16][]byte {
	t.Helper()
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint16][]byte{}
	for ad.Next() {
		m[ad.Type()&0x3fff] = append([]byte(nil), ad.Bytes()...)
	}
	if err := ad.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// ANNOUNCE: token, and the address nested with family, id, address, port
// in host order (as the kernel reads it) and the signal flag it requires.
func TestAnnounceEncoding(t *testing.T) {
	r := announceReq(0x188acefa, Addr{ID: 7, IP: netip.MustParseAddr("10.0.6.2"), Port: 5201})
	if r.cmd != CmdAnnounce || cmdNames[r.cmd] != "ANNOUNCE" {
		t.Fatalf("command %d", r.cmd)
	}
	b, err := r.marshal()
	if err != nil {
		t.Fatal(err)
	}
	top := attrs(t, b)
	if got := binary.NativeEndian.Uint32(top[attrToken]); got != 0x188acefa {
		t.Errorf("token %08x", got)
	}
	a := attrs(t, top[attrAddr])
	if binary.NativeEndian.Uint16(a[addrFamily]) != afInet || a[addrID][0] != 7 ||
		!bytes.Equal(a[addrAddr4], []byte{10, 0, 6, 2}) || binary.NativeEndian.Uint16(a[addrPort]) != 5201 ||
		AddrFlags(binary.NativeEndian.Uint32(a[addrFlags])) != FlagSignal {
		t.Errorf("nested address %x", top[attrAddr])
	}
	back, err := decodeAddr(top[attrAddr])
	if err != nil || back.ID != 7 || back.IP != netip.MustParseAddr("10.0.6.2") || back.Port != 5201 || back.Flags != FlagSignal {
		t.Errorf("decoded back %v %v", back, err)
	}
	// No port: ADD_ADDR without one (the client uses the connection's port).
	b, _ = announceReq(1, Addr{ID: 1, IP: netip.MustParseAddr("2001:db8::1")}).marshal()
	a = attrs(t, attrs(t, b)[attrAddr])
	if _, ok := a[addrPort]; ok || binary.NativeEndian.Uint16(a[addrFamily]) != afInet6 || len(a[addrAddr6]) != 16 {
		t.Errorf("v6 without port: %v", a)
	}
	if _, err := announceReq(1, Addr{ID: 1}).marshal(); err == nil {
		t.Error("ANNOUNCE without an address encoded")
	}
}

func TestRemoveEncoding(t *testing.T) {
	r := removeReq(0xdeadbeef, 3)
	b, err := r.marshal()
	if err != nil || r.cmd != CmdRemove {
		t.Fatal(err, r.cmd)
	}
	top := attrs(t, b)
	if binary.NativeEndian.Uint32(top[attrToken]) != 0xdeadbeef || !bytes.Equal(top[attrLocID], []byte{3}) || len(top) != 2 {
		t.Errorf("REMOVE attributes %v", top)
	}
}
