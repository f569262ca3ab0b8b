package scenario

import "testing"

// Only the procedure whose agent destroys subflows on purpose keeps a
// trial that ends with fewer subflows; static, the clamps and plain
// procedures still fail it (a detour that did not come up).
func TestClosesSubflows(t *testing.T) {
	if !ClosesSubflows(MPTCPTunnelStaticSBD) {
		t.Fatal("mptcp-tunnel-static-sbd: want true")
	}
	for _, p := range []string{MPTCPTunnelStatic, MPTCPTunnelStaticClampBoth, MPTCPTunnel, MPTCPNAT, TCP} {
		if ClosesSubflows(p) {
			t.Errorf("%s: want false", p)
		}
	}
	if Policy(MPTCPTunnelStaticSBD) != "static" || Label(MPTCPTunnelStaticSBD) == "" {
		t.Errorf("sbd procedure: policy %q, label %q", Policy(MPTCPTunnelStaticSBD), Label(MPTCPTunnelStaticSBD))
	}
}
