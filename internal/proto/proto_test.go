package proto

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func mustKey(t testing.TB) Key {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyText(t *testing.T) {
	k := mustKey(t)
	got, err := ParseKey(k.String())
	if err != nil || got != k {
		t.Fatalf("round trip: %v %v", got, err)
	}
	if len(k.String()) != 44 {
		t.Fatalf("base64 key is %d chars", len(k.String()))
	}
	for _, bad := range []string{"", "abc", "!!!!", "AAAA", Key{}.String()} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
	if k.Public() == k || k.Public().IsZero() {
		t.Fatal("public key derivation")
	}
}

// A known X25519 vector (RFC 7748 section 6.1) pins our key derivation.
func TestKeyPublicRFC7748(t *testing.T) {
	priv, _ := ParseKey("dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=")
	want := "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="
	if got := priv.Public().String(); got != want {
		t.Fatalf("public = %s, want %s", got, want)
	}
}

func TestRequestRoundTrip(t *testing.T) {
	cases := []Request{
		NewRequest(1, &PingRequest{}),
		NewRequest(2, &GrantRequest{Server: netip.MustParseAddrPort("198.51.100.7:443"), Port: 40000}),
		NewRequest(3, &GrantRequest{Server: netip.MustParseAddrPort("[2001:db8::1]:80")}),
		NewRequest(4, &RenewRequest{Port: 1234}),
		NewRequest(5, &ReleaseRequest{Port: 65535}),
		NewRequest(6, &TunnelRequest{}),
		NewRequest(7, &QuotaRequest{}),
	}
	for _, r := range cases {
		b, err := MarshalRequest(r)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		got, err := ParseRequest(b)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip %+v: got %+v, %v", r, got, err)
		}
	}
	if _, err := MarshalRequest(NewRequest(0, &GrantRequest{})); err == nil {
		t.Fatal("grant without server accepted")
	}
	// An operation without request content may leave the body nil.
	if b, err := MarshalRequest(Request{Op: OpPing, ID: 9}); err != nil {
		t.Fatalf("ping without a body: %v", err)
	} else if r, err := ParseRequest(b); err != nil || r.Op != OpPing || r.ID != 9 {
		t.Fatalf("ping without a body: %+v %v", r, err)
	}
	if _, err := MarshalRequest(Request{Op: OpGrant}); err == nil {
		t.Fatal("a grant without a body marshalled")
	}
}

