package lab

import (
	"context"
	"fmt"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"golang.org/x/sys/unix"
)

var labSeq atomic.Int32

// testLabName returns a lab name unique to this test process ("tl" prefix).
func testLabName() string {
	return fmt.Sprintf("tl%d_%d", os.Getpid(), labSeq.Add(1))
}

// upLab builds t and removes it when the test ends, also on failure.
func upLab(t *testing.T, topo *topology.Topology) *Lab {
	t.Helper()
	name := testLabName()
	t.Cleanup(func() {
		if t.Failed() {
			// The delay line logs its per-direction counters when it stops.
			if st, err := loadState(name); err == nil {
				stopDelayLine(st.DelayLine)
			}
			if b, err := os.ReadFile(StateDir(name) + "/delayline.log"); err == nil {
				t.Logf("delay line log:\n%s", b)
			}
		}
		if err := Down(name); err != nil {
			t.Errorf("Down(%s): %v", name, err)
		}
		if left := listNetns(name); len(left) > 0 {
			t.Errorf("namespaces left after Down: %v", left)
		}
	})
	l, err := Up(context.Background(), topo, name)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	return l
}

func run(t *testing.T, l *Lab, node string, argv ...string) string {
	t.Helper()
	out, err := l.Command(context.Background(), node, argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %v\n%s", node, argv, err, out)
	}
	return string(out)
}

func ping(t *testing.T, l *Lab, from, to string) error {
	t.Helper()
	r, err := l.Ping(context.Background(), from, netip.MustParseAddr(to), 3, 50*time.Millisecond, 2*time.Second)
	if err != nil {
		return err
	}
	if r.Received == 0 {
		return fmt.Errorf("ping %s -> %s: no reply to %d requests", from, to, r.Sent)
	}
	return nil
}

func TestBrennanUpDown(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "tc")
	topo, err := topology.Builtin("brennan2017")
	if err != nil {
		t.Fatal(err)
	}
	l := upLab(t, topo)
	if got := l.Addr("client").String(); got != "10.0.1.1" {
		t.Errorf("client address %s, want 10.0.1.1", got)
	}
	if got := l.Addr("server").String(); got != "10.0.3.2" {
		t.Errorf("server address %s, want 10.0.3.2", got)
	}
	if got := l.Addr("detour").String(); got != "10.0.6.2" {
		t.Errorf("detour address %s, want 10.0.6.2", got)
	}
	// ip netns sees the namespaces (bind mounts like ip netns add).
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes() {
		if !strings.Contains(string(out), l.NetnsName(n)) {
			t.Errorf("ip netns list lacks %s:\n%s", l.NetnsName(n), out)
		}
	}
	addrs, err := exec.Command("ip", "-n", l.NetnsName("r1"), "-4", "-o", "addr").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10.0.1.2/24", "10.0.2.1/24", "10.0.4.1/24"} {
		if !strings.Contains(string(addrs), want) {
			t.Errorf("r1 lacks %s:\n%s", want, addrs)
		}
	}
	// The default path goes through r2 and the detour path through r3.
	if r := run(t, l, "r1", "ip", "route", "get", "10.0.3.2"); !strings.Contains(r, "via 10.0.2.2") {
		t.Errorf("r1 route to server: %s", r)
	}
	if r := run(t, l, "r1", "ip", "route", "get", "10.0.6.2"); !strings.Contains(r, "via 10.0.4.2") {
		t.Errorf("r1 route to detour: %s", r)
	}
	if fwd := run(t, l, "r3", "cat", "/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(fwd) != "1" {
		t.Errorf("r3 ip_forward = %q", fwd)
	}
	if fwd := run(t, l, "client", "cat", "/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(fwd) != "0" {
		t.Errorf("client ip_forward = %q", fwd)
	}
	for _, c := range [][2]string{{"client", "10.0.3.2"}, {"client", "10.0.6.2"}, {"detour", "10.0.3.2"}, {"server", "10.0.6.2"}} {
		if err := ping(t, l, c[0], c[1]); err != nil {
			t.Error(err)
		}
	}
	checkNoTCPMetrics(t, l)
	// tbf on the core-limited profile: 20 Mbit/s on client's access link.
	q := run(t, l, "client", "tc", "qdisc", "show", "dev", "L1")
	if !strings.Contains(q, "tbf") || !strings.Contains(q, "20Mbit") {
		t.Errorf("client L1 qdisc: %s", q)
	}
}

