package pathcheck

import (
	"net/netip"
	"testing"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/mpdetour/mpdetour/internal/mptcpwire"
)

func testProbe(t testing.TB, kind string) *mptcpwire.Segment {
	return probeBetween(t, kind, "192.0.2.2", "198.51.100.10:80")
}

func testProbe6(t testing.TB, kind string) *mptcpwire.Segment {
	return probeBetween(t, kind, "2001:db8:1::2", "[2001:db8:3::10]:80")
}

func probeBetween(t testing.TB, kind, src, dst string) *mptcpwire.Segment {
	s := &sockets{src: netip.MustParseAddr(src)}
	s.v6 = s.src.Is6()
	seg, err := s.build(Path{Dst: netip.MustParseAddrPort(dst)}, kind, 3, 50001, 77)
	if err != nil {
		t.Fatal(err)
	}
	return seg
}

func icmpBytes(t testing.TB, typ icmp.Type, quote []byte) []byte {
	var body icmp.MessageBody
	switch typ {
	case ipv4.ICMPTypeTimeExceeded, ipv6.ICMPTypeTimeExceeded:
		body = &icmp.TimeExceeded{Data: quote}
	default:
		body = &icmp.DstUnreach{Data: quote}
	}
	b, err := (&icmp.Message{Type: typ, Body: body}).Marshal(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseICMPAndCompare(t *testing.T) {
	sent := testProbe(t, ProbeCapable)
	b, _ := sent.Marshal()
	a, ok := parseICMP(icmpBytes(t, ipv4.ICMPTypeTimeExceeded, b), false)
	if !ok || a.icmp != "time-exceeded" || a.quote.Seq != 77 {
		t.Fatalf("parse: %+v %v", a, ok)
	}
	if st, ch := compare(sent, a.quote, a.trunc); st != Intact || len(ch) != 0 {
		t.Fatalf("intact quote: %s %v", st, ch)
	}
	// Stripped: option bytes overwritten with NOPs.
	stripped := *sent
	stripped.Options = append([]mptcpwire.Option(nil), sent.Options[:4]...)
	stripped.Options = append(stripped.Options, mptcpwire.Option{Kind: 1}, mptcpwire.Option{Kind: 1}, mptcpwire.Option{Kind: 1}, mptcpwire.Option{Kind: 1})
	sb, _ := stripped.Marshal()
	a, _ = parseICMP(icmpBytes(t, ipv4.ICMPTypeTimeExceeded, sb), false)
	if st, ch := compare(sent, a.quote, a.trunc); st != Removed || len(ch) != 1 || ch[0].Field != "option MP_CAPABLE" {
		t.Fatalf("stripped quote: %s %v", st, ch)
	}
	// Modified (flags byte changed) and MSS clamped.
	mod := *sent
	mod.Options = append([]mptcpwire.Option(nil), sent.Options...)
	mod.Options[0] = mptcpwire.Option{Kind: mptcpwire.OptMSS, Data: []byte{0x05, 0x00}}
	mod.Options[4] = mptcpwire.Option{Kind: mptcpwire.OptMPTCP, Data: []byte{0x01, 0x00}}
	mb, _ := mod.Marshal()
	a, _ = parseICMP(icmpBytes(t, ipv4.ICMPTypeTimeExceeded, mb), false)
	if st, ch := compare(sent, a.quote, a.trunc); st != Modified || len(ch) != 2 {
		t.Fatalf("modified quote: %s %v", st, ch)
	}
	// A quote of 8 TCP bytes (RFC 792 minimum) tells nothing about options.
	a, ok = parseICMP(icmpBytes(t, ipv4.ICMPTypeDestinationUnreachable, b[:28]), false)
	if !ok || a.icmp != "unreachable code 0" {
		t.Fatalf("short quote: %+v %v", a, ok)
	}
	if st, _ := compare(sent, a.quote, a.trunc); st != Truncated {
		t.Fatalf("short quote: %s, want %s", st, Truncated)
	}
	// Echo replies and garbage are ignored.
	echo, _ := (&icmp.Message{Type: ipv4.ICMPTypeEchoReply, Body: &icmp.Echo{ID: 1, Seq: 1}}).Marshal(nil)
	for _, x := range [][]byte{nil, {11}, echo, icmpBytes(t, ipv4.ICMPTypeTimeExceeded, []byte{0x45, 0})} {
		if _, ok := parseICMP(x, false); ok {
			t.Errorf("%x parsed as an answer", x)
		}
	}
}

func TestVerdict(t *testing.T) {
	capable := func(f *Final, lostAt int) ProbeResult {
		return ProbeResult{Probe: ProbeCapable, Final: f, LostAfter: 1, LostAt: lostAt, LostHow: Removed}
	}
	sa := func(mp string) *Final { return &Final{Flags: "SA", MPTCP: mp} }
	for _, c := range []struct {
		prs  []ProbeResult
		want string
	}{
		{[]ProbeResult{capable(sa("MP_CAPABLE"), 0)}, OK},
		{[]ProbeResult{capable(sa(""), 2)}, Stripped},
		{[]ProbeResult{capable(sa(""), 0)}, NoMPTCP},
		{[]ProbeResult{capable(&Final{Flags: "RA"}, 0)}, Closed},
		{[]ProbeResult{capable(nil, 0)}, Unreachable},
		{[]ProbeResult{capable(nil, 3)}, Stripped},
		// MP_CAPABLE passes but MP_JOIN is stripped: subflows would fail.
		{[]ProbeResult{capable(sa("MP_CAPABLE"), 0), {Probe: ProbeJoin, LostAfter: 1, LostAt: 2, LostHow: Removed}}, Stripped},
	} {
		if v, d := verdict(c.prs); v != c.want {
			t.Errorf("%+v: %s (%s), want %s", c.prs, v, d, c.want)
		}
	}
	// Cross-check: plain TCP on a NAT detour while the default path got
	// MP_CAPABLE from the server.
	rep := &Report{Paths: []PathResult{
		{Path: Path{Kind: Default}, Verdict: OK, Probes: []ProbeResult{{Final: &Final{From: netip.MustParseAddrPort("198.51.100.10:80")}}}},
		{Path: Path{Kind: NAT}, Verdict: NoMPTCP, Probes: []ProbeResult{{Final: &Final{From: netip.MustParseAddrPort("198.18.2.2:4000")}}}},
	}}
	crossCheck(rep)
	if rep.Paths[1].Verdict != Stripped {
		t.Errorf("cross-check: %s", rep.Paths[1].Verdict)
	}
}

// Bad paths are refused before any socket opens, among them IPv4-mapped,
// zoned or plain link-local IPv6 destinations and a source of the other
// family.
func TestRunRefusesBadPaths(t *testing.T) {
	for _, o := range []Options{
		{Paths: []Path{{Dst: netip.MustParseAddrPort("[fe80::1%eth0]:80")}}},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("[fe80::1]:80")}}},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("[2001:db8::1]:80"), Src: netip.MustParseAddr("192.0.2.1")}}},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("[2001:db8::1]:80"), Src: netip.MustParseAddr("::ffff:192.0.2.1")}}},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("192.0.2.1:80"), Src: netip.MustParseAddr("2001:db8::1")}}},
		{},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("[::ffff:10.0.0.1]:80")}}},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("10.0.0.1:0")}}},
		{Paths: []Path{{Dst: netip.MustParseAddrPort("[2001:db8::1]:0")}}},
		{MaxTTL: 65, Paths: []Path{{Dst: netip.MustParseAddrPort("10.0.0.1:80")}}},
	} {
		if _, err := Run(t.Context(), o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// FuzzParseICMP: ICMP and ICMPv6 errors from any router on the path are
// untrusted; each input is parsed as both (one target: the fuzz lane's
// time is per target).
func FuzzParseICMP(f *testing.F) {
	sent := testProbe(f, ProbeCapable)
	b, _ := sent.Marshal()
	f.Add(icmpBytes(f, ipv4.ICMPTypeTimeExceeded, b))
	f.Add(icmpBytes(f, ipv4.ICMPTypeDestinationUnreachable, b[:28]))
	j, _ := testProbe(f, ProbeJoin).Marshal()
	f.Add(icmpBytes(f, ipv4.ICMPTypeTimeExceeded, j[:len(j)-5]))
	sent6 := testProbe6(f, ProbeCapable)
	b6, _ := sent6.Marshal()
	f.Add(icmpBytes(f, ipv6.ICMPTypeTimeExceeded, b6))
	f.Add(icmpBytes(f, ipv6.ICMPTypeDestinationUnreachable, b6[:48]))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v6 := range []bool{false, true} {
			a, ok := parseICMP(b, v6)
			if !ok {
				continue
			}
			probe := map[bool]*mptcpwire.Segment{false: sent, true: sent6}[v6]
			st, _ := compare(probe, a.quote, a.trunc)
			switch st {
			case Intact, Removed, Modified, Truncated:
			default:
				t.Fatalf("state %q", st)
			}
		}
	})
}