func TestRequestRefusals(t *testing.T) {
	good, _ := MarshalRequest(NewRequest(9, &GrantRequest{Server: netip.MustParseAddrPort("198.51.100.7:443")}))
	bad := func(mut func([]byte) []byte) []byte { return mut(append([]byte(nil), good...)) }
	cases := map[string]struct {
		b    []byte
		want Reason
	}{
		"short":       {good[:5], ReasonMalformed},
		"truncated":   {good[:len(good)-1], ReasonMalformed},
		"trailing":    {append(append([]byte(nil), good...), 0), ReasonMalformed},
		"version":     {bad(func(b []byte) []byte { b[0] = Version + 1; return b }), ReasonBadVersion},
		"unknown op":  {bad(func(b []byte) []byte { b[1] = 99; return b }), ReasonUnsupported},
		"family":      {bad(func(b []byte) []byte { b[8] = 5; return b }), ReasonMalformed},
		"server port": {bad(func(b []byte) []byte { b[13], b[14] = 0, 0; return b }), ReasonMalformed},
		"huge":        {make([]byte, MaxMessageLen+1), ReasonMalformed},
	}
	for name, c := range cases {
		_, err := ParseRequest(c.b)
		if got := ReasonOf(err); got != c.want {
			t.Errorf("%s: reason %v (err %v), want %v", name, got, err, c.want)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	pub := mustKey(t).Public()
	cases := []Reply{
		{Op: OpPing, ID: 1, Body: &PingReply{}},
		{Op: OpGrant, ID: 2, Body: &GrantReply{Detour: netip.MustParseAddrPort("203.0.113.1:40001"), Lease: 90 * time.Second}},
		{Op: OpRenew, ID: 3, Body: &RenewReply{Lease: time.Hour}},
		{Op: OpRelease, ID: 4, Body: &ReleaseReply{Bytes: 1 << 40}},
		{Op: OpTunnel, ID: 5, Body: &TunnelReply{Lease: time.Minute, Tunnel: TunnelGrant{
			ClientPrefix: netip.MustParsePrefix("100.64.0.2/24"),
			Endpoint:     netip.MustParseAddrPort("203.0.113.1:51820"),
			PublicKey:    pub,
		}}},
		{Op: OpGrant, ID: 6, Reason: ReasonQuota},
		{Op: OpConvert, ID: 7, Body: &ConvertReply{Lease: time.Minute, Converter: netip.MustParseAddrPort("203.0.113.1:45674"),
			Tickets: [][TicketLen]byte{{1, 2, 3}, {4, 5, 6}}}},
		{Op: OpQuota, ID: 8, Body: &QuotaReply{Used: 3, Quota: 256}},
	}
	for _, r := range cases {
		b, err := MarshalReply(r)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		got, err := ParseReply(b)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip %+v: got %+v, %v", r, got, err)
		}
	}
}

// A convert reply with MaxTickets tickets is larger than MaxMessageLen and
// allowed (up to MaxReplyLen, IPv6 converter); one more ticket is refused
// both ways, and so is a request for more than MaxTickets.
func TestConvertBatch(t *testing.T) {
	cr := &ConvertReply{Lease: time.Minute, Converter: netip.MustParseAddrPort("[2001:db8::1]:45674"),
		Tickets: make([][TicketLen]byte, MaxTickets)}
	cr.Tickets[MaxTickets-1][0] = 7
	r := Reply{Op: OpConvert, ID: 9, Body: cr}
	b, err := MarshalReply(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) <= MaxMessageLen || len(b) > MaxReplyLen {
		t.Fatalf("reply of %d bytes, want %d..%d", len(b), MaxMessageLen+1, MaxReplyLen)
	}
	got, err := ParseReply(b)
	gc, _ := got.Body.(*ConvertReply)
	if err != nil || gc == nil || len(gc.Tickets) != MaxTickets || gc.Tickets[MaxTickets-1][0] != 7 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	cr.Tickets = append(cr.Tickets, [TicketLen]byte{})
	if _, err := MarshalReply(r); err == nil {
		t.Error("a reply with MaxTickets+1 tickets marshalled")
	}
	over := append(append([]byte{}, b...), make([]byte, TicketLen)...)
	over[msgHeaderLen+17+6]++ // the count
	if _, err := ParseReply(over); err == nil {
		t.Error("a reply with MaxTickets+1 tickets parsed")
	}
	rb, err := MarshalRequest(NewRequest(1, &ConvertRequest{Count: MaxTickets}))
	if err != nil {
		t.Fatal(err)
	}
	if req, err := ParseRequest(rb); err != nil || req.Body.(*ConvertRequest).Count != MaxTickets {
		t.Fatalf("request for %d: %+v %v", MaxTickets, req, err)
	}
	rb[len(rb)-1] = MaxTickets + 1
	if _, err := ParseRequest(rb); ReasonOf(err) != ReasonMalformed {
		t.Errorf("request for %d tickets: %v, want malformed", MaxTickets+1, err)
	}
	if _, err := MarshalRequest(NewRequest(0, &ConvertRequest{Count: MaxTickets + 1})); err == nil {
		t.Error("a request for MaxTickets+1 marshalled")
	}
}

func TestLegacyRoundTrip(t *testing.T) {
	m := LegacyMsg{Server: netip.MustParseAddrPort("10.0.3.2:5201"), Port: 40000}
	b, err := MarshalLegacy(m)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{1, 0, 0, 0, 10, 0, 3, 2, 0x14, 0x51, 0x9c, 0x40}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding % x, want % x", b, want)
	}
	got, err := ParseLegacy(b)
	if err != nil || got != m {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range [][]byte{b[:11], {2, 0, 0, 0, 10, 0, 3, 2, 0, 1, 0, 1}, {1, 7, 0, 0, 10, 0, 3, 2, 0, 1, 0, 1}, {1, 0, 0, 1, 10, 0, 3, 2, 0, 1, 0, 1}, {1, 0, 0, 0, 10, 0, 3, 2, 0, 0, 0, 1}} {
		if _, err := ParseLegacy(bad); err == nil {
			t.Errorf("accepted % x", bad)
		}
	}
	if _, err := MarshalLegacy(LegacyMsg{Server: netip.MustParseAddrPort("[2001:db8::1]:1")}); err == nil {
		t.Fatal("IPv6 accepted by v1")
	}
}

// handshake runs a full IK exchange and returns both sessions.
func handshake(t *testing.T, client, relay Key) (*Session, *Session) {
	t.Helper()
	in, err := NewInitiation(client, relay.Public(), 7, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Packet) != InitLen {
		t.Fatalf("init %d bytes", len(in.Packet))
	}
	pi, err := ParseInit(in.Packet)
	if err != nil {
		t.Fatal(err)
	}
	acc, err := ConsumeInitiation(relay, pi)
	if err != nil {
		t.Fatal(err)
	}
	if acc.Peer != client.Public() {
		t.Fatal("relay sees the wrong peer key")
	}
	resp, rs, err := acc.Respond(99)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp) > len(in.Packet) {
		t.Fatalf("response (%d) larger than initiation (%d): amplification", len(resp), len(in.Packet))
	}
	pr, err := ParseResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := in.Finish(pr)
	if err != nil {
		t.Fatal(err)
	}
	return cs, rs
}

