package bpfclamp

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"golang.org/x/sys/unix"
)

// rttRecord is what the test's reader program saw at a subflow's last
// RTT callback, after the product program ran at the same callback:
// the subflow's TCP_NOTSENT_LOWAT and the fields the formula uses.
type rttRecord struct {
	Lowat, Cwnd, SrttUs, Mss uint32
	// NewSrtt is the callback's args[1]: the srtt (8 x us) the kernel
	// stores after the callback.
	NewSrtt uint32
	_       uint32 // the map value's 24 bytes
}

// rttCounts are the reader's counts: RTT callbacks, and of those the
// ones whose lowat differed from the formula's by at most (Kept) and by
// more than (Off) 1/8 of the lowat.
type rttCounts struct{ Callbacks, Kept, Off uint64 }

// rttEntry is the lowat entry the test wrote, for the reader.
type rttEntry struct {
	Floor, Ceil, MaxRTTUs uint32
	_                     [12]byte
}

// srtt is the smoothed RTT (us) the program uses at the callback.
func (r rttRecord) srtt() uint32 {
	if r.NewSrtt != 0 {
		return r.NewSrtt >> 3
	}
	return r.SrttUs >> 3
}

// rttReader attaches, after the product program, a second sock_ops
// program to cgroup dir that watches every RTT callback: programs
// attached to one cgroup run in the order they were attached, so it sees
// what the product program left at the same callback. Only subflows get
// RTT callbacks here (the product program asks for them, Options{}), and
// the test's one connection is the cgroup's only one. Its map: index 0
// the counts (rttCounts), index 1 the last callback's rttRecord, index 2
// the entry the test wrote (rttEntry): from it the reader computes the
// lowat the formula gives at the callback (the product's own
// instructions, scaledLowat, with the same fields) and counts the
// callbacks whose lowat differs from it (Kept: the program kept a value
// within 1/8) and those where it differs by more than 1/8 of the lowat
// (Off: the program failed to set it).
func rttReader(t *testing.T, dir string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_test_rtt", Type: ebpf.Array, KeySize: 4, ValueSize: 24, MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, offOp, asm.Word),
		asm.JNE.Imm(asm.R2, opRTT, "out"),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
	}
	ins = append(ins, lookup(m, -4)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.StoreImm(asm.RFP, -4, 2, asm.Word),
	)
	ins = append(ins, lookup(m, -4)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R7, 0, "out"), // no entry yet
		asm.LoadMem(asm.R8, asm.R0, 4, asm.Word),
		asm.LoadMem(asm.R9, asm.R0, 8, asm.Word),
	)
	ins = append(ins, scaledLowat("f")...) // r7 = the formula's lowat
	ins = append(ins,
		asm.StoreImm(asm.RFP, -32, 0, asm.Word).WithSymbol("f-want"),
		asm.StoreImm(asm.RFP, -12, 0, asm.Word),
	)
	ins = append(ins, sockopt(asm.FnGetsockopt, solTCP, tcpNotsentLowat, -32)...)
	for i, off := range []int16{offSndCwnd, offSrttUs, offMssCache, offArg1} {
		ins = append(ins, asm.LoadMem(asm.R2, asm.R6, off, asm.Word), asm.StoreMem(asm.RFP, -28+4*int16(i), asm.R2, asm.Word))
	}
	ins = append(ins, asm.StoreImm(asm.RFP, -4, 1, asm.Word))
	ins = append(ins, update(m, -4, -32)...)
	ins = append(ins,
		asm.LoadMem(asm.R2, asm.RFP, -32, asm.Word),
		asm.JEq.Reg(asm.R2, asm.R7, "out"),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.Sub.Reg(asm.R3, asm.R7),
		asm.JGT.Reg(asm.R2, asm.R7, "d"),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.LSh.Imm(asm.R3, 3).WithSymbol("d"),
		asm.Mov.Imm(asm.R8, 8), // Kept
		asm.JLE.Reg(asm.R3, asm.R2, "add"),
		asm.Mov.Imm(asm.R8, 16), // Off
		asm.StoreImm(asm.RFP, -4, 0, asm.Word).WithSymbol("add"),
	)
	ins = append(ins, lookup(m, -4)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Add.Reg(asm.R0, asm.R8),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
	)
	ins = append(ins, asm.Mov.Imm(asm.R0, 1).WithSymbol("out"), asm.Return())
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "mpd_test_rtt", Type: ebpf.SockOps, License: "GPL", Instructions: ins})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return m
}

