package lab

import (
	"bufio"
	"context"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// e2eGoodput runs one cubic transfer from client to server across the lab.
func e2eGoodput(t *testing.T, l *Lab, dur time.Duration) float64 {
	t.Helper()
	g, err := l.goodput(context.Background(), "client", "server", l.Addr("server"), dur)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestBrennanCoreLimited is the acceptance case: plain TCP from
// client to server over the default path of core-limited brennan2017
// gets about 9.5 Mbit/s with an RTT of about 30 ms. The bounds are wide
// (fidelity numbers go to docs/lab.md); they catch a missing tbf, a
// missing delay or a wrong path, not a percent.
func TestBrennanCoreLimited(t *testing.T) {
	testenv.MPTCP(t)
	topo, _ := topology.Builtin("brennan2017")
	l := upLab(t, topo)
	if _, err := l.Ping(context.Background(), "client", l.Addr("server"), 1, time.Millisecond, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	r, err := l.Ping(context.Background(), "client", l.Addr("server"), 10, 20*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The minimum: a starved delay line is late, never early, so the
	// lower bound is tight and the upper one only rules out a wrong path
	// (the detour path would be 60 ms).
	if r.Received == 0 || r.Min() < 29*time.Millisecond || r.Min() > 45*time.Millisecond {
		t.Errorf("client->server RTT min %v (%d/%d replies), want ~30 ms", r.Min(), r.Received, r.Sent)
	}
	g := e2eGoodput(t, l, 3*time.Second)
	t.Logf("client->server: RTT %v, TCP goodput %.2f Mbit/s", r.Median(), g)
	if g < 7 || g > 10 {
		t.Errorf("client->server goodput %.2f Mbit/s, want ~9.5 (tbf 10 Mbit/s on L2)", g)
	}
}

// TestCheckDetectsBrokenEmulation runs lab check on a healthy lab, then
// removes the rate limit of one direction by hand and expects check to
// flag exactly that direction.
func TestCheckDetectsBrokenEmulation(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "tc")
	topo, _ := topology.Builtin("brennan2017")
	l := upLab(t, topo)
	rep, err := l.Check(context.Background(), CheckOptions{RateDuration: 3 * time.Second, Links: []string{"L1", "L2"}, LossSamples: 500})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Directions) != 4 {
		t.Fatalf("%d directions, want 4", len(rep.Directions))
	}
	for _, d := range rep.Directions {
		t.Logf("%s %s->%s: RTT %v (spec %v), goodput %.2f (spec %.2f), loss %d/%d", d.Link, d.From, d.To, d.RTTMedian, d.RTTSpec, d.Goodput, d.GoodputSpec, d.Lost, d.Sent)
		// Loose: a healthy lab is far inside these even on a loaded
		// machine, where the delay line may be late but never early.
		if d.RTTMin < d.RTTSpec-time.Millisecond || d.RTTMin > d.RTTSpec+10*time.Millisecond {
			t.Errorf("%s %s: RTT min %v, spec %v", d.Link, d.Dir, d.RTTMin, d.RTTSpec)
		}
		if d.Goodput < 0.7*d.GoodputSpec || d.Goodput > 1.05*d.GoodputSpec {
			t.Errorf("%s %s: goodput %.2f, spec %.2f", d.Link, d.Dir, d.Goodput, d.GoodputSpec)
		}
		if d.Lost != 0 || !d.LossOK {
			t.Errorf("%s %s: %d of %d probes lost on a lossless link", d.Link, d.Dir, d.Lost, d.Sent)
		}
	}
	t.Logf("delay line CPU %.2f cores", rep.DelayLineCPU)
	if out, err := exec.Command("tc", "-n", l.NetnsName("r1"), "qdisc", "del", "dev", "L2", "root").CombinedOutput(); err != nil {
		t.Fatalf("removing tbf: %v %s", err, out)
	}
	rep, err = l.Check(context.Background(), CheckOptions{RateDuration: 3 * time.Second, Links: []string{"L2"}, LossSamples: 200, Sequential: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK {
		t.Fatal("check passed with L2 r1->r2 unshaped")
	}
	for _, d := range rep.Directions {
		t.Logf("after sabotage: %s %s goodput %.2f ok=%v", d.Link, d.Dir, d.Goodput, d.GoodputOK)
		if d.Dir == "ab" && (d.GoodputOK || d.Goodput < 2*d.GoodputSpec) {
			t.Errorf("unshaped r1->r2: goodput %.2f ok=%v", d.Goodput, d.GoodputOK)
		}
	}
	if len(rep.Failures()) == 0 {
		t.Error("no failure lines")
	}
}

// TestBrennanLossySymmetric: symmetric profile, 1% loss on L2, measured
// against a 99.99% interval so that the test fails only when the loss is
// really wrong (no drop at all, or drops on the wrong link).
func TestBrennanLossySymmetric(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "tc")
	topo, _ := topology.Builtin("brennan2017")
	for _, kv := range [][2]string{{"profile", "symmetric"}, {"variant", "lossy"}} {
		if err := topo.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	l := upLab(t, topo)
	if q := run(t, l, "client", "tc", "qdisc", "show", "dev", "L1"); !strings.Contains(q, "10Mbit") {
		t.Errorf("symmetric profile: client L1 qdisc %s", q)
	}
	rep, err := l.Check(context.Background(), CheckOptions{NoRate: true, Links: []string{"L2", "L4"}, LossSamples: 3000, Confidence: 0.9999})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Directions {
		t.Logf("%s %s->%s: loss %d/%d [%.3f%%, %.3f%%], spec %.2f%%", d.Link, d.From, d.To, d.Lost, d.Sent, d.LossLo*100, d.LossHi*100, d.LossSpec*100)
		if !d.LossOK {
			t.Errorf("%s %s: loss %d/%d outside the interval around %.2f%%", d.Link, d.Dir, d.Lost, d.Sent, d.LossSpec*100)
		}
	}
}

// TestBrennanDelayed: L2 at 100 ms one way makes the default path's RTT
// 2*(5+100+5) = 220 ms while the detour path stays at 30 ms.
func TestBrennanDelayed(t *testing.T) {
	testenv.Root(t)
	topo, _ := topology.Builtin("brennan2017")
	if err := topo.Set("variant", "delayed"); err != nil {
		t.Fatal(err)
	}
	l := upLab(t, topo)
	for _, c := range []struct {
		dst      string
		min, max time.Duration
	}{{"10.0.3.2", 219 * time.Millisecond, 240 * time.Millisecond}, {"10.0.6.2", 29 * time.Millisecond, 45 * time.Millisecond}} {
		// The first echo waits for ARP on every hop; measure after it.
		if _, err := l.Ping(context.Background(), "client", netip.MustParseAddr(c.dst), 1, time.Millisecond, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		r, err := l.Ping(context.Background(), "client", netip.MustParseAddr(c.dst), 5, 50*time.Millisecond, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("client -> %s: RTT min %v median %v", c.dst, r.Min(), r.Median())
		if r.Received == 0 || r.Min() < c.min || r.Min() > c.max {
			t.Errorf("client -> %s: RTT min %v (%d replies), want %v..%v", c.dst, r.Min(), r.Received, c.min, c.max)
		}
	}
	// lab check on L2: 200 ms RTT spec, tolerance 6 ms (3%).
	rep, err := l.Check(context.Background(), CheckOptions{NoRate: true, Links: []string{"L2"}, LossSamples: 300})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Directions {
		t.Logf("check L2 %s: RTT median %v spec %v, loss %d/%d", d.Dir, d.RTTMedian, d.RTTSpec, d.Lost, d.Sent)
		if !d.RTTOK || !d.LossOK {
			t.Errorf("lab check of the delayed L2 failed: %v", rep.Failures())
		}
	}
}

// TestKill9Builder builds a lab in a child process, kills it with SIGKILL
// while the lab is up (the delay line, in its own session, survives as an
// orphan), and cleans up by name from this process.
func TestKill9Builder(t *testing.T) {
	testenv.Root(t)
	name := testLabName()
	t.Cleanup(func() { Down(name) })
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBuilder$", "-test.v")
	cmd.Env = append(os.Environ(), "MPDETOUR_LAB_HELPER="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	up := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "HELPER UP") {
			up = true
			break
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if !up {
		t.Fatal("helper did not build the lab")
	}
	l, err := Open(name)
	if err != nil {
		t.Fatal(err)
	}
	dl := l.st.DelayLine
	if !dl.alive() {
		t.Error("delay line died with its builder")
	}
	if err := Down(name); err != nil {
		t.Fatal(err)
	}
	if left := listNetns(name); len(left) > 0 {
		t.Errorf("namespaces left: %v", left)
	}
	deadline := time.Now().Add(3 * time.Second)
	for dl.alive() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if dl.alive() {
		t.Errorf("delay line %d survived Down", dl.PID)
	}
}

// TestHelperBuilder is the child of TestKill9Builder.
func TestHelperBuilder(t *testing.T) {
	name := os.Getenv("MPDETOUR_LAB_HELPER")
	if name == "" {
		t.Skip("helper process for TestKill9Builder")
	}
	topo, _ := topology.Builtin("brennan2017")
	if _, err := Up(context.Background(), topo, name); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("HELPER UP\n")
	time.Sleep(time.Minute)
}

var _ = benchtool.DefaultCC
