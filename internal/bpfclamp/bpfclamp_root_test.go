package bpfclamp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// cgroupRoot finds a cgroup v2 mount (unified hierarchy or hybrid).
func cgroupRoot(t *testing.T) string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	t.Skip("no cgroup v2 mount")
	return ""
}

// ownCgroup returns the cgroup v2 directory this process is in.
func ownCgroup(t *testing.T, root string) string {
	dir, err := OwnCgroup(root)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func attachedCount(t *testing.T, dir string) int { return len(attachedIDs(t, dir)) }

// attachedIDs are the IDs of the sock_ops programs attached to cgroup dir.
func attachedIDs(t *testing.T, dir string) []ebpf.ProgramID {
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ebpf.ProgramID
	for _, p := range r.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

// connectedCwnd opens a loopback TCP connection while this process is in
// cgroup dir, sends 4 MB and returns the sender's largest snd_cwnd seen.
func connectedCwnd(t *testing.T, dir, back string) uint32 {
	most, _ := dialCwnd(t, dir, back, false, nil, nil)
	return most
}

// dialCwnd is connectedCwnd, with mptcp an MPTCP connection (the
// subflow's TCP_INFO: the kernel answers TCP_INFO on an MPTCP socket with
// the first subflow's). mid, when set, runs after half the data; the
// second result is the largest snd_cwnd seen in the last eighth; end,
// when set, gets the socket at the end of the transfer.
func dialCwnd(t *testing.T, dir, back string, mptcp bool, mid func(), end func(fd int)) (uint32, uint32) {
	return dialCwndAt(t, dir, back, "127.0.0.1", nil, mptcp, mid, end)
}

// dialCwndAt is dialCwnd toward the loopback address lo, from the local
// address local when set (an IPv6 one makes an AF_INET6 socket even
// toward an IPv4 address).
func dialCwndAt(t *testing.T, dir, back, lo string, local net.Addr, mptcp bool, mid func(), end func(fd int)) (uint32, uint32) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(mptcp)
	ln, err := lc.Listen(t.Context(), "tcp", net.JoinHostPort(lo, "0"))
	if err != nil {
		t.Skipf("listen on %s: %v", lo, err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(io.Discard, c)
	}()
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: local}
	d.SetMultipathTCP(mptcp)
	c, err := d.Dial("tcp", ln.Addr().String())
	// Back to where the process was: the socket keeps the cgroup it was
	// created in.
	if err2 := os.WriteFile(filepath.Join(back, "cgroup.procs"), pid, 0o644); err2 != nil {
		t.Fatal(err2)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if mptcp {
		if ok, err := c.(*net.TCPConn).MultipathTCP(); err != nil || !ok {
			t.Fatalf("the connection fell back to TCP (MPTCP %v, %v): is net.mptcp.enabled on?", ok, err)
		}
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	var most, late uint32
	for i := range 64 {
		if i == 32 && mid != nil {
			mid()
		}
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		raw.Control(func(fd uintptr) {
			if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				most = max(most, ti.Snd_cwnd)
				if i >= 56 {
					late = max(late, ti.Snd_cwnd)
				}
			}
		})
	}
	if end != nil {
		raw.Control(func(fd uintptr) { end(int(fd)) })
	}
	return most, late
}

// attachedCgroup creates a cgroup named name-PID under the cgroup v2 root
// and attaches the program to it (skipping without root or cgroup v2); it
// returns the clamper, the cgroup and the cgroup this process was in. The
// program is closed and the cgroup removed when the test ends.
func attachedCgroup(t *testing.T, name string, o Options) (*Clamper, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, cgroups)")
	}
	root := cgroupRoot(t)
	back := ownCgroup(t, root)
	dir := filepath.Join(root, fmt.Sprintf("%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
	c, err := Attach(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // before the cgroup's removal
	return c, dir, back
}

// TestClampTakesEffect attaches the program to a fresh cgroup, clamps the
// loopback pair to 4 segments and checks that a connection made in the
// cgroup never exceeds it, while one made after the clamp is deleted does;
// after Close nothing is attached to the cgroup.
func TestClampTakesEffect(t *testing.T) {
	c, dir, back := attachedCgroup(t, "mpd-bpfclamp", Options{EverySocket: true})
	if n := attachedCount(t, dir); n != 1 {
		t.Fatalf("%d programs attached, want 1", n)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	k := Key{Local: lo, Remote: lo}
	const clamp = 4
	if err := c.Set(k, Limits{CwndSegments: clamp}); err != nil {
		t.Fatal(err)
	}
	got := connectedCwnd(t, dir, back)
	t.Logf("clamp %d: largest snd_cwnd %d", clamp, got)
	if got == 0 || got > clamp {
		t.Errorf("clamped connection: largest snd_cwnd %d, want 1..%d", got, clamp)
	}
	// An MPTCP connection: the clamp applies to its subflow.
	got, _ = dialCwnd(t, dir, back, true, nil, nil)
	t.Logf("clamp %d, MPTCP subflow: largest snd_cwnd %d", clamp, got)
	if got == 0 || got > clamp {
		t.Errorf("clamped MPTCP subflow: largest snd_cwnd %d, want 1..%d", got, clamp)
	}
	if err := c.Delete(k); err != nil {
		t.Fatal(err)
	}
	// A clamp written while the connection runs reaches it at its next
	// RTT callback: the program records the socket (by cookie) once
	// bpf_setsockopt accepted the clamp, which also set ssthresh to it.
	// (Whether cwnd then drops depends on the loopback sender being
	// cwnd-limited, which it is not always: not asserted.)
	var cookie uint64
	var endCwnd uint32
	most, _ := dialCwnd(t, dir, back, false, func() {
		if err := c.Set(k, Limits{CwndSegments: clamp}); err != nil {
			t.Error(err)
		}
	}, func(fd int) {
		var err error
		if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			t.Error(err)
		}
		// Once everything written is acknowledged, the congestion
		// control has applied the clamp on the ACKs since.
		for range 100 {
			ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				t.Error(err)
				return
			}
			endCwnd = ti.Snd_cwnd
			if ti.Unacked == 0 && ti.Notsent_bytes == 0 {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Logf("clamp %d set mid-transfer: largest snd_cwnd %d, at the end %d", clamp, most, endCwnd)
	var applied [2]uint32 // segments, pacing rate
	if err := c.applied.Lookup(cookie, &applied); err != nil || applied != [2]uint32{clamp, 0} {
		t.Errorf("clamp set mid-transfer: socket %x has applied clamp %d (%v), want %d", cookie, applied, err, clamp)
	}
	if most <= clamp || endCwnd == 0 || endCwnd > clamp {
		t.Errorf("clamp set mid-transfer: largest snd_cwnd %d (want above %d before), %d at the end (want 1..%d)", most, clamp, endCwnd, clamp)
	}
	if err := c.Delete(k); err != nil {
		t.Fatal(err)
	}
	got = connectedCwnd(t, dir, back)
	t.Logf("no clamp: largest snd_cwnd %d", got)
	if got <= clamp {
		t.Errorf("unclamped connection: largest snd_cwnd %d, want above %d", got, clamp)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, dir); n != 0 {
		t.Errorf("%d programs attached after Close, want 0", n)
	}
}

// TestAttachFailureLeavesNothing: a cgroup path that is not a cgroup v2
// directory fails with an error naming it and leaves nothing attached.
func TestAttachFailureLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF)")
	}
	bad := t.TempDir()
	_, err := Attach(bad, Options{})
	if err == nil {
		t.Fatal("attach to a plain directory succeeded")
	}
	if want := "attach to cgroup " + bad; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// A key is the pair's 16-byte forms: an IPv4 address and its mapped form
// are one key; a pair of two families or an invalid address is refused.
func TestKeyBytes(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	k4, err := (Key{Local: a("10.0.0.1"), Remote: a("10.0.0.2")}).bytes()
	if err != nil {
		t.Fatal(err)
	}
	if km, err := (Key{Local: a("::ffff:10.0.0.1"), Remote: a("::ffff:10.0.0.2")}).bytes(); err != nil || km != k4 {
		t.Errorf("mapped key %x (%v), want %x", km, err, k4)
	}
	if want := append(append([]byte{}, a("::ffff:10.0.0.1").AsSlice()...), a("::ffff:10.0.0.2").AsSlice()...); string(k4[:]) != string(want) {
		t.Errorf("IPv4 key %x, want the mapped forms %x", k4, want)
	}
	if k6, err := (Key{Local: a("fe80::1%eth0"), Remote: a("fe80::2")}).bytes(); err != nil || k6[0] != 0xfe || k6[31] != 2 {
		t.Errorf("IPv6 key %x (%v)", k6, err)
	}
	for _, k := range []Key{{Local: a("10.0.0.1"), Remote: a("fd00::1")}, {Local: a("::1")}} {
		if _, err := k.bytes(); err == nil {
			t.Errorf("key %v accepted", k)
		}
	}
}

// TestClampBothFamilies: the program clamps an IPv6 connection, an MPTCP
// one over IPv6, and an IPv4 connection on an AF_INET6 socket (mapped
// addresses, as the agent's cross-family connections have) keyed by the
// plain IPv4 pair.
func TestClampBothFamilies(t *testing.T) {
	c, dir, back := attachedCgroup(t, "mpd-bpfclamp6", Options{EverySocket: true})
	const clamp = 4
	for _, lo := range []string{"::1", "127.0.0.1"} {
		a := netip.MustParseAddr(lo)
		if err := c.Set(Key{Local: a, Remote: a}, Limits{CwndSegments: clamp}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		lo    string
		local net.Addr
		mptcp bool
	}{
		{"IPv6", "::1", nil, false},
		{"IPv6 MPTCP subflow", "::1", nil, true},
		{"IPv4 on an AF_INET6 socket", "127.0.0.1", &net.TCPAddr{IP: net.IPv6unspecified}, false},
	} {
		got, _ := dialCwndAt(t, dir, back, tc.lo, tc.local, tc.mptcp, nil, nil)
		t.Logf("%s, clamp %d: largest snd_cwnd %d", tc.name, clamp, got)
		if got == 0 || got > clamp {
			t.Errorf("%s: largest snd_cwnd %d, want 1..%d", tc.name, got, clamp)
		}
	}
	a := netip.MustParseAddr("::1")
	if err := c.Delete(Key{Local: a, Remote: a}); err != nil {
		t.Fatal(err)
	}
	if got, _ := dialCwndAt(t, dir, back, "::1", nil, false, nil, nil); got <= clamp {
		t.Errorf("IPv6 after Delete: largest snd_cwnd %d, want above %d", got, clamp)
	}
}

// TestExitDetaches: a process that attaches and is killed with SIGKILL
// (no Close) leaves nothing attached: the BPF link dies with its last
// file descriptor.
func TestExitDetaches(t *testing.T) {
	if dir := os.Getenv("MPD_BPFCLAMP_CHILD"); dir != "" {
		if _, err := Attach(dir, Options{EverySocket: true}); err != nil {
			fmt.Println("attach:", err)
			os.Exit(3)
		}
		fmt.Println("attached")
		time.Sleep(time.Minute) // killed before
		os.Exit(4)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, cgroups)")
	}
	root := cgroupRoot(t)
	dir := filepath.Join(root, fmt.Sprintf("mpd-bpfclamp-exit-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitDetaches$")
	cmd.Env = append(os.Environ(), "MPD_BPFCLAMP_CHILD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, "attached") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q, %v", line, err)
	}
	if n := attachedCount(t, dir); n != 1 {
		t.Errorf("%d programs attached while the child runs, want 1", n)
	}
	cmd.Process.Kill() // SIGKILL
	cmd.Wait()
	if n := attachedCount(t, dir); n != 0 {
		t.Errorf("%d programs attached after the attaching process was killed, want 0", n)
	}
}

// pacedTransfer sends 4 MB from a connection made in cgroup dir (see
// dialCwndAt) and returns the sender's tcpi_max_pacing_rate (the
// subflow's, for MPTCP), its SO_MAX_PACING_RATE (0 for MPTCP: the
// option on an MPTCP socket is the MPTCP socket's own), the largest
// snd_cwnd seen and the time until everything was acknowledged.
func pacedTransfer(t *testing.T, dir, back, lo string, mptcp bool) (tcpiRate, soRate uint64, cwnd uint32, took time.Duration) {
	t.Helper()
	start := time.Now()
	cwnd, _ = dialCwndAt(t, dir, back, lo, nil, mptcp, nil, func(fd int) {
		for range 500 {
			ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				t.Error(err)
				return
			}
			tcpiRate = ti.Max_pacing_rate
			if ti.Unacked == 0 && ti.Notsent_bytes == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		took = time.Since(start)
		if !mptcp {
			var err error
			if soRate, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE); err != nil {
				t.Error(err)
			}
		}
	})
	return tcpiRate, soRate, cwnd, took
}

// TestPacingTakesEffect: a pair's pacing rate reaches TCP and MPTCP
// subflow sockets of both families (the kernel reports it as the
// socket's maximum pacing rate, and 4 MB at 16 MiB/s take at least half
// of their 0.25 s where loopback takes milliseconds); with a cwnd
// clamp beside it both apply; a pair without limits stays unpaced (the
// kernel's ~0 = unlimited); a rate set while a connection runs reaches
// it and is recorded once.
func TestPacingTakesEffect(t *testing.T) {
	c, dir, back := attachedCgroup(t, "mpd-bpfpace", Options{EverySocket: true})
	const rate = 16 << 20 // bytes/s
	const unlimited = ^uint64(0)
	for _, lo := range []string{"127.0.0.1", "::1"} {
		a := netip.MustParseAddr(lo)
		k := Key{Local: a, Remote: a}
		if err := c.Set(k, Limits{PacingRate: rate}); err != nil {
			t.Fatal(err)
		}
		for _, mptcp := range []bool{false, true} {
			tcpi, so, cwnd, took := pacedTransfer(t, dir, back, lo, mptcp)
			t.Logf("%s MPTCP %v, rate %d: tcpi_max_pacing_rate %d, SO_MAX_PACING_RATE %d, largest cwnd %d, 4 MB in %s", lo, mptcp, rate, tcpi, so, cwnd, took)
			if tcpi != rate || (!mptcp && so != rate) {
				t.Errorf("%s MPTCP %v: max pacing rate %d (tcp_info), %d (getsockopt), want %d", lo, mptcp, tcpi, so, rate)
			}
			if took < 125*time.Millisecond { // half of 4 MB at the rate: the first windows leave at once
				t.Errorf("%s MPTCP %v: 4 MB at %d bytes/s took %s, want at least 125ms (not paced)", lo, mptcp, rate, took)
			}
		}
		// Both limits at once.
		if err := c.Set(k, Limits{CwndSegments: 4, PacingRate: rate}); err != nil {
			t.Fatal(err)
		}
		if tcpi, _, cwnd, _ := pacedTransfer(t, dir, back, lo, false); tcpi != rate || cwnd == 0 || cwnd > 4 {
			t.Errorf("%s, clamp 4 and rate %d: max pacing rate %d, largest cwnd %d", lo, rate, tcpi, cwnd)
		}
		if err := c.Delete(k); err != nil {
			t.Fatal(err)
		}
		if tcpi, so, _, _ := pacedTransfer(t, dir, back, lo, false); tcpi != unlimited || so != unlimited {
			t.Errorf("%s without limits: max pacing rate %d (tcp_info), %d (getsockopt), want unlimited", lo, tcpi, so)
		}
	}
	// Set while the connection runs: applied at an RTT callback, once.
	lo := netip.MustParseAddr("127.0.0.1")
	k := Key{Local: lo, Remote: lo}
	var cookie uint64
	var got uint64
	dialCwnd(t, dir, back, false, func() {
		if err := c.Set(k, Limits{PacingRate: 64 << 20}); err != nil {
			t.Error(err)
		}
	}, func(fd int) {
		var err error
		if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			t.Error(err)
		}
		// The rate is applied at an RTT callback, on an ACK of data sent
		// after Set: wait (up to 5 s) until everything written is
		// acknowledged, then read what the socket has.
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				t.Error(err)
				break
			}
			if ti.Unacked == 0 && ti.Notsent_bytes == 0 {
				break
			}
		}
		if got, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE); err != nil {
			t.Error(err)
		}
	})
	var applied [2]uint32
	if err := c.applied.Lookup(cookie, &applied); err != nil || applied != [2]uint32{0, 64 << 20} || got != 64<<20 {
		t.Errorf("rate set mid-transfer: socket %x applied %v (%v), SO_MAX_PACING_RATE %d, want [0 %d]", cookie, applied, err, got, 64<<20)
	}
	if r, err := c.Refused(); err != nil || r != (Refusals{}) {
		t.Errorf("refusals %+v (%v), want none", r, err)
	}
}

