package rostersim

import (
	"context"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestSimulateSmall runs the simulation at a size every run can afford;
// ROSTER_SIM_RELAYS sets another size, ROSTER_SIM_SCALE a time dilation
// (the report's runs use `mpdetour collective simulate`).
func TestSimulateSmall(t *testing.T) {
	n, scale := 30, 1.0
	if s := os.Getenv("ROSTER_SIM_RELAYS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("ROSTER_SIM_SCALE"); s != "" {
		scale, _ = strconv.ParseFloat(s, 64)
	}
	res, err := Simulate(context.Background(), SimConfig{Relays: n, Kill: 2, Window: 2 * time.Second, Settle: time.Second, Timeout: time.Minute, TimeScale: scale, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if res.Verified < uint64(n) || res.SteadyBps <= 0 || res.KillDetection <= 0 {
		t.Fatalf("implausible result %+v", *res)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func TestSimAddrs(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100000; i++ {
		a := simAddrOf(i)
		if _, err := netip.ParseAddrPort(a); err != nil || seen[a] {
			t.Fatalf("relay %d: address %q: %v (duplicate %v)", i, a, err, seen[a])
		}
		seen[a] = true
	}
}
