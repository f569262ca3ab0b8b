package scenario

import "testing"

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
	for name := range procs {
		if name != MPTCPNATStaticLowat && name != MPTCPTunnelStaticLowat && name != MPTCPNATBackupStaticLowat && SubflowLowat(name) != 0 {
			t.Errorf("%s: SubflowLowat = %d, want 0", name, SubflowLowat(name))
		}
	}
}