// ICMPv6 errors quoting an IPv6 probe: intact, stripped, with extension
// headers in front of the quoted TCP header, cut short; ICMPv4 bytes and
// IPv4 quotes are not IPv6 answers.
func TestParseICMPv6AndCompare(t *testing.T) {
	sent := testProbe6(t, ProbeCapable)
	b, err := sent.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	a, ok := parseICMP(icmpBytes(t, ipv6.ICMPTypeTimeExceeded, b), true)
	if !ok || a.icmp != "time-exceeded" || a.quote.Seq != 77 || a.quote.Src != sent.Src {
		t.Fatalf("parse: %+v %v", a, ok)
	}
	if st, ch := compare(sent, a.quote, a.trunc); st != Intact || len(ch) != 0 {
		t.Fatalf("intact quote: %s %v", st, ch)
	}
	stripped := *sent
	stripped.Options = append(append([]mptcpwire.Option(nil), sent.Options[:4]...), mptcpwire.Option{Kind: 1}, mptcpwire.Option{Kind: 1}, mptcpwire.Option{Kind: 1}, mptcpwire.Option{Kind: 1})
	sb, _ := stripped.Marshal()
	a, _ = parseICMP(icmpBytes(t, ipv6.ICMPTypeTimeExceeded, sb), true)
	if st, ch := compare(sent, a.quote, a.trunc); st != Removed || len(ch) != 1 {
		t.Fatalf("stripped quote: %s %v", st, ch)
	}
	// A router that added a hop-by-hop header (8 bytes) before TCP.
	hbh := append(append([]byte(nil), b[:40]...), 6, 0, 1, 4, 0, 0, 0, 0)
	hbh = append(hbh, b[40:]...)
	hbh[6] = 0
	hbh[5] += 8
	a, ok = parseICMP(icmpBytes(t, ipv6.ICMPTypeTimeExceeded, hbh), true)
	if st, _ := compare(sent, a.quote, a.trunc); !ok || st != Intact {
		t.Fatalf("quote with a hop-by-hop header: %v %s", ok, st)
	}
	a, ok = parseICMP(icmpBytes(t, ipv6.ICMPTypeDestinationUnreachable, b[:48]), true)
	if st, _ := compare(sent, a.quote, a.trunc); !ok || a.icmp != "unreachable code 0" || st != Truncated {
		t.Fatalf("short quote: %+v %v %s", a, ok, st)
	}
	b4, _ := testProbe(t, ProbeCapable).Marshal()
	for name, x := range map[string][]byte{
		"ICMPv4 message":                icmpBytes(t, ipv4.ICMPTypeTimeExceeded, b4),
		"ICMPv6 quoting IPv4":           icmpBytes(t, ipv6.ICMPTypeTimeExceeded, b4),
		"quote of a non-first fragment": icmpBytes(t, ipv6.ICMPTypeTimeExceeded, append(append(append([]byte(nil), b[:40]...), 6, 0, 0, 8, 0, 0, 0, 1), b[40:]...)),
	} {
		if name == "quote of a non-first fragment" {
			x[8+6] = 44 // the quoted IPv6 header's next header: fragment
		}
		if _, ok := parseICMP(x, true); ok {
			t.Errorf("%s parsed as an IPv6 answer", name)
		}
	}
}
