package agent

import (
	"testing"
)

func TestMarkRelayTrouble(t *testing.T) {
	ds := []DetourStatus{{Kind: "nat", Relay: "r1", Healthy: true}, {Kind: "tunnel", Relay: "r1", Healthy: true},
		{Kind: "nat", Relay: "r2", Healthy: true}, {Kind: "tunnel", Relay: "r2", Healthy: true}, {Kind: "nat", Relay: "r3", Healthy: true}}
	markRelayTrouble(ds, []RelayStatus{{Name: "r1", State: RelayRevoked, Detail: "removed"}, {Name: "r2", State: RelayNoHandshake, Detail: "never"},
		{Name: "r3", State: RelayPolicyDenied}})
	want := []bool{false, false, true, false, true}
	for i, d := range ds {
		if d.Healthy != want[i] {
			t.Errorf("detour %d (%s:%s): healthy %v, want %v (%s)", i, d.Kind, d.Relay, d.Healthy, want[i], d.LastError)
		}
	}
	if ds[0].LastError != "relay revoked: removed" {
		t.Errorf("last error %q", ds[0].LastError)
	}
}

// A detour whose every subflow failed is not healthy (issue 28: all
// refused with errno 111 and HEALTH ok).
func TestMarkNeverEstablished(t *testing.T) {
	ds := []DetourStatus{
		{Relay: "refused", Failed: 4, Healthy: true, LastError: "connection refused"},
		{Relay: "worked", Failed: 4, Established: 1, Healthy: true},
		{Relay: "fresh", Healthy: true},
	}
	markNeverEstablished(ds)
	if ds[0].Healthy || ds[0].LastError != "all 4 subflows failed, none established; last: connection refused" {
		t.Fatalf("all refused: %+v", ds[0])
	}
	if !ds[1].Healthy || !ds[2].Healthy {
		t.Fatalf("a detour that worked or was never tried: %+v %+v", ds[1], ds[2])
	}
}
