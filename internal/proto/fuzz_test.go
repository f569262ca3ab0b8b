package proto

import (
	"github.com/flynn/noise"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func FuzzParseRequest(f *testing.F) {
	for _, r := range []RequestBody{
		&GrantRequest{Server: netip.MustParseAddrPort("198.51.100.1:80"), Port: 4000},
		&GrantRequest{Server: netip.MustParseAddrPort("[2001:db8::1]:80")},
		&RenewRequest{Port: 9}, &TunnelRequest{}, &PingRequest{}, &ConvertRequest{Count: 4}, &CertifyRequest{Cert: []byte{1, 2, 3}}, &ReceiptRequest{Receipt: make([]byte, 161)},
		&EncapRequest{Action: EncapOpen}, &EncapRequest{Action: EncapRelease}, &EncapRequest{Action: EncapOpen, IPv6: true},
		&RosterRequest{Start: 3},
		&RosterRequest{Start: 0, Have: 0x1122334455667788},
		&RotateRequest{Rotate: Rotation{Old: Key{1, 2, 3}, Time: 1764115200, Signature: [RotateSigLen]byte{9, 9}}},
	} {
		b, _ := MarshalRequest(NewRequest(1, r))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			if ReasonOf(err) == OK {
				t.Fatalf("error without reason: %v", err)
			}
			return
		}
		again, err := MarshalRequest(r)
		if err != nil {
			t.Fatalf("parsed %+v does not marshal: %v", r, err)
		}
		if r2, err := ParseRequest(again); err != nil || !reflect.DeepEqual(r2, r) {
			t.Fatalf("re-parse %+v: %+v %v", r, r2, err)
		}
	})
}

func FuzzParseReply(f *testing.F) {
	for _, r := range []Reply{
		{Op: OpGrant, Body: &GrantReply{Detour: netip.MustParseAddrPort("203.0.113.1:40001"), Lease: time.Minute}},
		{Op: OpTunnel, Body: &TunnelReply{Tunnel: TunnelGrant{ClientPrefix: netip.MustParsePrefix("100.64.0.2/24"), Endpoint: netip.MustParseAddrPort("203.0.113.1:51820")}}},
		{Op: OpRelease, Body: &ReleaseReply{Bytes: 5}}, {Op: OpGrant, Reason: ReasonPolicyDenied}, {Op: OpReceipt, Body: &ReceiptReply{Credit: -5}}, {Op: OpRotate, Body: &RotateReply{}}, {Op: OpGrant, Reason: ReasonCapacity},
		{Op: OpConvert, Body: &ConvertReply{Converter: netip.MustParseAddrPort("203.0.113.1:45674"), Lease: time.Minute, Tickets: [][TicketLen]byte{{9}}}},
		{Op: OpConvert, Body: &ConvertReply{Converter: netip.MustParseAddrPort("[2001:db8::1]:45674"), Lease: time.Minute, Tickets: make([][TicketLen]byte, MaxTickets)}},
		{Op: OpEncap, Body: &EncapReply{Lease: 5 * time.Minute, Encap: EncapGrant{ClientPrefix: netip.MustParsePrefix("100.81.0.7/16"),
			Gateway: netip.MustParseAddr("100.81.0.1"), Endpoint: netip.MustParseAddrPort("198.18.1.1:4789"),
			Member: netip.MustParseAddr("198.18.1.2"), VNI: 7, MTU: 1450}}},
		{Op: OpEncap, Body: &EncapReply{Lease: 5 * time.Minute, Encap: EncapGrant{ClientPrefix: netip.MustParsePrefix("100.81.0.7/16"),
			Gateway: netip.MustParseAddr("100.81.0.1"), Endpoint: netip.MustParseAddrPort("[2001:db8:1::1]:4789"),
			Member: netip.MustParseAddr("2001:db8:1::2"), VNI: 7, MTU: 1430}}},
		{Op: OpEncap, Body: &EncapReply{Lease: 5 * time.Minute, Encap: EncapGrant{ClientPrefix: netip.MustParsePrefix("100.81.0.7/16"),
			Gateway: netip.MustParseAddr("100.81.0.1"), Endpoint: netip.MustParseAddrPort("198.18.1.1:4789"),
			Member: netip.MustParseAddr("198.18.1.2"), VNI: 7, MTU: 1450,
			ClientPrefix6: netip.MustParsePrefix("fd64:81::7/64"), Gateway6: netip.MustParseAddr("fd64:81::1")}}},
		{Op: OpEncap, Body: &EncapReply{}},
		{Op: OpRoster, Body: &RosterReply{Roster: RosterPage{Total: 5, Start: 1, Entries: [][]byte{{1, 2, 3}, make([]byte, 300)}}}},
		{Op: OpRoster, Body: &RosterReply{Roster: RosterPage{Total: 0}}},
		{Op: OpRoster, Body: &RosterReply{Roster: RosterPage{Total: 20, Digest: 0xa1b2c3d4e5f60718}}},
	} {
		b, _ := MarshalReply(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseReply(b)
		if err != nil {
			return
		}
		again, err := MarshalReply(r)
		if err != nil {
			t.Fatalf("parsed %+v does not marshal: %v", r, err)
		}
		if r2, err := ParseReply(again); err != nil || !reflect.DeepEqual(r2, r) {
			t.Fatalf("re-parse %+v: %+v %v", r, r2, err)
		}
	})
}

