package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/policy"
)

// Status shows the clamp mode, a fallback's reason and each pair's
// limits: segments, a pacing rate, or both.
func TestPrintCwndClamp(t *testing.T) {
	pair := func(segs uint32, rate uint64) policy.ClampPair {
		return policy.ClampPair{Local: netip.MustParseAddr("10.9.0.2"), Remote: netip.MustParseAddr("10.0.2.2"), Path: "tunnel:r1",
			Segments: segs, PacingRate: rate, MaxRate: 1e6, MinRTT: 61 * time.Millisecond, MSS: 1368}
	}
	for _, tc := range []struct {
		st   policy.ClampStatus
		want []string
	}{
		{policy.ClampStatus{State: "active", Mode: policy.ClampPacing, Pairs: []policy.ClampPair{pair(0, 1250000)}},
			[]string{"mode pacing", "paced at most 10.00 Mbit/s (largest delivery rate 8.00 Mbit/s"}},
		{policy.ClampStatus{State: "active", Mode: policy.ClampBoth, Pairs: []policy.ClampPair{pair(56, 1250000)}},
			[]string{"mode both", "56 segments, paced at most 10.00 Mbit/s"}},
		{policy.ClampStatus{State: "active", Mode: policy.ClampCwnd, Fallback: "the kernel refused SO_MAX_PACING_RATE from BPF (invalid argument): cwnd clamps instead", Pairs: []policy.ClampPair{pair(56, 0)}},
			[]string{"mode cwnd", "fallback: the kernel refused SO_MAX_PACING_RATE", "56 segments (largest"}},
		{policy.ClampStatus{State: "failed", Error: "bpfclamp: load sock_ops program: operation not permitted"},
			[]string{"cwnd clamps: failed: bpfclamp: load sock_ops program: operation not permitted (running without them)"}},
	} {
		out := captureStdout(t, func() { printCwndClamp(&tc.st) })
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("status lacks %q:\n%s", w, out)
			}
		}
		if tc.st.Mode != policy.ClampBoth && strings.Contains(out, "segments, paced") {
			t.Errorf("mode %s shows both limits:\n%s", tc.st.Mode, out)
		}
	}
}
