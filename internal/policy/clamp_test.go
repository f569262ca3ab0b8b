package policy

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

func TestClampSegments(t *testing.T) {
	for _, c := range []struct {
		rate   float64
		minRTT time.Duration
		mss    uint32
		want   uint32
		ok     bool
	}{
		// 8 Mbit/s over 61 ms with a 1368-byte MSS: BDP 44.6 segments, x 1.25.
		{1e6, 61 * time.Millisecond, 1368, 56, true},
		{10e3, 61 * time.Millisecond, 1368, ClampFloor, true}, // below the initial window
		{0, 61 * time.Millisecond, 1368, 0, false},
		{1e6, 0, 1368, 0, false},
		{1e6, time.Millisecond, 0, 0, false},
		{1e15, time.Hour, 1, 1<<31 - 1, true}, // absurd inputs stay in range
	} {
		got, ok := ClampSegments(c.rate, c.minRTT, c.mss)
		if got != c.want || ok != c.ok {
			t.Errorf("ClampSegments(%g, %s, %d) = %d, %v; want %d, %v", c.rate, c.minRTT, c.mss, got, ok, c.want, c.ok)
		}
	}
}

// TestClampsDecide: only the tunnel detour's subflow is clamped, from its
// own measurements; the clamp follows its largest delivery rate (not
// application-limited samples) with an eighth of hysteresis.
func TestClampsDecide(t *testing.T) {
	c := NewClamps([]detour.Source{&list{ds: []detour.Detour{d1, d3}}}, ClampCwnd)
	tun := netip.AddrPortFrom(d3.Local, 41000)
	meas := func(local, remote netip.AddrPort, rate uint64, appLimited bool) Measurement {
		return Measurement{Token: 1, Local: local, Remote: remote, DeliveryRate: rate, AppLimited: appLimited,
			MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}
	}
	srtt := 70 * time.Millisecond // within 1.25 x 61 ms: no queue yet
	round := func(rate uint64, appLimited bool) []Clamp {
		tm := meas(tun, server, rate, appLimited)
		tm.RTT = srtt
		return c.Decide([]Measurement{
			meas(client, server, 2e6, false),    // default path
			meas(client, d1.Remote, 2e6, false), // NAT detour
			tm,                                  // tunnel detour
		})
	}
	if got := round(0, false); len(got) != 0 {
		t.Fatalf("no delivery rate yet: clamps %v", got)
	}
	if ps := c.Pairs(); len(ps) != 1 || ps[0].Note == "" || ps[0].Path != "tunnel:r3" {
		t.Fatalf("pairs before a rate: %+v, want the tunnel pair waiting", ps)
	}
	if got := round(1e6, false); len(got) != 0 {
		t.Fatalf("no queue yet (smoothed RTT 70 ms, min 61 ms): clamps %v", got)
	}
	srtt = 130 * time.Millisecond
	got := round(1e6, false)
	if len(got) != 1 || got[0].Local != d3.Local || got[0].Remote != server.Addr() || got[0].Segments != 56 {
		t.Fatalf("first clamp %+v, want tunnel pair at 56 segments", got)
	}
	if got := round(1e6, false); len(got) != 0 {
		t.Errorf("same measurements: clamps %v, want none", got)
	}
	if got := round(1.05e6, false); len(got) != 0 {
		t.Errorf("rate up 5%%: clamps %v, want none (within an eighth)", got)
	}
	if got := round(3e6, true); len(got) != 0 {
		t.Errorf("application-limited sample: clamps %v, want none", got)
	}
	srtt = 65 * time.Millisecond // a clamped pair follows its rate whatever the RTT
	if got := round(1.5e6, false); len(got) != 1 || got[0].Segments != 84 {
		t.Errorf("rate up 50%%: clamps %+v, want 84 segments", got)
	}
	if ps := c.Pairs(); len(ps) != 1 || ps[0].Segments != 84 || ps[0].MaxRate != 1.5e6 || ps[0].Note != "" {
		t.Errorf("pairs: %+v", ps)
	}
}