// scaledWant is the program's formula from one record.
func scaledWant(r rttRecord, l Lowat) uint64 {
	srtt := uint64(r.srtt())
	T := uint64(l.MaxRTT / time.Microsecond)
	if l.Ceil == 0 || T == 0 {
		return uint64(l.Floor)
	}
	if srtt == 0 || srtt >= T {
		return uint64(l.Floor)
	}
	w := min(uint64(r.Cwnd)*uint64(r.Mss), 1<<32-1)
	return min(max(w*(T-srtt)/srtt, uint64(l.Floor)), uint64(l.Ceil))
}

// shapedConn opens an MPTCP connection from this process (while in
// cgroup dir) over a veth pair shaped to 20 Mbit/s with a 64 KiB tbf
// queue (a smoothed RTT of some ms, steadier than loopback's), to a
// listener that discards; namespaces and sockets go when the test ends.
func shapedConn(t *testing.T, dir, back string) *net.TCPConn {
	t.Helper()
	snd := netnstest.New(t, "mpdlr")
	rcv := netnstest.New(t, "mpdlr")
	sIf, _ := netnstest.Link(t, snd, "10.77.10.1/24", rcv, "10.77.10.2/24")
	snd.Tbf(t, sIf, 20e6, 64<<10)
	return nsMPTCPConn(t, snd, rcv, dir, back, nil, "10.77.10.2:0")
}