// FuzzPackets feeds arbitrary datagrams to every outer parser and to the
// relay-side handshake, which must refuse them without panicking.
func FuzzPackets(f *testing.F) {
	relay, _ := GenerateKey()
	client, _ := GenerateKey()
	in, _ := NewInitiation(client, relay.Public(), 1, time.Now())
	f.Add(in.Packet)
	f.Add(MarshalError(ErrorPacket{Reason: ReasonQuota, Index: 1}))
	f.Add(make([]byte, ResponseLen))
	jar := NewCookieJar(relay.Public())
	src := netip.MustParseAddrPort("192.0.2.1:4000")
	if reply, err := jar.Reply(in.Packet, src, time.Now()); err == nil {
		reply[len(reply)-1] ^= 1 // the fuzzer must not find an authentic one by copying
		f.Add(reply)
	}
	f.Add([]byte{TypeTransport, Version, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, err := PacketType(b)
		if err != nil {
			return
		}
		switch typ {
		case TypeInit:
			jar.CheckMAC1(b)
			jar.CheckMAC2(b, src, time.Now())
			if pi, err := ParseInit(b); err == nil {
				_, _ = ConsumeInitiation(relay, pi)
			}
		case TypeCookieReply:
			if r, err := ParseCookieReply(b); err == nil {
				if _, err := in.OpenCookieReply(relay.Public(), r); err == nil {
					t.Fatalf("a fuzzed cookie reply authenticated: % x", b)
				}
			}
		case TypeResponse:
			_, _ = ParseResponse(b)
		case TypeError:
			_, _ = ParseError(b)
		case TypeTransport:
			if tp, err := ParseTransport(b); err == nil {
				s := &Session{}
				s.recv = fuzzCipher
				_, _ = s.Open(tp)
			}
		}
	})
}

func FuzzParseLegacy(f *testing.F) {
	b, _ := MarshalLegacy(LegacyMsg{Server: netip.MustParseAddrPort("10.0.3.2:5201"), Port: 40000})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseLegacy(b)
		if err != nil {
			return
		}
		again, err := MarshalLegacy(m)
		if err != nil || string(again) != string(b) {
			t.Fatalf("legacy %+v re-encodes to % x (%v), want % x", m, again, err, b)
		}
	})
}

var fuzzCipher = func() noise.Cipher {
	k, _ := GenerateKey()
	return suite.Cipher([32]byte(k))
}()
