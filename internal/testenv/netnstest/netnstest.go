// Package netnstest builds small network-namespace topologies for
// integration tests: namespaces, veth links, addresses, routes, tbf shaping,
// and running code or commands inside a namespace. Everything it creates is
// removed in t.Cleanup, also when the test fails.
//
// Namespaces and links are made through netlink and ioctls. It never touches
// the root namespace: veths are created from inside a test namespace with
// their peer placed directly in another one. internal/lab builds whole
// emulated networks from a topology; this package is for tests that need a
// handful of namespaces wired by hand.
package netnstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var counter atomic.Int64

// live are the namespaces this process made and has not deleted yet: a
// test binary interrupted (Ctrl-C, SIGTERM from a CI's timeout) runs no
// t.Cleanup, so the first New registers with testenv.OnInterrupt a
// function that deletes them before the process dies of the signal.
var (
	liveMu   sync.Mutex
	live     = map[string]bool{}
	watchSig sync.Once
)

func track(name string) {
	watchSig.Do(func() {
		testenv.OnInterrupt(func() {
			liveMu.Lock()
			for n := range live {
				_ = netns.DeleteNamed(n)
			}
			liveMu.Unlock()
		})
	})
	liveMu.Lock()
	live[name] = true
	liveMu.Unlock()
}

func untrack(name string) {
	liveMu.Lock()
	delete(live, name)
	liveMu.Unlock()
}

// NS is a named network namespace under /run/netns.
type NS struct {
	Name string
	Path string
	t    testing.TB
	h    netns.NsHandle
	nl   *netlink.Handle
}

// New creates a namespace named <prefix>-<pid>-<n> with lo up; t.Cleanup
// deletes it. The prefix keeps each package's namespaces apart.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), counter.Add(1))
	var h netns.NsHandle
	err := OnThread(func() error {
		var err error
		h, err = netns.NewNamed(name)
		return err
	})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	ns := &NS{Name: name, Path: "/run/netns/" + name, t: t, h: h}
	track(name)
	t.Cleanup(func() {
		if ns.nl != nil {
			ns.nl.Close()
		}
		h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
		}
		untrack(name)
	})
	ns.nl, err = netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", name, err)
	}
	lo, err := ns.nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.nl.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return ns
}

// Netlink returns a netlink handle operating inside the namespace.
func (ns *NS) Netlink() *netlink.Handle { return ns.nl }

// OnThread runs fn on a fresh locked OS thread that is discarded afterwards,
// so a namespace switch inside fn can never leak to other goroutines.
func OnThread(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ch <- fn()
	}()
	return <-ch
}

// Do runs fn with the calling code inside ns: sockets created by fn belong
// to ns. Goroutines started by fn do not inherit the namespace, but sockets
// they use keep the namespace they were created in.
func (ns *NS) Do(fn func() error) error {
	return OnThread(func() error {
		if err := netns.Set(ns.h); err != nil {
			return fmt.Errorf("enter %s: %w", ns.Name, err)
		}
		return fn()
	})
}

// DoNamed is Do for a namespace known only by name (/run/netns/<name>).
func DoNamed(name string, fn func() error) error {
	h, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer h.Close()
	return OnThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter %s: %w", name, err)
		}
		return fn()
	})
}

// Run runs argv inside the namespace (ip netns exec) and fails the test on
// error; it returns the combined output.
func (ns *NS) Run(argv ...string) string {
	ns.t.Helper()
	out, err := ns.Try(argv...)
	if err != nil {
		ns.t.Fatalf("%s: %s: %v: %s", ns.Name, strings.Join(argv, " "), err, out)
	}
	return out
}

// Try runs argv inside the namespace and returns its combined output.
func (ns *NS) Try(argv ...string) (string, error) {
	args := append([]string{"netns", "exec", ns.Name}, argv...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	return string(out), err
}

// Listen opens a listener inside the namespace.
func (ns *NS) Listen(lc net.ListenConfig, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() (err error) {
		l, err = lc.Listen(ns.t.Context(), network, addr)
		return err
	})
	return l, err
}

// Dial connects from inside the namespace.
func (ns *NS) Dial(d *net.Dialer, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = d.Dial(network, addr)
		return err
	})
	return c, err
}