// TestLowatScaledFollowsRTT: on the real kernel, one MPTCP subflow over
// a shaped veth whose lowat entry is rewritten between bursts of writes, as
// the agent does at its probe rounds: scaled with a connection RTT (T)
// far above the subflow's own, its TCP_NOTSENT_LOWAT ends at the
// ceiling; with T = 0 (no measurement yet) at the floor; with T 10 times
// its own smoothed RTT, between them and within 1/8 of
// cwnd x mss x (T - srtt) / srtt from the subflow's own fields at its
// last RTT callback (its MSS that of tcp_info). At every RTT callback of
// the test the subflow's lowat is within 1/8 of the formula's (a second
// program computes it with the same fields), at some the program kept a
// value that differed (the hysteresis), and it set the lowat at fewer
// than half of the callbacks (observed: 9-25 settings in 195-230
// callbacks).
func TestLowatScaledFollowsRTT(t *testing.T) {
	testenv.MPTCP(t)
	c, dir, back := attachedCgroup(t, "mpd-bpflowrtt", Options{})
	rec := rttReader(t, dir)
	conn := shapedConn(t, dir, back)
	k := connOf(conn)
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// burst writes for 300 ms, waits until every byte is acknowledged
	// (no more callbacks then) and returns the last callback's record and
	// the subflow's tcp_info (an MPTCP socket answers with its first
	// subflow's).
	burst := func() (rttRecord, *unix.TCPInfo) {
		t.Helper()
		stop := netnstest.KeepWriting(conn)
		time.Sleep(300 * time.Millisecond)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		var ti *unix.TCPInfo
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var gerr error
			if err := raw.Control(func(fd uintptr) { ti, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
				t.Fatal(err, gerr)
			}
			if ti.Unacked == 0 && ti.Notsent_bytes == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the data was not acknowledged within 5 s (unacked %d, notsent %d)", ti.Unacked, ti.Notsent_bytes)
			}
		}
		var r rttRecord
		if err := rec.Lookup(uint32(1), &r); err != nil {
			t.Fatal(err)
		}
		return r, ti
	}
	// A ceiling far above the subflow's window (a 4 MB send buffer), so
	// that T = 10 x the subflow's RTT stays below it whatever the RTT
	// does under load.
	const floor, ceil = 16 << 10, 64 << 20
	check := func(name string, l Lowat) rttRecord {
		t.Helper()
		if err := c.SetLowatScaled(k, l); err != nil {
			t.Fatal(err)
		}
		if err := rec.Update(uint32(2), rttEntry{Floor: l.Floor, Ceil: l.Ceil, MaxRTTUs: uint32(l.MaxRTT / time.Microsecond)}, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
		r, ti := burst()
		want := scaledWant(r, l)
		t.Logf("%s (T %v): lowat %d, formula %d (cwnd %d, mss %d, srtt %d us, %d us before the callback); after the last ACK tcp_info cwnd %d, mss %d, srtt %d us",
			name, l.MaxRTT, r.Lowat, want, r.Cwnd, r.Mss, r.srtt(), r.SrttUs>>3, ti.Snd_cwnd, ti.Snd_mss, ti.Rtt)
		// The callback comes once per round trip; the subflow's later
		// ACKs move its cwnd and srtt on, not its MSS.
		if r.Mss != ti.Snd_mss || r.Cwnd == 0 || r.srtt() == 0 {
			t.Errorf("%s: the last callback saw mss %d (tcp_info: %d), cwnd %d, srtt %d us", name, r.Mss, ti.Snd_mss, r.Cwnd, r.srtt())
		}
		d := int64(r.Lowat) - int64(want)
		if d < 0 {
			d = -d
		}
		if d*8 > int64(r.Lowat) {
			t.Errorf("%s: TCP_NOTSENT_LOWAT %d, want %d within 1/8", name, r.Lowat, want)
		}
		return r
	}
	if r := check("T far above the subflow's RTT", Lowat{Floor: floor, Ceil: ceil, MaxRTT: 100 * time.Second}); r.Lowat != ceil {
		t.Errorf("TCP_NOTSENT_LOWAT %d, want the ceiling %d", r.Lowat, ceil)
	}
	if r := check("no RTT", Lowat{Floor: floor, Ceil: ceil}); r.Lowat != floor {
		t.Errorf("TCP_NOTSENT_LOWAT %d, want the floor %d", r.Lowat, floor)
	}
	// T 10 x the RTT the subflow had: the formula lands between floor
	// and ceiling unless the RTT moves by a factor of 5 or more before
	// the last callback (under load it can: then again, 3 times at most).
	r, _ := burst()
	for try := 1; ; try++ {
		between := Lowat{Floor: floor, Ceil: ceil, MaxRTT: time.Duration(r.srtt()) * 10 * time.Microsecond}
		r = check("T 10 x the subflow's RTT", between)
		want := scaledWant(r, between)
		if want > floor && want < ceil {
			break
		}
		if try == 3 {
			t.Errorf("the formula gave %d, not between floor %d and ceiling %d, in %d tries: the case is not tested", want, floor, ceil, try)
			break
		}
	}
	var n rttCounts
	if err := rec.Lookup(uint32(0), &n); err != nil {
		t.Fatal(err)
	}
	sets, err := c.LowatSets()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TCP_NOTSENT_LOWAT set %d times in %d RTT callbacks; at %d callbacks the formula differed from the subflow's lowat by at most 1/8 and the program kept it, at %d by more", sets, n.Callbacks, n.Kept, n.Off)
	// At every callback the subflow's lowat was within 1/8 of the
	// formula's; the hysteresis kept a value instead of setting a new one
	// at least once; and the program did not set the lowat at most
	// callbacks (the kernel's RTT callback comes once per round trip;
	// a fixed cap or the ceiling is set once).
	if n.Off != 0 {
		t.Errorf("at %d of %d RTT callbacks the lowat differed from the formula's by more than 1/8", n.Off, n.Callbacks)
	}
	if n.Kept == 0 || sets < 3 || sets*2 > n.Callbacks {
		t.Errorf("the program set TCP_NOTSENT_LOWAT %d times in %d RTT callbacks and kept a value within 1/8 at %d: want at least once per entry change, at most at half of the callbacks, and kept values", sets, n.Callbacks, n.Kept)
	}
	if rf, err := c.Refused(); err != nil || rf != (Refusals{}) {
		t.Errorf("refusals %+v (%v), want none", rf, err)
	}
}

// SetLowatScaled refuses what the program cannot use.
func TestSetLowatScaledRejects(t *testing.T) {
	c, _, _ := attachedCgroup(t, "mpd-bpflowrej", Options{})
	k := Conn{Local: netip.MustParseAddrPort("10.0.0.1:1"), Remote: netip.MustParseAddrPort("10.0.0.2:2"), Netns: 1}
	for _, l := range []Lowat{
		{},
		{Floor: 1 << 31},
		{Floor: 100, Ceil: 99, MaxRTT: time.Second},
		{Floor: 100, Ceil: 1 << 31, MaxRTT: time.Second},
		{Floor: 100, Ceil: 200, MaxRTT: -time.Second},
		{Floor: 100, Ceil: 200, MaxRTT: MaxLowatRTT + time.Microsecond},
	} {
		if err := c.SetLowatScaled(k, l); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	if err := c.SetLowatScaled(k, Lowat{Floor: 100, Ceil: 100, MaxRTT: MaxLowatRTT}); err != nil {
		t.Error(err)
	}
}