// An IPv6 tunnel pair is clamped like an IPv4 one (the program keys both
// families).
func TestClampsIPv6Pair(t *testing.T) {
	srv6 := netip.MustParseAddrPort("[fd00:2::2]:5201")
	d := detour.Detour{Kind: detour.Tunnel, Relay: "r6", Local: netip.MustParseAddr("fd00:9::2"), Remote: srv6}
	c := NewClamps([]detour.Source{&list{ds: []detour.Detour{d}}}, ClampCwnd)
	got := c.Decide([]Measurement{{Local: netip.AddrPortFrom(d.Local, 1), Remote: srv6, DeliveryRate: 1e6, MinRTT: time.Millisecond, RTT: 10 * time.Millisecond, SndMSS: 1300}})
	if len(got) != 1 || got[0].Local != d.Local || got[0].Remote != srv6.Addr() || got[0].Segments != ClampFloor {
		t.Fatalf("IPv6 pair: clamps %+v, want one at %d segments", got, ClampFloor)
	}
}

// An absurd rate gives the largest clamp; deciding it again changes
// nothing (the eighth's comparison does not wrap around in uint32).
func TestClampsHugeRateStable(t *testing.T) {
	c := NewClamps([]detour.Source{&list{ds: []detour.Detour{d3}}}, ClampCwnd)
	m := Measurement{Token: 1, Local: netip.AddrPortFrom(d3.Local, 41000), Remote: server, DeliveryRate: 1 << 62,
		MinRTT: 10 * time.Second, RTT: 20 * time.Second, SndMSS: 536}
	if got := c.Decide([]Measurement{m}); len(got) != 1 || got[0].Segments != math.MaxInt32 {
		t.Fatalf("first clamp %+v, want one at %d segments", got, math.MaxInt32)
	}
	if got := c.Decide([]Measurement{m}); len(got) != 0 {
		t.Fatalf("same measurement: clamps %+v, want none", got)
	}
}

func TestClampPacingRate(t *testing.T) {
	for _, c := range []struct {
		rate   float64
		minRTT time.Duration
		mss    uint32
		want   uint64
		ok     bool
	}{
		{1e6, 61 * time.Millisecond, 1368, 1250000, true}, // 1.25 x 8 Mbit/s
		{10e3, 61 * time.Millisecond, 1368, 224263, true}, // floor: 10 x 1368 bytes per 61 ms
		{0, 61 * time.Millisecond, 1368, 0, false},
		{1e6, 0, 1368, 0, false},
		{1e6, time.Millisecond, 0, 0, false},
		{1e15, time.Hour, 1, MaxPacingRate, true}, // the program's 32-bit limit
	} {
		got, ok := ClampPacingRate(c.rate, c.minRTT, c.mss)
		if got != c.want || ok != c.ok {
			t.Errorf("ClampPacingRate(%g, %s, %d) = %d, %v; want %d, %v", c.rate, c.minRTT, c.mss, got, ok, c.want, c.ok)
		}
	}
}

