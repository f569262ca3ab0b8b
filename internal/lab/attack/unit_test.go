package attack

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// The scenario format lists the same kinds as the suite.
func TestKindsMatchScenario(t *testing.T) {
	if !slices.Equal(Kinds(), scenario.AttackKinds) {
		t.Fatalf("attack.Kinds %v, scenario.AttackKinds %v", Kinds(), scenario.AttackKinds)
	}
}

func TestReadMPTcpExt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "netstat")
	os.WriteFile(p, []byte("TcpExt: SyncookiesSent\nTcpExt: 3\nMPTcpExt: MPJoinNoTokenFound AddAddr\nMPTcpExt: 17 2\n"), 0o644)
	m, err := readMPTcpExt(p)
	if err != nil || m["MPJoinNoTokenFound"] != 17 || m["AddAddr"] != 2 {
		t.Fatalf("%v %v", m, err)
	}
	os.WriteFile(p, []byte("TcpExt: A\nTcpExt: 1\n"), 0o644)
	if _, err := readMPTcpExt(p); err == nil {
		t.Fatal("no MPTcpExt accepted")
	}
	if _, err := Start(t.Context(), nil, Config{Kind: "smurf"}); err == nil {
		t.Fatal("unknown kind accepted")
	}
}
