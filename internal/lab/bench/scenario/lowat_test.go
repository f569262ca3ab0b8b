package scenario

import (
	"slices"
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
	// The -lowatrtt twins: the same floor, scaled.
	for rtt, plain := range map[string]string{MPTCPNATStaticLowatRTT: MPTCPNATStaticLowat, MPTCPTunnelStaticLowatRTT: MPTCPTunnelStaticLowat} {
		if SubflowLowat(rtt) != SubflowLowatBytes || AgentExtra(rtt) != "subflow_lowat: 131072\nsubflow_lowat_scale: rtt\n" {
			t.Errorf("%s: SubflowLowat %d, agent extra %q", rtt, SubflowLowat(rtt), AgentExtra(rtt))
		}
		if Policy(rtt) != "static" || SinglePath(rtt) != SinglePath(plain) || DefaultPath(rtt) != TCP {
			t.Errorf("%s: policy %q, single %q, default %q; want static, %s, tcp", rtt, Policy(rtt), SinglePath(rtt), DefaultPath(rtt), SinglePath(plain))
		}
		if Label(rtt) == "" || Label(rtt) == Label(plain) || ClosesSubflows(rtt) || !slices.Contains(ProcedureNames(), rtt) {
			t.Errorf("%s: label %q (fixed %q), closes subflows %v, listed %v", rtt, Label(rtt), Label(plain), ClosesSubflows(rtt), slices.Contains(ProcedureNames(), rtt))
		}
	}
	withLimit := map[string]bool{MPTCPNATStaticLowat: true, MPTCPTunnelStaticLowat: true, MPTCPNATBackupStaticLowat: true, MPTCPNATStaticLowatRTT: true, MPTCPTunnelStaticLowatRTT: true}
	for name := range procs {
		if !withLimit[name] && SubflowLowat(name) != 0 {
			t.Errorf("%s: SubflowLowat = %d, want 0", name, SubflowLowat(name))
		}
	}
}

// A run of a plain static procedure and its -lowat one is announced: both
// have the limit since it is the default; the arm without it is -nolowat.
func TestEqualArms(t *testing.T) {
	got := EqualArms([]string{TCP, MPTCPNATStatic, MPTCPNATStaticLowat, MPTCPTunnelStatic, MPTCPTunnelStaticNoLowat})
	if len(got) != 1 || !strings.Contains(got[0], "mptcp-nat-static and mptcp-nat-static-lowat") || !strings.Contains(got[0], "the arm without the limit is "+MPTCPNATStaticNoLowat) {
		t.Errorf("EqualArms: %q", got)
	}
	got = EqualArms([]string{MPTCPNATBackupStatic, MPTCPNATBackupStaticLowat})
	if len(got) != 1 || !strings.Contains(got[0], "mptcp-nat-backup-static and mptcp-nat-backup-static-lowat") || strings.Contains(got[0], "without the limit") {
		t.Errorf("EqualArms, backup: %q", got)
	}
	if got := EqualArms([]string{MPTCPNATStaticNoLowat, MPTCPNATStaticLowat, MPTCPNATStatic, MPTCPTunnelStaticNoLowat, MPTCPTunnelStaticLowatRTT}); len(got) != 1 {
		t.Errorf("-nolowat against -lowat and plain: %q (want only the plain/-lowat pair)", got)
	}
}