func TestParseClampMode(t *testing.T) {
	for in, want := range map[string]ClampMode{"": ClampCwnd, "cwnd": ClampCwnd, "pacing": ClampPacing, "both": ClampBoth} {
		if got, err := ParseClampMode(in); err != nil || got != want {
			t.Errorf("ParseClampMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"Pacing", "rate", "cwnd,pacing"} {
		if _, err := ParseClampMode(in); err == nil || !strings.Contains(err.Error(), "cwnd, pacing or both") {
			t.Errorf("ParseClampMode(%q): %v, want an error listing the modes", in, err)
		}
	}
}

// The pacing and both modes decide under the cwnd mode's trigger, from
// the same measurements: pacing a rate alone, both a rate and a clamp;
// the rate follows the largest delivery rate with an eighth of
// hysteresis.
func TestClampsPacingModes(t *testing.T) {
	tun := netip.AddrPortFrom(d3.Local, 41000)
	for _, tc := range []struct {
		mode ClampMode
		segs uint32
	}{{ClampPacing, 0}, {ClampBoth, 56}} {
		c := NewClamps([]detour.Source{&list{ds: []detour.Detour{d1, d3}}}, tc.mode)
		m := Measurement{Token: 1, Local: tun, Remote: server, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 70 * time.Millisecond, SndMSS: 1368}
		if got := c.Decide([]Measurement{m}); len(got) != 0 {
			t.Fatalf("%s: no queue yet: clamps %+v", tc.mode, got)
		}
		m.RTT = 130 * time.Millisecond
		got := c.Decide([]Measurement{m, {Local: client, Remote: server, DeliveryRate: 2e6, MinRTT: 30 * time.Millisecond, RTT: 90 * time.Millisecond, SndMSS: 1448}})
		if len(got) != 1 || got[0].Local != d3.Local || got[0].PacingRate != 1250000 || got[0].Segments != tc.segs {
			t.Fatalf("%s: clamps %+v, want the tunnel pair at 1250000 bytes/s and %d segments", tc.mode, got, tc.segs)
		}
		m.DeliveryRate = 1.1e6
		if got := c.Decide([]Measurement{m}); len(got) != 0 {
			t.Errorf("%s: rate up 10%%: clamps %+v, want none", tc.mode, got)
		}
		m.DeliveryRate = 2e6
		if got := c.Decide([]Measurement{m}); len(got) != 1 || got[0].PacingRate != 2500000 {
			t.Errorf("%s: rate doubled: clamps %+v, want 2500000 bytes/s", tc.mode, got)
		}
		want, _ := ClampSegments(2e6, 61*time.Millisecond, 1368)
		if tc.segs == 0 {
			want = 0
		}
		if ps := c.Pairs(); len(ps) != 1 || ps[0].PacingRate != 2500000 || ps[0].Segments != want {
			t.Errorf("%s: pairs %+v", tc.mode, ps)
		}
	}
}

// A fallback from pacing to cwnd clamps gives every pair that had a
// pacing rate its cwnd clamp at the next round.
func TestClampsFallback(t *testing.T) {
	c := NewClamps([]detour.Source{&list{ds: []detour.Detour{d3}}}, ClampPacing)
	m := Measurement{Token: 1, Local: netip.AddrPortFrom(d3.Local, 41000), Remote: server, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}
	if got := c.Decide([]Measurement{m}); len(got) != 1 || got[0].Segments != 0 || got[0].PacingRate == 0 {
		t.Fatalf("pacing: clamps %+v", got)
	}
	c.SetMode(ClampCwnd)
	if c.Mode() != ClampCwnd {
		t.Fatalf("mode %s after SetMode(cwnd)", c.Mode())
	}
	m.RTT = 65 * time.Millisecond // a pair that had a clamp keeps being clamped whatever its RTT
	if got := c.Decide([]Measurement{m}); len(got) != 1 || got[0].Segments != 56 || got[0].PacingRate != 0 {
		t.Fatalf("after the fallback: clamps %+v, want 56 segments and no rate", got)
	}
	if got := c.Decide([]Measurement{m}); len(got) != 0 {
		t.Fatalf("again: clamps %+v, want none", got)
	}
}

// The rule a clamp gives (the agent's clamp log line) is the mode's: the
// bandwidth-delay product for cwnd clamps, the delivery rate for pacing
// rates, both for both.
func TestClampReasonPerMode(t *testing.T) {
	tun := netip.AddrPortFrom(d3.Local, 41000)
	for _, tc := range []struct {
		mode      ClampMode
		want, not []string
	}{
		{ClampCwnd, []string{"tunnel:r3: cwnd 1.25 x 8.00 Mbit/s x min RTT 61ms / MSS 1368"}, []string{"pacing"}},
		{ClampPacing, []string{"tunnel:r3: pacing rate 1.25 x 8.00 Mbit/s"}, []string{"cwnd", "MSS"}},
		{ClampBoth, []string{"cwnd 1.25 x 8.00 Mbit/s x min RTT 61ms / MSS 1368", "; pacing rate 1.25 x 8.00 Mbit/s"}, nil},
	} {
		c := NewClamps([]detour.Source{&list{ds: []detour.Detour{d3}}}, tc.mode)
		got := c.Decide([]Measurement{{Token: 1, Local: tun, Remote: server, DeliveryRate: 1e6, MinRTT: 61 * time.Millisecond, RTT: 130 * time.Millisecond, SndMSS: 1368}})
		if len(got) != 1 {
			t.Fatalf("%s: clamps %+v, want one", tc.mode, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got[0].Reason, w) {
				t.Errorf("%s: rule %q lacks %q", tc.mode, got[0].Reason, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got[0].Reason, n) {
				t.Errorf("%s: rule %q names %q", tc.mode, got[0].Reason, n)
			}
		}
	}
}
