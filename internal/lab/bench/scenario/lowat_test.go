package scenario

import (
	"strings"
	"testing"
)

// The lowat procedures are the static procedures with the limit: static
// policy, the same single path, their own label; no other procedure sets
// a limit.
func TestSubflowLowatProcedures(t *testing.T) {
	for lowat, plain := range map[string]string{MPTCPNATStaticLowat: MPTCPNATStatic, MPTCPTunnelStaticLowat: MPTCPTunnelStatic, MPTCPNATBackupStaticLowat: MPTCPNATBackupStatic} {
		if got := SubflowLowat(lowat); got != SubflowLowatBytes || SubflowLowatBytes != 131072 {
			t.Errorf("%s: SubflowLowat = %d, want 131072", lowat, got)
		}
		if Policy(lowat) != "static" || SinglePath(lowat) != SinglePath(plain) || DefaultPath(lowat) != TCP {
			t.Errorf("%s: policy %q, single %q, default %q; want static, %s, tcp", lowat, Policy(lowat), SinglePath(lowat), DefaultPath(lowat), SinglePath(plain))
		}
		if Label(lowat) == "" || Label(lowat) == Label(plain) || ClosesSubflows(lowat) {
			t.Errorf("%s: label %q (plain %q), closes subflows %v", lowat, Label(lowat), Label(plain), ClosesSubflows(lowat))
		}
	}
	for nolowat, plain := range map[string]string{MPTCPNATStaticNoLowat: MPTCPNATStatic, MPTCPTunnelStaticNoLowat: MPTCPTunnelStatic} {
		if AgentExtra(nolowat) != "subflow_lowat: 0\n" {
			t.Errorf("%s: agent extra %q, want subflow_lowat: 0", nolowat, AgentExtra(nolowat))
		}
		if Policy(nolowat) != "static" || SinglePath(nolowat) != SinglePath(plain) || DefaultPath(nolowat) != TCP {
			t.Errorf("%s: policy %q, single %q, default %q; want static, %s, tcp", nolowat, Policy(nolowat), SinglePath(nolowat), DefaultPath(nolowat), SinglePath(plain))
		}
		if Label(nolowat) == "" || Label(nolowat) == Label(plain) || ClosesSubflows(nolowat) {
			t.Errorf("%s: label %q (plain %q), closes subflows %v", nolowat, Label(nolowat), Label(plain), ClosesSubflows(nolowat))
		}
	}
	for name := range procs {
		if name != MPTCPNATStaticLowat && name != MPTCPTunnelStaticLowat && name != MPTCPNATBackupStaticLowat && SubflowLowat(name) != 0 {
			t.Errorf("%s: SubflowLowat = %d, want 0", name, SubflowLowat(name))
		}
	}
}

// A run of a plain static procedure and its -nolowat one is announced:
// neither has the limit since it is off by default.
func TestEqualArms(t *testing.T) {
	got := EqualArms([]string{TCP, MPTCPNATStatic, MPTCPNATStaticNoLowat, MPTCPTunnelStatic, MPTCPTunnelStaticLowat})
	if len(got) != 1 || !strings.Contains(got[0], "mptcp-nat-static and mptcp-nat-static-nolowat") || !strings.Contains(got[0], MPTCPNATStaticLowat) {
		t.Errorf("EqualArms: %q", got)
	}
	if got := EqualArms([]string{MPTCPNATStatic, MPTCPNATStaticLowat, MPTCPNATBackupStatic, MPTCPNATBackupStaticLowat}); len(got) != 0 {
		t.Errorf("plain against -lowat: %q", got)
	}
}
