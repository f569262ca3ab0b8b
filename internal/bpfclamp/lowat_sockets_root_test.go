package bpfclamp

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"golang.org/x/sys/unix"
)

// loopbackConn opens a loopback connection (MPTCP when mptcp) while this
// process is in cgroup dir (back: where it returns), to a listener that
// reads and discards; both are closed when the test ends.
func loopbackConn(t *testing.T, dir, back string, mptcp bool) *net.TCPConn {
	t.Helper()
	var lc net.ListenConfig
	lc.SetMultipathTCP(mptcp)
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
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
	var d net.Dialer
	d.SetMultipathTCP(mptcp)
	c, err := d.Dial("tcp", ln.Addr().String())
	if err2 := os.WriteFile(filepath.Join(back, "cgroup.procs"), pid, 0o644); err2 != nil {
		t.Fatal(err2)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if mptcp {
		if ok, err := c.(*net.TCPConn).MultipathTCP(); err != nil || !ok {
			t.Fatalf("the connection fell back to TCP (MPTCP %v, %v): is net.mptcp.enabled on?", ok, err)
		}
	}
	return c.(*net.TCPConn)
}

// connOf is c's 4-tuple (an MPTCP socket's are its first subflow's) in
// its namespace.
func connOf(c net.Conn) Conn {
	k := Conn{Local: c.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		panic(err)
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) { k.Netns, cerr = SocketNetnsCookie(int(fd)) }); err != nil {
		panic(err)
	}
	if cerr != nil {
		panic(cerr)
	}
	return k
}

// writeChunks writes n chunks of 64 KiB to c.
func writeChunks(t *testing.T, c net.Conn, n int) {
	t.Helper()
	buf := make([]byte, 64<<10)
	for range n {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
}

func sockLowat(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// waitLowatSets writes to conn, 64 KiB at a time, until the program has
// set TCP_NOTSENT_LOWAT want times (5 s at most, and never more).
func waitLowatSets(t *testing.T, c *Clamper, want uint64, conn net.Conn) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := c.LowatSets()
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if n > want || time.Now().After(deadline) {
			t.Fatalf("the program set TCP_NOTSENT_LOWAT %d times, want %d", n, want)
		}
		writeChunks(t, conn, 1)
	}
}

// TestLowatLeavesPlainTCP: a plain TCP socket whose 4-tuple has a lowat
// entry (written after it connected, with RTT callbacks on every socket
// as for cwnd_clamp users) keeps the lowat its application set: the lowat
// is for MPTCP subflows only.
func TestLowatLeavesPlainTCP(t *testing.T) {
	c, dir, back := attachedCgroup(t, "mpd-bpflwplain", Options{EverySocket: true})
	conn := loopbackConn(t, dir, back, false)
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	const own = 16384
	raw.Control(func(fd uintptr) {
		if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, own); err != nil {
			t.Fatal(err)
		}
	})
	writeChunks(t, conn, 4)
	if err := c.SetLowat(connOf(conn), 128<<10); err != nil {
		t.Fatal(err)
	}
	writeChunks(t, conn, 64)
	if v := sockLowat(t, conn); v != own {
		t.Errorf("the application's TCP_NOTSENT_LOWAT %d became %d", own, v)
	}
	if n, err := c.LowatSets(); err != nil || n != 0 {
		t.Errorf("the program set TCP_NOTSENT_LOWAT %d times (%v), want 0: no subflow here", n, err)
	}
}

// TestLowatAfterConnect: an MPTCP subflow whose pair's entry is written
// after it connected (as the agent does: it learns the subflow from the
// path manager's events, after the ESTABLISHED callback) gets the lowat
// at an RTT callback, once (the program reads the subflow's value back
// and compares, it does not set it per ACK), and again when the entry
// changes to another value (the read-back sees the subflow's differs, as
// after the kernel's reset to UINT_MAX).
func TestLowatAfterConnect(t *testing.T) {
	testenv.MPTCP(t)
	c, dir, back := attachedCgroup(t, "mpd-bpflwlate", Options{})
	conn := loopbackConn(t, dir, back, true)
	writeChunks(t, conn, 4)
	k := connOf(conn)
	waitSets := func(want uint64) { t.Helper(); waitLowatSets(t, c, want, conn) }
	if err := c.SetLowat(k, 64<<10); err != nil {
		t.Fatal(err)
	}
	waitSets(1)
	writeChunks(t, conn, 32)
	waitSets(1)
	if err := c.SetLowat(k, 128<<10); err != nil {
		t.Fatal(err)
	}
	waitSets(2)
	writeChunks(t, conn, 32)
	waitSets(2)
	if r, err := c.Refused(); err != nil || r != (Refusals{}) {
		t.Errorf("refusals %+v (%v), want none", r, err)
	}
}