func TestHandshakeAndTransport(t *testing.T) {
	client, relay := mustKey(t), mustKey(t)
	cs, rs := handshake(t, client, relay)
	if cs.Remote != 99 || rs.Remote != 7 {
		t.Fatalf("indices: client remote %d relay remote %d", cs.Remote, rs.Remote)
	}
	pkt, err := cs.Seal([]byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := ParseTransport(pkt)
	if err != nil {
		t.Fatal(err)
	}
	if tp.Receiver != 99 {
		t.Fatalf("receiver %d", tp.Receiver)
	}
	msg, err := rs.Open(tp)
	if err != nil || string(msg) != "hello" {
		t.Fatalf("open: %q %v", msg, err)
	}
	if _, err := rs.Open(tp); ReasonOf(err) != ReasonReplay {
		t.Fatalf("replayed transport: %v", err)
	}
	// A flipped bit fails authentication and does not burn the counter.
	pkt2, _ := cs.Seal([]byte("again"))
	forged := append([]byte(nil), pkt2...)
	forged[len(forged)-1] ^= 1
	tf, _ := ParseTransport(forged)
	if _, err := rs.Open(tf); ReasonOf(err) != ReasonUnauthorized {
		t.Fatalf("forged: %v", err)
	}
	tp2, _ := ParseTransport(pkt2)
	if msg, err := rs.Open(tp2); err != nil || string(msg) != "again" {
		t.Fatalf("after forgery: %q %v", msg, err)
	}
	// Replies flow the other way with the other key.
	back, _ := rs.Seal([]byte("reply"))
	tb, _ := ParseTransport(back)
	if msg, err := cs.Open(tb); err != nil || string(msg) != "reply" {
		t.Fatalf("reply: %q %v", msg, err)
	}
}

func TestHandshakeWrongRelayKey(t *testing.T) {
	client, relay, other := mustKey(t), mustKey(t), mustKey(t)
	in, _ := NewInitiation(client, other.Public(), 1, time.Now())
	pi, _ := ParseInit(in.Packet)
	if _, err := ConsumeInitiation(relay, pi); ReasonOf(err) != ReasonUnauthorized {
		t.Fatalf("initiation for another relay: %v", err)
	}
}

func TestTimestampOrder(t *testing.T) {
	t0 := time.Unix(1700000000, 5)
	if !TAI64N(t0.Add(time.Nanosecond)).After(TAI64N(t0)) || TAI64N(t0).After(TAI64N(t0)) {
		t.Fatal("TAI64N order")
	}
}

func TestReplayWindow(t *testing.T) {
	var w ReplayWindow
	for _, n := range []uint64{0, 1, 5, 3, 2000, 1999, 1500} {
		if !w.Accept(n) {
			t.Fatalf("fresh %d refused", n)
		}
	}
	for _, n := range []uint64{0, 5, 2000, 1999, 1500, 900} {
		if w.Accept(n) {
			t.Fatalf("stale or repeated %d accepted", n)
		}
	}
	// Jumping far ahead clears the whole window.
	if !w.Accept(100000) || !w.Accept(99999) || w.Accept(100000) {
		t.Fatal("window after a jump")
	}
	// Sequential use over several wraps: every counter once, none twice.
	var s ReplayWindow
	for n := uint64(0); n < 5000; n++ {
		if !s.Accept(n) {
			t.Fatalf("sequential %d refused", n)
		}
		if n >= 10 && s.Accept(n-10) {
			t.Fatalf("%d accepted twice", n-10)
		}
	}
	if s.Accept(RejectAfterMessages) {
		t.Fatal("counter past the limit accepted")
	}
}

func TestErrorPacket(t *testing.T) {
	e := ErrorPacket{Reason: ReasonQuota, Index: 42, Counter: 7}
	b := MarshalError(e)
	got, err := ParseError(b)
	if err != nil || got != e {
		t.Fatalf("%+v %v", got, err)
	}
	if len(b) >= InitLen || len(b) >= transportHdrLen+tagLen+msgHeaderLen {
		t.Fatal("error packet not smaller than any request")
	}
}

func TestPacketType(t *testing.T) {
	if _, err := PacketType([]byte{4, 9, 0, 0, 0, 0, 0, 0}); ReasonOf(err) != ReasonBadVersion {
		t.Fatalf("bad version: %v", err)
	}
	if _, err := PacketType([]byte{9, Version, 0, 0, 0, 0, 0, 0}); !errors.As(err, new(*Error)) {
		t.Fatalf("bad type: %v", err)
	}
}

func TestCookies(t *testing.T) {
	relay, _ := GenerateKey()
	other, _ := GenerateKey()
	client, _ := GenerateKey()
	in, err := NewInitiation(client, relay.Public(), 9, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	jar := NewCookieJar(relay.Public())
	if !jar.CheckMAC1(in.Packet) {
		t.Fatal("mac1 of a genuine initiation refused")
	}
	if NewCookieJar(other.Public()).CheckMAC1(in.Packet) {
		t.Fatal("mac1 accepted by a relay with another key")
	}
	bad := append([]byte(nil), in.Packet...)
	bad[40] ^= 1
	if jar.CheckMAC1(bad) {
		t.Fatal("mac1 accepted after a change to the initiation")
	}
	now := time.Now()
	src := netip.MustParseAddrPort("192.0.2.1:4000")
	if jar.CheckMAC2(in.Packet, src, now) {
		t.Fatal("an initiation without a cookie passed mac2")
	}
	reply, err := jar.Reply(in.Packet, src, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(reply) != CookieReplyLen || len(reply) >= InitLen {
		t.Fatalf("cookie reply of %d bytes, want %d (< %d)", len(reply), CookieReplyLen, InitLen)
	}
	if typ, err := PacketType(reply); err != nil || typ != TypeCookieReply {
		t.Fatalf("cookie reply type %d %v", typ, err)
	}
	r, err := ParseCookieReply(reply)
	if err != nil {
		t.Fatal(err)
	}
	// Only the initiation the reply answers opens it.
	in2, _ := NewInitiation(client, relay.Public(), 9, time.Now().Add(time.Second))
	if _, err := in2.OpenCookieReply(relay.Public(), r); err == nil {
		t.Fatal("a cookie reply opened with another initiation's mac1")
	}
	c, err := in.OpenCookieReply(relay.Public(), r)
	if err != nil {
		t.Fatal(err)
	}
	pkt := in2.WithCookie(c)
	if !jar.CheckMAC1(pkt) || !jar.CheckMAC2(pkt, src, now) {
		t.Fatal("an initiation with the cookie failed mac1 or mac2")
	}
	for _, wrong := range []string{"192.0.2.1:4001", "192.0.2.2:4000"} {
		if jar.CheckMAC2(pkt, netip.MustParseAddrPort(wrong), now) {
			t.Fatalf("the cookie of %v passed from %s", src, wrong)
		}
	}
	if pi, err := ParseInit(pkt); err != nil {
		t.Fatal(err)
	} else if _, err := ConsumeInitiation(relay, pi); err != nil {
		t.Fatalf("the Noise part no longer authenticates with mac2 set: %v", err)
	}
	// After one rotation the previous secret still counts; after two not.
	if !jar.CheckMAC2(pkt, src, now.Add(CookieLifetime)) {
		t.Fatal("cookie refused right after one rotation")
	}
	if jar.CheckMAC2(pkt, src, now.Add(2*CookieLifetime)) {
		t.Fatal("cookie accepted after two rotations")
	}
	// A jar idle for longer than a lifetime forgets its old secret: a
	// cookie from an earlier load episode proves nothing now.
	jar2 := NewCookieJar(relay.Public())
	reply2, _ := jar2.Reply(in.Packet, src, now)
	r2, _ := ParseCookieReply(reply2)
	c2, err := in.OpenCookieReply(relay.Public(), r2)
	if err != nil {
		t.Fatal(err)
	}
	if jar2.CheckMAC2(in2.WithCookie(c2), src, now.Add(3*CookieLifetime)) {
		t.Fatal("a cookie from an episode long ago accepted after an idle jar rotated once")
	}
}

func TestRosterMessages(t *testing.T) {
	b, err := MarshalRequest(NewRequest(7, &RosterRequest{Start: 300}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRequest(b)
	if err != nil || r.Body.(*RosterRequest).Start != 300 || r.Op != OpRoster {
		t.Fatalf("request round trip: %+v %v", r, err)
	}
	if _, err := ParseRequest(b[:len(b)-1]); ReasonOf(err) != ReasonMalformed {
		t.Errorf("short roster request: %v", err)
	}
	page := RosterPage{Total: 10, Start: 8, Entries: [][]byte{make([]byte, MaxRosterEntry), make([]byte, 400)}}
	page.Entries[0][0] = 1
	rb, err := MarshalReply(Reply{Op: OpRoster, ID: 7, Body: &RosterReply{Roster: page}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rb) <= MaxMessageLen || len(rb) > MaxReplyLen {
		t.Fatalf("page of %d bytes", len(rb))
	}
	rep, err := ParseReply(rb)
	if err != nil || roster(rep).Total != 10 || len(roster(rep).Entries) != 2 || roster(rep).Entries[0][0] != 1 {
		t.Fatalf("reply round trip: %+v %v", rep, err)
	}
	bad := map[string][]byte{
		"trailing":      append(append([]byte{}, rb...), 0),
		"truncated":     rb[:len(rb)-1],
		"beyond total":  func() []byte { x := append([]byte{}, rb...); x[msgHeaderLen+1] = 9; return x }(),
		"zero length":   append(append([]byte{}, rb[:msgHeaderLen+4]...), 1, 0, 0),
		"too long":      append(append([]byte{}, rb...), make([]byte, MaxReplyLen)...),
		"large grant":   func() []byte { x := append([]byte{}, rb...); x[1] = byte(OpGrant); return x }(),
		"too many":      append(append([]byte{}, rb[:msgHeaderLen]...), 0, 20, 0, 0, MaxRosterPage+1),
		"entry too big": append(append([]byte{}, rb[:msgHeaderLen]...), 0, 1, 0, 0, 1, 2, 1),
	}
	for name, b := range bad {
		if _, err := ParseReply(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := MarshalReply(Reply{Op: OpRoster, Body: &RosterReply{Roster: RosterPage{Total: 3, Entries: [][]byte{make([]byte, 512), make([]byte, 512), make([]byte, 512)}}}}); err == nil {
		t.Error("a page beyond MaxReplyLen marshalled")
	}

	// The digest: a request that holds one (or asks for one with 0), a
	// reply that carries one; an old-format request stays 2 bytes.
	for _, req := range []*RosterRequest{{Start: 3, Have: 0xfeedface12345678}, {HasDigest: true}} {
		b, err := MarshalRequest(NewRequest(0, req))
		if err != nil || len(b) != msgHeaderLen+10 {
			t.Fatalf("digest request %+v: %d bytes, %v", req, len(b), err)
		}
		pr, err := ParseRequest(b)
		if err != nil {
			t.Fatal(err)
		}
		if r := pr.Body.(*RosterRequest); r.Have != req.Have || !r.HasDigest || r.Start != req.Start {
			t.Fatalf("digest request round trip: %+v", r)
		}
		if _, err := ParseRequest(b[:len(b)-1]); ReasonOf(err) != ReasonMalformed {
			t.Errorf("truncated digest request: %v", err)
		}
	}
	page.Digest = 0x0102030405060708
	rb, err = MarshalReply(Reply{Op: OpRoster, Body: &RosterReply{Roster: page}})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := ParseReply(rb); err != nil || roster(rep).Digest != page.Digest || len(roster(rep).Entries) != 2 {
		t.Fatalf("digest reply round trip: %+v %v", rep, err)
	}
	unchanged, err := MarshalReply(Reply{Op: OpRoster, Body: &RosterReply{Roster: RosterPage{Total: 40, Digest: 9}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := ParseReply(unchanged); err != nil || roster(rep).Digest != 9 || roster(rep).Total != 40 || len(roster(rep).Entries) != 0 || len(unchanged) != msgHeaderLen+5+8 {
		t.Fatalf("unchanged page: %d bytes, %+v %v", len(unchanged), rep, err)
	}
	for name, b := range map[string][]byte{
		"digest 0":         append(append([]byte{}, unchanged[:len(unchanged)-8]...), 0, 0, 0, 0, 0, 0, 0, 0),
		"4 trailing bytes": append(append([]byte{}, unchanged[:len(unchanged)-8]...), 1, 2, 3, 4),
	} {
		if _, err := ParseReply(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// roster is a roster reply's page (zero if it is none).
func roster(r Reply) RosterPage {
	if rr, ok := r.Body.(*RosterReply); ok {
		return rr.Roster
	}
	return RosterPage{}
}