// Set refuses empty limits and a rate the kernel cannot take from BPF.
func TestSetRefusesBadLimits(t *testing.T) {
	c, _, _ := attachedCgroup(t, "mpd-bpfpace-bad", Options{EverySocket: true})
	a := netip.MustParseAddr("127.0.0.1")
	for l, want := range map[Limits]string{
		{}:                                     "use Delete",
		{PacingRate: MaxPacingRate + 1}:        "32-bit",
		{CwndSegments: 1, PacingRate: 1 << 40}: "32-bit",
		{CwndSegments: 1 << 31}:                "segments",
	} {
		if err := c.Set(Key{Local: a, Remote: a}, l); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set(%+v): %v, want an error saying %q", l, err, want)
		}
	}
	ap := netip.AddrPortFrom(a, 1)
	for _, x := range []struct {
		k     Conn
		bytes uint32
		want  string
	}{
		{Conn{Local: ap, Remote: ap, Netns: 1}, 0, "DeleteLowat"},
		{Conn{Local: ap, Remote: ap, Netns: 1}, 1 << 31, "lowat"},
		{Conn{Local: netip.AddrPortFrom(a, 0), Remote: ap, Netns: 1}, 1 << 17, "no port"},
		{Conn{Local: ap, Netns: 1}, 1 << 17, "not an address pair"},
		{Conn{Local: ap, Remote: ap}, 1 << 17, "no network namespace"},
	} {
		if err := c.SetLowat(x.k, x.bytes); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("SetLowat(%v, %d): %v, want an error saying %q", x.k, x.bytes, err, x.want)
		}
	}
}

