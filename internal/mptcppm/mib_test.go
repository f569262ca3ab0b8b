package mptcppm

import "testing"

func TestParseMIB(t *testing.T) {
	b := []byte("TcpExt: A B\nTcpExt: 1 2\nMPTcpExt: MPCapableSYNRX AddAddrTxDrop\nMPTcpExt: 7 3\n")
	m, err := ParseMIB(b, "MPTcpExt")
	if err != nil || m["AddAddrTxDrop"] != 3 || m["MPCapableSYNRX"] != 7 || len(m) != 2 {
		t.Fatalf("ParseMIB = %v %v", m, err)
	}
	for _, bad := range []string{"", "MPTcpExt: A B\nMPTcpExt: 1\n", "MPTcpExt: A\nMPTcpExt: x\n"} {
		if _, err := ParseMIB([]byte(bad), "MPTcpExt"); err == nil {
			t.Errorf("ParseMIB(%q) accepted", bad)
		}
	}
}