// TestPlainTCPNoCallbacks: without EverySocket (the agent with only
// subflow_lowat), a plain TCP socket asks for no RTT callback, so a cwnd
// clamp written after it connected never reaches it (nothing recorded
// for it); an MPTCP subflow on the same pair does get it.
func TestPlainTCPNoCallbacks(t *testing.T) {
	testenv.MPTCP(t)
	c, dir, back := attachedCgroup(t, "mpd-bpflwcb", Options{})
	lo := netip.MustParseAddr("127.0.0.1")
	k := Key{Local: lo, Remote: lo}
	applied := func() int {
		n := 0
		var key uint64
		var v [2]uint32
		it := c.applied.Iterate()
		for it.Next(&key, &v) {
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	plain := loopbackConn(t, dir, back, false)
	writeChunks(t, plain, 4)
	if err := c.Set(k, Limits{CwndSegments: 8}); err != nil {
		t.Fatal(err)
	}
	writeChunks(t, plain, 64)
	if n := applied(); n != 0 {
		t.Errorf("a plain TCP socket connected before its entry got the clamp (%d sockets recorded): it has RTT callbacks", n)
	}
	if err := c.Delete(k); err != nil {
		t.Fatal(err)
	}
	sub := loopbackConn(t, dir, back, true)
	writeChunks(t, sub, 4)
	if err := c.Set(k, Limits{CwndSegments: 8}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for applied() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("an MPTCP subflow connected before its entry never got the clamp: no RTT callbacks")
		}
		writeChunks(t, sub, 1)
	}
}

// TestLowatOnlyItsSubflow: the lowat is keyed by the 4-tuple, so a second
// MPTCP connection between the same addresses (another port: another
// application, or one outside the agent's selectors) does not get it.
func TestLowatOnlyItsSubflow(t *testing.T) {
	testenv.MPTCP(t)
	c, dir, back := attachedCgroup(t, "mpd-bpflwport", Options{})
	mine := loopbackConn(t, dir, back, true)
	other := loopbackConn(t, dir, back, true)
	writeChunks(t, mine, 2)
	writeChunks(t, other, 2)
	if err := c.SetLowat(connOf(mine), 64<<10); err != nil {
		t.Fatal(err)
	}
	waitLowatSets(t, c, 1, mine)
	writeChunks(t, other, 64)
	if n, err := c.LowatSets(); err != nil || n != 1 {
		t.Errorf("after the other connection's writes the program set TCP_NOTSENT_LOWAT %d times (%v), want 1", n, err)
	}
}

// nsLoopbackConn opens an MPTCP connection on ns's loopback from
// 127.0.0.1:lport to a listener at 127.0.0.1:rport that discards what it
// reads, while this process is in cgroup dir (back: where it returns);
// all closed when the test ends.
func nsLoopbackConn(t *testing.T, ns *netnstest.NS, dir, back string, lport, rport int) *net.TCPConn {
	t.Helper()
	return nsMPTCPConn(t, ns, ns, dir, back, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: lport}, fmt.Sprintf("127.0.0.1:%d", rport))
}

// nsMPTCPConn opens an MPTCP connection from namespace snd (from laddr,
// when set) to a listener at raddr in namespace rcv that discards what
// it reads, while this process is in cgroup dir (back: where it
// returns); all closed when the test ends.
func nsMPTCPConn(t *testing.T, snd, rcv *netnstest.NS, dir, back string, laddr *net.TCPAddr, raddr string) *net.TCPConn {
	t.Helper()
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := rcv.Listen(lc, "tcp", raddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) {
		defer c.Close()
		io.Copy(io.Discard, c)
	})
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{}
	if laddr != nil {
		d.LocalAddr = laddr
	}
	d.SetMultipathTCP(true)
	c, err := snd.Dial(&d, "tcp", ln.Addr().String())
	if err2 := os.WriteFile(filepath.Join(back, "cgroup.procs"), pid, 0o644); err2 != nil {
		t.Fatal(err2)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if ok, err := c.(*net.TCPConn).MultipathTCP(); err != nil || !ok {
		t.Fatalf("the connection fell back to TCP (MPTCP %v, %v)", ok, err)
	}
	return c.(*net.TCPConn)
}