// A limit the kernel refuses is recorded in the refusal map and not in
// the socket's applied limits, while the other limit of the pair is
// applied and recorded: a cwnd clamp of 2^31 segments (negative as the
// kernel's int: EINVAL), written into the map directly because Set
// refuses it, beside a pacing rate.
func TestRefusalRecorded(t *testing.T) {
	c, dir, back := attachedCgroup(t, "mpd-bpfrefuse", Options{EverySocket: true})
	lo := netip.MustParseAddr("127.0.0.1")
	kb, err := Key{Local: lo, Remote: lo}.bytes()
	if err != nil {
		t.Fatal(err)
	}
	const rate = 64 << 20
	var v [valueSize]byte
	binary.NativeEndian.PutUint32(v[:4], 1<<31)
	binary.NativeEndian.PutUint32(v[4:], rate)
	if err := c.m.Put(kb[:], v[:]); err != nil {
		t.Fatal(err)
	}
	var cookie, got uint64
	dialCwnd(t, dir, back, false, nil, func(fd int) {
		var err error
		if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			t.Error(err)
		}
		if got, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE); err != nil {
			t.Error(err)
		}
	})
	var applied [2]uint32
	if err := c.applied.Lookup(cookie, &applied); err != nil || applied != [2]uint32{0, rate} || got != rate {
		t.Errorf("socket %x applied %v (%v), SO_MAX_PACING_RATE %d; want [0 %d] and the rate", cookie, applied, err, got, rate)
	}
	if r, err := c.Refused(); err != nil || r != (Refusals{Cwnd: unix.EINVAL}) {
		t.Errorf("refusals %+v (%v), want the cwnd clamp refused with EINVAL and no pacing refusal", r, err)
	}
}

