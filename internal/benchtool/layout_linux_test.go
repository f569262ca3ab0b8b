package benchtool

import (
	"testing"
	"unsafe"
)

// A layout mistake in the kernel structs read with getsockopt would
// silently shift every field (sizes from include/uapi/linux/mptcp.h).
func TestMPTCPStructLayout(t *testing.T) {
	if s := unsafe.Sizeof(mptcpSubflowInfo{}); s != 264 {
		t.Errorf("mptcp_subflow_info: %d bytes, want 264", s)
	}
	if s := unsafe.Sizeof(mptcpFullInfoT{}); s != 136 {
		t.Errorf("mptcp_full_info: %d bytes, want 136", s)
	}
	if s := unsafe.Sizeof(mptcpSubflowData{}); s != 16 {
		t.Errorf("mptcp_subflow_data: %d bytes, want 16", s)
	}
}