// addVeth creates ns:name -- peer:peerName and brings both ends up, with
// offloads off if asked.
func addVeth(t testing.TB, ns *NS, name string, peer *NS, peerName string, offloadsOff bool) {
	t.Helper()
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: 1500},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(int(peer.h)),
	}
	if err := ns.nl.LinkAdd(v); err != nil {
		t.Fatalf("veth %s:%s -- %s:%s: %v", ns.Name, name, peer.Name, peerName, err)
	}
	for _, side := range []struct {
		ns   *NS
		name string
	}{{ns, name}, {peer, peerName}} {
		l, err := side.ns.nl.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		if offloadsOff {
			if err := side.ns.OffloadsOff(side.name); err != nil {
				t.Fatal(err)
			}
		}
		if err := side.ns.nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// Veth connects ns:name to peer:peerName, brings both up with offloads off
// (the delay line needs wire-size frames with complete checksums).
func Veth(t testing.TB, ns *NS, name string, peer *NS, peerName string) {
	t.Helper()
	addVeth(t, ns, name, peer, peerName, true)
}

// LinkNamed connects a:aName and b:bName with a veth pair (offloads left
// as the kernel sets them), gives each end an address (CIDR form, e.g.
// "10.0.1.1/24") and brings both up.
func LinkNamed(t testing.TB, a *NS, aName, aAddr string, b *NS, bName, bAddr string) {
	t.Helper()
	addVeth(t, a, aName, b, bName, false)
	a.Addr(t, aName, aAddr)
	b.Addr(t, bName, bAddr)
}

// Link is LinkNamed with generated interface names, which it returns.
func Link(t testing.TB, a *NS, aAddr string, b *NS, bAddr string) (string, string) {
	t.Helper()
	i := counter.Add(1)
	an, bn := fmt.Sprintf("ta%da", i), fmt.Sprintf("ta%db", i)
	LinkNamed(t, a, an, aAddr, b, bn, bAddr)
	return an, bn
}

// Addr adds cidr (e.g. "10.9.0.1/24") to ns:ifname.
func (ns *NS) Addr(t testing.TB, ifname, cidr string) {
	t.Helper()
	l, err := ns.nl.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	// No DAD: an address must be usable at once.
	a.Flags |= unix.IFA_F_NODAD
	if err := ns.nl.AddrAdd(l, a); err != nil {
		t.Fatalf("addr %s on %s:%s: %v", cidr, ns.Name, ifname, err)
	}
}

// Route adds dst (CIDR; "0.0.0.0/0" for the default route) via gw in ns.
func (ns *NS) Route(t testing.TB, dst, gw string) {
	t.Helper()
	_, d, err := net.ParseCIDR(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.nl.RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(gw)}); err != nil {
		t.Fatalf("route %s via %s in %s: %v", dst, gw, ns.Name, err)
	}
}

// Tbf shapes egress of ns:ifname to rateBits bit/s with a tail-drop queue
// of limitBytes, as the lab does.
func (ns *NS) Tbf(t testing.TB, ifname string, rateBits uint64, limitBytes uint32) {
	t.Helper()
	l, err := ns.nl.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	rate := rateBits / 8
	burst := uint32(max(rate/250, 3200)) // 4 ms worth, at least two frames
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       rate,
		Limit:      limitBytes,
		Buffer:     netlink.Xmittime(rate, burst),
	}
	if err := ns.nl.QdiscAdd(q); err != nil {
		t.Fatalf("tbf on %s:%s: %v", ns.Name, ifname, err)
	}
}

// Sysctl writes /proc/sys/<key> inside ns (key with slashes, e.g. "net/ipv6/conf/all/disable_ipv6").
func (ns *NS) Sysctl(key, value string) error {
	return ns.Do(func() error {
		// /proc/sys/net resolves to the namespace of the opening thread.
		return os.WriteFile("/proc/sys/"+key, []byte(value), 0o644)
	})
}

// OffloadsOff turns off TX checksumming, TSO, GSO and GRO on ns:ifname with
// the legacy ethtool ioctls.
func (ns *NS) OffloadsOff(ifname string) error {
	const (
		ethtoolSTXCSUM = 0x17
		ethtoolSTSO    = 0x1f
		ethtoolSGSO    = 0x24
		ethtoolSGRO    = 0x2c
	)
	return ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, cmd := range []uint32{ethtoolSTSO, ethtoolSGSO, ethtoolSGRO, ethtoolSTXCSUM} {
			val := struct{ cmd, data uint32 }{cmd, 0}
			var ifr [40]byte
			copy(ifr[:16], ifname)
			*(*uintptr)(unsafe.Pointer(&ifr[16])) = uintptr(unsafe.Pointer(&val))
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
				return fmt.Errorf("ethtool 0x%x on %s: %w", cmd, ifname, e)
			}
			runtime.KeepAlive(&val)
		}
		return nil
	})
}

// MustRun runs argv (a CLI tool that checks or sets up state, e.g.
// "ip -n NS rule") and fails the test on error; it returns the combined
// output.
func MustRun(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// Serve accepts connections on ln until it fails (the test closes ln) and
// runs handle for each one in its own goroutine.
func Serve(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// KeepWriting writes 16 KiB chunks to c until stop is called (stop may be
// called more than once; it waits for the writer and returns the write
// error that ended it early, if any; a write timeout is not one). Tests
// keep a connection busy this way while they change what carries it.
func KeepWriting(c net.Conn) (stop func() error) {
	quit, done := make(chan struct{}), make(chan struct{})
	var werr error
	go func() {
		defer close(done)
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-quit:
				return
			default:
			}
			_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := c.Write(buf); err != nil && !os.IsTimeout(err) {
				werr = err
				return
			}
		}
	}()
	var once sync.Once
	return func() error {
		once.Do(func() { close(quit) })
		<-done
		return werr
	}
}