// Probe loads and attaches under a cgroup and leaves nothing behind: no
// probe cgroup, nothing attached to the parent; a directory that is not
// a cgroup is an error naming it.
func TestProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, cgroups)")
	}
	root := cgroupRoot(t)
	dir := filepath.Join(root, fmt.Sprintf("mpd-bpfprobe-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup: %v (the probe left a child?)", err)
		}
	})
	// While attached: the program's IDs on the probe's child cgroup (the
	// probe never attaches to dir itself, so counting there proves
	// nothing); after Probe none of them may still be loaded.
	var ids []ebpf.ProgramID
	watched := prober{mkdir: os.Mkdir, attached: func(child string) { ids = attachedIDs(t, child) }}
	// A probe cgroup left by a doctor that was killed (its process gone)
	// is removed by the next probe.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, fmt.Sprintf("mpdetour-probe-%d", gone.Process.Pid))
	if err := os.Mkdir(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(stale) })
	if at, err := watched.probe(dir); err != nil || at != dir {
		t.Fatalf("Probe(%s): %q, %v", dir, at, err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale probe cgroup %s still there: %v", stale, err)
	}
	if len(ids) != 1 {
		t.Fatalf("%d programs attached to the probe's cgroup while it ran, want 1", len(ids))
	}
	if p, err := ebpf.NewProgramFromID(ids[0]); err == nil {
		p.Close()
		t.Errorf("program %d still loaded after the probe (link or program not closed)", ids[0])
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("program %d after the probe: %v", ids[0], err)
	}
	if n := attachedCount(t, dir); n != 0 {
		t.Errorf("%d programs attached after the probe", n)
	}
	if _, err := Probe(t.TempDir()); err == nil {
		t.Error("Probe of a directory that is no cgroup: no error")
	}
	// A cgroup v2 directory the probe cannot write (a read-only mount in
	// a container): the program is loaded, attaching is not tried, and
	// the error says so (the agent, which only opens the directory, may
	// attach); a directory that is no cgroup stays an error.
	readOnly := prober{mkdir: func(string, os.FileMode) error { return &os.PathError{Op: "mkdir", Path: dir, Err: unix.EROFS} }}
	_, err := readOnly.probe(dir)
	var notTried *AttachNotTriedError
	if !errors.As(err, &notTried) || !errors.Is(err, unix.EROFS) {
		t.Errorf("Probe of a read-only cgroup: %v, want AttachNotTriedError", err)
	}
	if _, err := readOnly.probe(t.TempDir()); err == nil || errors.As(err, &notTried) {
		t.Errorf("Probe of a read-only directory that is no cgroup: %v", err)
	}
}
