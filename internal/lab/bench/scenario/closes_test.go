package scenario

import "testing"

// Only the procedures whose agent destroys subflows on purpose keeps a
// trial that ends with fewer subflows; static, the clamps and plain
// procedures still fail it (a detour that did not come up).
func TestClosesSubflows(t *testing.T) {
	for _, p := range []string{MPTCPTunnelStaticSBD, MPTCPNATStaticSBD, MPTCPNATGuard, MPTCPNATGuardStarveOff} {
		if !ClosesSubflows(p) {
			t.Errorf("%s: want true", p)
		}
	}
	for _, p := range []string{MPTCPNATStatic, MPTCPNATAdaptive, MPTCPTunnelStatic, MPTCPTunnelStaticClampBoth, MPTCPTunnel, MPTCPNAT, TCP} {
		if ClosesSubflows(p) {
			t.Errorf("%s: want false", p)
		}
	}
	if Policy(MPTCPTunnelStaticSBD) != "static" || Label(MPTCPTunnelStaticSBD) == "" {
		t.Errorf("sbd procedure: policy %q, label %q", Policy(MPTCPTunnelStaticSBD), Label(MPTCPTunnelStaticSBD))
	}
}