// offloads reads TSO/GSO/GRO of ifname inside node.
func offloads(t *testing.T, l *Lab, node, ifname string) (tso, gso, gro uint32) {
	t.Helper()
	err := l.Do(node, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if tso, err = ethtoolGet(fd, ifname, unix.ETHTOOL_GTSO); err != nil {
			return err
		}
		if gso, err = ethtoolGet(fd, ifname, unix.ETHTOOL_GGSO); err != nil {
			return err
		}
		gro, err = ethtoolGet(fd, ifname, unix.ETHTOOL_GGRO)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return
}

func TestDetoursK3(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip")
	topo, err := topology.Builtin("detours")
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.Set("detours", "3"); err != nil {
		t.Fatal(err)
	}
	if err := topo.Set("C2.delay", "20ms"); err != nil {
		t.Fatal(err)
	}
	l := upLab(t, topo)
	if len(l.Nodes()) != 7 {
		t.Errorf("nodes %v, want client, r1, r2, server, detour1..3", l.Nodes())
	}
	for _, dst := range []string{"10.0.3.2", "10.1.1.2", "10.1.2.2", "10.1.3.2"} {
		if err := ping(t, l, "client", dst); err != nil {
			t.Error(err)
		}
	}
	for i := 1; i <= 3; i++ {
		if err := ping(t, l, fmt.Sprintf("detour%d", i), "10.0.3.2"); err != nil {
			t.Error(err)
		}
	}
	// The server reaches detour2 back over E2 (its own egress link).
	if r := run(t, l, "r2", "ip", "route", "get", "10.1.2.2"); !strings.Contains(r, "via 10.2.2.1") {
		t.Errorf("r2 route to detour2: %s", r)
	}
	// C2's extra 20 ms shows in the RTT client -> detour2 (2x(5+20) ms) against detour1 (2x10 ms).
	r1, err := l.Ping(context.Background(), "client", netip.MustParseAddr("10.1.1.2"), 5, 20*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Ping(context.Background(), "client", netip.MustParseAddr("10.1.2.2"), 5, 20*time.Millisecond, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RTT client->detour1 %v, ->detour2 %v", r1.Median(), r2.Median())
	if r1.Received == 0 || r2.Received == 0 || r2.Min() < 50*time.Millisecond || r1.Min() < 20*time.Millisecond || r2.Min()-r1.Min() < 20*time.Millisecond {
		t.Errorf("C2 delay not applied: detour1 %v, detour2 %v", r1.Min(), r2.Min())
	}
	rep, err := l.Check(context.Background(), CheckOptions{NoRate: true, Links: []string{"C2", "E3"}, LossSamples: 300})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Directions {
		t.Logf("check %s %s: RTT median %v spec %v, loss %d/%d", d.Link, d.Dir, d.RTTMedian, d.RTTSpec, d.Lost, d.Sent)
	}
	if !rep.OK {
		t.Errorf("lab check of C2 (20 ms) and E3 failed: %v", rep.Failures())
	}
	if tso, gso, gro := offloads(t, l, "r1", "C1"); tso != 0 || gso != 0 || gro != 0 {
		t.Errorf("offloads on emulated link C1: tso %d gso %d gro %d", tso, gso, gro)
	}
}

// TestCrashCleanup simulates a kill -9 of the builder: the Lab value is
// dropped and only the name is left; Down must still remove everything,
// including processes running inside the namespaces.
func TestCrashCleanup(t *testing.T) {
	testenv.Root(t)
	topo, err := topology.Builtin("brennan2017")
	if err != nil {
		t.Fatal(err)
	}
	name := testLabName()
	t.Cleanup(func() { Down(name) })
	l, err := Up(context.Background(), topo, name)
	if err != nil {
		t.Fatal(err)
	}
	sleeper := l.Command(context.Background(), "server", "sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	dl := l.st.DelayLine
	l = nil
	if got, err := List(); err != nil || !contains(got, name) {
		t.Fatalf("List() = %v, %v; want it to contain %s", got, err, name)
	}
	l2, err := Open(name)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Addr("server").String() != "10.0.3.2" {
		t.Errorf("Open: server address %v", l2.Addr("server"))
	}
	if err := Down(name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Error("process inside the lab survived Down")
	}
	if left := listNetns(name); len(left) > 0 {
		t.Errorf("namespaces left: %v", left)
	}
	if dl != nil && dl.alive() {
		t.Errorf("delay line %d survived Down", dl.PID)
	}
	if _, err := os.Stat(StateDir(name)); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	if got, _ := List(); contains(got, name) {
		t.Errorf("List still shows %s", name)
	}
	// Idempotent.
	if err := Down(name); err != nil {
		t.Errorf("second Down: %v", err)
	}
	if _, err := Open(name); err == nil {
		t.Error("Open after Down succeeded")
	}
}

// TestRollback cancels Up half way and checks nothing is left.
func TestRollback(t *testing.T) {
	testenv.Root(t)
	topo, err := topology.Builtin("brennan2017")
	if err != nil {
		t.Fatal(err)
	}
	name := testLabName()
	t.Cleanup(func() { Down(name) })
	// A failure late in the build: a sysctl the kernel refuses on the last node.
	topo.Node("detour").Sysctls = []topology.Sysctl{{Key: "net.ipv4.no_such_sysctl", Value: "1"}}
	if _, err := Up(context.Background(), topo, name); err == nil {
		t.Fatal("Up with a bad sysctl succeeded")
	} else {
		t.Logf("Up failed as expected: %v", err)
	}
	if left := listNetns(name); len(left) > 0 {
		t.Errorf("namespaces left after failed Up: %v", left)
	}
	if _, err := os.Stat(StateDir(name)); !os.IsNotExist(err) {
		t.Errorf("state dir left after failed Up: %v", err)
	}
	topo.Node("detour").Sysctls = nil
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Up(ctx, topo, name); err == nil {
		t.Fatal("Up with a cancelled context succeeded")
	}
	// Cancel during the build.
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, err = Up(ctx, topo, name)
	t.Logf("Up with 5ms timeout: %v", err)
	if err == nil {
		Down(name)
	}
	if left := listNetns(name); err != nil && len(left) > 0 {
		t.Errorf("namespaces left after cancelled Up: %v", left)
	}
	// Same name twice.
	if _, err := Up(context.Background(), topo, name); err != nil {
		t.Fatal(err)
	}
	if _, err := Up(context.Background(), topo, name); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("second Up with the same name: %v", err)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// ethtoolGet reads one legacy ethtool flag (tests check the offloads the lab turns off).
func ethtoolGet(fd int, ifname string, cmd uint32) (uint32, error) {
	v := ethtoolValue{cmd: cmd}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(unsafe.Pointer(&v))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if errno != 0 {
		return 0, errno
	}
	return v.data, nil
}
