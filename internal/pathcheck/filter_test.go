package pathcheck

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

type listSource struct {
	mu       sync.Mutex
	ds       []detour.Detour
	prepared int
	released int
}

func (l *listSource) Prepare(netip.AddrPort) { l.mu.Lock(); l.prepared++; l.mu.Unlock() }
func (l *listSource) Detours(netip.AddrPort) []detour.Detour {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]detour.Detour(nil), l.ds...)
}
func (l *listSource) Release(context.Context, netip.AddrPort) error {
	l.mu.Lock()
	l.released++
	l.mu.Unlock()
	return nil
}

func TestFilterWithholdsStripped(t *testing.T) {
	server := netip.MustParseAddrPort("198.51.100.10:443")
	bad := detour.Detour{Kind: detour.NAT, Relay: "r1", Remote: netip.MustParseAddrPort("198.18.2.2:4000")}
	good := detour.Detour{Kind: detour.NAT, Relay: "r2", Remote: netip.MustParseAddrPort("198.18.3.2:4000")}
	broken := detour.Detour{Kind: detour.NAT, Relay: "r3", Remote: netip.MustParseAddrPort("198.18.4.2:4000")}
	tun := detour.Detour{Kind: detour.Tunnel, Relay: "r1", Local: netip.MustParseAddr("100.80.0.2"), Remote: server}
	src := &listSource{ds: []detour.Detour{bad, good, broken, tun}}
	f := NewFilter(src, FilterConfig{})
	defer f.Close()
	var mu sync.Mutex
	checked := map[string]int{}
	f.check = func(_ context.Context, d detour.Detour) (bool, string, error) {
		mu.Lock()
		checked[d.Relay]++
		mu.Unlock()
		switch d.Relay {
		case "r1":
			return true, "mptcp-stripped: test", nil
		case "r3":
			return false, "", errors.New("no raw socket")
		}
		return false, "", nil
	}
	f.Prepare(server)
	if src.prepared != 1 {
		t.Fatal("Prepare not passed on")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, bad := f.Unusable(bad); bad || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The other checks run in their own goroutines: wait until each has
	// been called (each counts itself first) before counting them below.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(checked)
		mu.Unlock()
		if n == 3 {
			break
		}
	}
	got := f.Detours(server)
	if len(got) != 3 || got[0] != good || got[1] != broken || got[2] != tun {
		t.Fatalf("detours: %v, want the clean, the unverifiable and the tunnel one", got)
	}
	if why, ok := f.Unusable(bad); !ok || why != "mptcp-stripped: test" {
		t.Errorf("Unusable(bad) = %q, %v", why, ok)
	}
	if s := f.Stripped(); len(s) != 1 || s[0] != bad {
		t.Errorf("Stripped: %v", s)
	}
	f.Detours(server)
	mu.Lock()
	if checked["r1"] != 1 || checked["r2"] != 1 || checked["r3"] != 1 || checked["r1"]+checked["r2"]+checked["r3"] != len(checked)*1 || len(checked) != 3 {
		t.Errorf("checks: %v, want each NAT detour once, the tunnel never", checked)
	}
	mu.Unlock()
	// Released grants are checked again when handed out anew.
	if err := f.Release(context.Background(), server); err != nil || src.released != 1 {
		t.Fatalf("release: %v, %d", err, src.released)
	}
	if _, bad := f.Unusable(bad); bad {
		t.Error("verdict kept after release")
	}
}