// TestLowatOnlyItsNamespace: a program attached where it sees several
// network namespaces (on a host: the cgroup v2 root) meets the same
// 4-tuple in each; the lowat written for one namespace's subflow is
// keyed by that namespace's cookie and leaves the other's alone.
func TestLowatOnlyItsNamespace(t *testing.T) {
	testenv.MPTCP(t)
	c, dir, back := attachedCgroup(t, "mpd-bpflwns", Options{})
	a, b := netnstest.New(t, "mpdlwa"), netnstest.New(t, "mpdlwb")
	const lport, rport = 40123, 40124
	ca := nsLoopbackConn(t, a, dir, back, lport, rport)
	cb := nsLoopbackConn(t, b, dir, back, lport, rport)
	ka, kb := connOf(ca), connOf(cb)
	if ka.Local != kb.Local || ka.Remote != kb.Remote || ka.Netns == kb.Netns {
		t.Fatalf("want the same 4-tuple in two namespaces: %+v, %+v", ka, kb)
	}
	if own, err := NetnsCookie(); err != nil || own == ka.Netns || own == kb.Netns {
		t.Fatalf("this namespace's cookie %d (%v) vs %d, %d", own, err, ka.Netns, kb.Netns)
	}
	var aCookie uint64
	if err := a.Do(func() (err error) { aCookie, err = NetnsCookie(); return err }); err != nil || aCookie != ka.Netns {
		t.Fatalf("NetnsCookie in %s: %d (%v), its socket's %d", a.Name, aCookie, err, ka.Netns)
	}
	// Nothing written on a's connection before the check below: its
	// subflow gets no RTT callback (no ACK) until then.
	writeChunks(t, cb, 2)
	if err := c.SetLowat(ka, 64<<10); err != nil {
		t.Fatal(err)
	}
	writeChunks(t, cb, 64)
	if n, err := c.LowatSets(); err != nil || n != 0 {
		t.Fatalf("after writes in %s only, the program set TCP_NOTSENT_LOWAT %d times (%v), want 0: the entry is %s's", b.Name, n, err, a.Name)
	}
	waitLowatSets(t, c, 1, ca)
	writeChunks(t, cb, 64)
	if n, err := c.LowatSets(); err != nil || n != 1 {
		t.Errorf("after more writes in %s the program set TCP_NOTSENT_LOWAT %d times (%v), want 1", b.Name, n, err)
	}
}

// TestKeepsOtherProgramsFlags: bpf_sock_ops_cb_flags_set replaces a
// socket's callback flags; a program of the same cgroup that ran first
// and asked for state callbacks keeps getting them after ours asked for
// RTT callbacks.
func TestKeepsOtherProgramsFlags(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, cgroups)")
	}
	root := cgroupRoot(t)
	back := ownCgroup(t, root)
	dir := filepath.Join(root, fmt.Sprintf("mpd-bpfflags-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	// The other program: state callbacks for every established socket,
	// counted at index 0.
	n, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	other, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SockOps, License: "GPL", Instructions: slices.Concat(asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, offOp, asm.Word),
		asm.JEq.Imm(asm.R2, opActiveEstablished, "est"),
		asm.JEq.Imm(asm.R2, opStateCB, "state"),
		asm.Ja.Label("out"),
		asm.LoadMem(asm.R2, asm.R6, offCbFlags, asm.Word).WithSymbol("est"),
		asm.Or.Imm(asm.R2, stateCBFlag),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnSockOpsCbFlagsSet.Call(),
		asm.Ja.Label("out"),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word).WithSymbol("state"),
	}, lookup(n, -4), asm.Instructions{
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
		asm.Return(),
	})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: ebpf.AttachCGroupSockOps, Program: other})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c, err := Attach(dir, Options{EverySocket: true}) // runs after the other
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	conn := loopbackConn(t, dir, back, false)
	writeChunks(t, conn, 1)
	conn.Close()
	var got uint64
	for deadline := time.Now().Add(3 * time.Second); got == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := n.Lookup(uint32(0), &got); err != nil {
			t.Fatal(err)
		}
	}
	if got == 0 {
		t.Error("the other program's state callbacks stopped: our program replaced its flags")
	}
}

// The state callback (include/uapi/linux/bpf.h), for the test's other
// program.
const (
	opStateCB   = 10     // BPF_SOCK_OPS_STATE_CB
	stateCBFlag = 1 << 2 // BPF_SOCK_OPS_STATE_CB_FLAG
)
