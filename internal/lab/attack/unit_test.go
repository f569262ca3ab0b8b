package attack

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/mptcpwire"
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

// The injected segments' TSval follows the sender's 1 kHz clock from the
// sniffed one: whole milliseconds only (never ahead of the sender), TSecr
// and the sniffed option untouched.
func TestAdvanceTSval(t *testing.T) {
	ts := mptcpwire.Option{Kind: mptcpwire.OptTimestamp, Data: []byte{0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 9}}
	got := advanceTSval(ts, 3900*time.Microsecond)
	if want := []byte{0, 0, 0, 1, 0, 0, 0, 9}; !bytes.Equal(got.Data, want) || got.Kind != mptcpwire.OptTimestamp {
		t.Errorf("advanced by 3.9 ms: %x, want %x (TSval +3, wrapping; TSecr kept)", got.Data, want)
	}
	if ts.Data[3] != 0xfe {
		t.Errorf("the sniffed option was changed: %x", ts.Data)
	}
	if got := advanceTSval(ts, 900*time.Microsecond); !bytes.Equal(got.Data, ts.Data) {
		t.Errorf("advanced by 0.9 ms: %x, want the sniffed TSval", got.Data)
	}
	if got := advanceTSval(mptcpwire.Option{Kind: mptcpwire.OptTimestamp, Data: []byte{1, 2}}, time.Second); !bytes.Equal(got.Data, []byte{1, 2}) {
		t.Errorf("malformed option changed: %x", got.Data)
	}
}
