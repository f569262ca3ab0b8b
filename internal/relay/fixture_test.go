package relay

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
)

// fixture is a three-namespace line: client -- relay -- server. The server
// has no route back to the client, so a detour only works if the relay
// masquerades.
type fixture struct {
	Client, Relay, Server string // namespace names
}

const (
	fxClient      = "10.0.1.1"
	fxRelay       = "10.0.1.2" // the relay's address on the client side
	fxRelayServer = "10.0.2.1"
	fxServer      = "10.0.2.2"
)

var fxCounter atomic.Int32

func run(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	n := fxCounter.Add(1)
	id := fmt.Sprintf("%d-%d", os.Getpid(), n)
	f := &fixture{Client: "trc" + id, Relay: "trr" + id, Server: "trs" + id}
	for _, ns := range []string{f.Client, f.Relay, f.Server} {
		run(t, "ip", "netns", "add", ns)
		name := ns
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", f.Client, "link", "add", "c0", "type", "veth", "peer", "name", "r0", "netns", f.Relay)
	run(t, "ip", "-n", f.Relay, "link", "add", "r1", "type", "veth", "peer", "name", "s0", "netns", f.Server)
	for _, c := range [][]string{
		{f.Client, "c0", fxClient + "/24"}, {f.Relay, "r0", fxRelay + "/24"},
		{f.Relay, "r1", fxRelayServer + "/24"}, {f.Server, "s0", fxServer + "/24"},
	} {
		run(t, "ip", "-n", c[0], "addr", "add", c[2], "dev", c[1])
		run(t, "ip", "-n", c[0], "link", "set", c[1], "up")
	}
	run(t, "ip", "-n", f.Client, "route", "add", "default", "via", fxRelay)
	run(t, "ip", "netns", "exec", f.Relay, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return f
}

// in runs fn with the calling goroutine's thread inside namespace ns.
// Sockets created in fn stay in ns after it returns.
func in(t testing.TB, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // a thread stuck in another namespace would poison later tests
		}
	}()
	fn()
}

// nftElements returns the element lines of a set or map in the relay's
// table as the nft CLI lists them ("" if the table does not exist).
func nftList(t testing.TB, ns string, what ...string) (string, error) {
	t.Helper()
	args := append([]string{"netns", "exec", ns, "nft"}, what...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	return string(out), err
}
