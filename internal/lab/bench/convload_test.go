package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestConvertLoad runs "mpdetour-lab convert-load" small, both modes, against the
// real converter (a relay with convert:) in a line lab: every idle
// conversion is open at the destination and still answers after the hold,
// each costs the converter descriptors (two sockets, and the splice pipes
// while it waits), and a rate run converts every conversion it starts.
// No timing assertions.
func TestConvertLoad(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "pgrep")
	b, lb := binary(t), labBinary(t)
	name := fmt.Sprintf("cvt%d", os.Getpid()%100000)
	t.Cleanup(func() { checkClean(t, name) })
	topo, err := topology.Builtin("line")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, topo, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Down(); err != nil {
			t.Error(err)
		}
	}()
	const idle = 150
	rep, err := ConvertLoad(ctx, ConvertLoadOptions{Lab: l, Binary: b, LabBinary: lb, Dir: t.TempDir(), Idle: idle, Concurrency: 16, Hold: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Opened == nil || rep.Opened.Open != idle || rep.Result.Alive != idle || rep.Responder != idle || rep.Result.Failed != 0 {
		t.Fatalf("idle: opened %+v, result %+v, destination held %d; want %d open, alive and held", rep.Opened, rep.Result, rep.Responder, idle)
	}
	if s := rep.PerConn["converter_sockets"]; s < 1.9 || s > 2.1 {
		t.Errorf("converter sockets per conversion %.2f, want 2 (client and destination side)", s)
	}
	if f := rep.PerConn["converter_fds"]; f < 2 {
		t.Errorf("converter fds per conversion %.2f, want at least 2", f)
	}
	if rep.Held.RSSKiB <= 0 || rep.Held.Threads <= 0 {
		t.Errorf("converter sample %+v", rep.Held)
	}
	rep, err = ConvertLoad(ctx, ConvertLoadOptions{Lab: l, Binary: b, LabBinary: lb, Dir: t.TempDir(), Rate: 50, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Result
	if r.Attempted != 100 || r.Converted != 100 || r.Failed != 0 || r.FirstByteMs.N != 100 || r.TicketRequests < (100+proto.MaxTickets-1)/proto.MaxTickets {
		t.Fatalf("rate: %+v", r)
	}
	if rep.After.CPUS < rep.Before.CPUS {
		t.Errorf("converter CPU went backwards: %v -> %v", rep.Before.CPUS, rep.After.CPUS)
	}
}
