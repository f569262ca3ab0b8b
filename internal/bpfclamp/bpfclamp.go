// Package bpfclamp clamps the congestion window of chosen TCP sockets
// (MPTCP subflows among them) with a BPF sock_ops program attached to a
// cgroup v2 directory. The kernel offers no per-subflow cwnd knob to user
// space: TCP_CONGESTION and buffer options on an MPTCP socket apply to
// every subflow, while bpf_setsockopt(SOL_TCP, TCP_BPF_SNDCWND_CLAMP) from
// sock_ops acts on one subflow socket (subflows inherit the MPTCP socket's
// cgroup; see the kernel selftest
// tools/testing/selftests/bpf/progs/mptcp_subflow.c).
//
// The program looks up each socket that becomes established in a hash map
// keyed by (local address, remote address), each 16 bytes in network byte
// order, IPv4 in its IPv4-mapped IPv6 form (::ffff:a.b.c.d): an AF_INET
// socket's addresses are mapped by the program, an AF_INET6 socket's are
// taken as they are (an IPv4 connection on an AF_INET6 socket has mapped
// addresses already), so one key matches a pair whatever the socket's
// family. It applies the clamp (segments) it finds. It also asks the kernel
// for the socket's RTT callback (BPF_SOCK_OPS_RTT_CB_FLAG) and looks the
// pair up again on every one, so that a clamp the caller writes later (Set)
// reaches sockets already established within one round trip. A second map
// (LRU, keyed by socket cookie) remembers the clamp last applied to each
// socket: bpf_setsockopt(TCP_BPF_SNDCWND_CLAMP) also sets ssthresh, so it
// is called once per change, never per ACK (the congestion control keeps
// its own ssthresh between changes). Delete stops further changes; a
// socket keeps the clamp it has.
//
// The program is assembled in Go with cilium/ebpf's asm package rather than
// compiled from C: the build hosts have no clang, and the program is a
// dozen instructions.
//
// Attach uses a BPF link: closing it (Close, or the process exiting)
// detaches the program, so nothing stays attached after the owner is gone.
package bpfclamp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// Offsets in struct bpf_sock_ops (include/uapi/linux/bpf.h).
const (
	offOp        = 0
	offFamily    = 20
	offRemoteIP  = 24
	offLocalIP   = 28
	offRemoteIP6 = 32 // __u32 remote_ip6[4]
	offLocalIP6  = 48 // __u32 local_ip6[4]
	afInet6      = 10
)

// mappedWord is bytes 8-11 of an IPv4-mapped IPv6 address (00 00 ff ff)
// read as one native-endian word, for the program's stores.
var mappedWord = int64(int32(binary.NativeEndian.Uint32([]byte{0, 0, 0xff, 0xff})))

// sock_ops operations and option names the program uses
// (include/uapi/linux/bpf.h, include/uapi/linux/tcp.h).
const (
	opActiveEstablished  = 4      // BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
	opPassiveEstablished = 5      // BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
	opRTT                = 12     // BPF_SOCK_OPS_RTT_CB
	rttCBFlag            = 1 << 3 // BPF_SOCK_OPS_RTT_CB_FLAG
	solTCP               = 6
	tcpBPFSndCwndClamp   = 1002
)

// MaxEntries bounds the map (local, remote) pairs.
const MaxEntries = 4096

// maxSockets bounds the per-socket memory of applied clamps (LRU: the
// oldest sockets' entries go first; a socket that lost its entry gets the
// clamp set again, which is harmless).
const maxSockets = 65536

// Key is one socket's address pair, of either family (an IPv4 address
// and its IPv4-mapped form are the same key).
type Key struct{ Local, Remote netip.Addr }

func (k Key) bytes() ([32]byte, error) {
	var b [32]byte
	if !k.Local.IsValid() || !k.Remote.IsValid() {
		return b, fmt.Errorf("bpfclamp: %v -> %v: not an address pair", k.Local, k.Remote)
	}
	if k.Local.Unmap().Is4() != k.Remote.Unmap().Is4() {
		return b, fmt.Errorf("bpfclamp: %v -> %v: the addresses differ in family (no socket has such a pair)", k.Local, k.Remote)
	}
	// As16 of an IPv4 address is its IPv4-mapped form; the zone of a
	// link-local address is not part of the socket's addresses.
	l, r := k.Local.Unmap().As16(), k.Remote.Unmap().As16()
	copy(b[:16], l[:])
	copy(b[16:], r[:])
	return b, nil
}

// Clamper is the loaded and attached program with its map.
type Clamper struct {
	m       *ebpf.Map
	applied *ebpf.Map
	prog    *ebpf.Program
	l       link.Link
}

// instructions returns the program reading its limits from m and
// remembering what it applied per socket in applied.
//
// Stack: fp-32 key (local 16 bytes, remote 16 bytes), fp-36 clamp,
// fp-48 cookie.
func instructions(m, applied *ebpf.Map) asm.Instructions {
	return slices.Concat(asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // r6 = ctx
		asm.LoadMem(asm.R2, asm.R6, offOp, asm.Word),
		asm.JEq.Imm(asm.R2, opRTT, "lookup"),
		asm.JEq.Imm(asm.R2, opActiveEstablished, "established"),
		asm.JEq.Imm(asm.R2, opPassiveEstablished, "established"),
		asm.Ja.Label("out"),
		// Every established socket gets RTT callbacks: its clamp may be
		// decided after it connected.
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("established"),
		asm.Mov.Imm(asm.R2, rttCBFlag),
		asm.FnSockOpsCbFlagsSet.Call(),
		asm.LoadMem(asm.R2, asm.R6, offFamily, asm.Word).WithSymbol("lookup"),
		asm.JEq.Imm(asm.R2, afInet6, "v6"),
		// AF_INET: the IPv4-mapped forms.
		asm.StoreImm(asm.RFP, -32, 0, asm.Word),
		asm.StoreImm(asm.RFP, -28, 0, asm.Word),
		asm.StoreImm(asm.RFP, -24, mappedWord, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, offLocalIP, asm.Word),
		asm.StoreMem(asm.RFP, -20, asm.R2, asm.Word),
		asm.StoreImm(asm.RFP, -16, 0, asm.Word),
		asm.StoreImm(asm.RFP, -12, 0, asm.Word),
		asm.StoreImm(asm.RFP, -8, mappedWord, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, offRemoteIP, asm.Word),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
		asm.Ja.Label("key"),
	}, copyWords(offLocalIP6, -32, "v6"), copyWords(offRemoteIP6, -16, ""),
		withSymbol(lookup(m, -32), "key"), asm.Instructions{
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.LoadMem(asm.R7, asm.R0, 0, asm.Word), // r7 = clamp
			asm.JEq.Imm(asm.R7, 0, "out"),
			asm.StoreMem(asm.RFP, -36, asm.R7, asm.Word),
			// Already applied to this socket?
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.FnGetSocketCookie.Call(),
			asm.StoreMem(asm.RFP, -48, asm.R0, asm.DWord),
		}, lookup(applied, -48), asm.Instructions{
			asm.JEq.Imm(asm.R0, 0, "apply"),
			asm.LoadMem(asm.R2, asm.R0, 0, asm.Word),
			asm.JEq.Reg(asm.R2, asm.R7, "out"),
			asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("apply"),
			asm.Mov.Imm(asm.R2, solTCP),
			asm.Mov.Imm(asm.R3, tcpBPFSndCwndClamp),
			asm.Mov.Reg(asm.R4, asm.RFP),
			asm.Add.Imm(asm.R4, -36),
			asm.Mov.Imm(asm.R5, 4),
			asm.FnSetsockopt.Call(),
			asm.JNE.Imm(asm.R0, 0, "out"), // refused: try again on the next callback
			asm.LoadMapPtr(asm.R1, applied.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -48),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -36),
			asm.Mov.Imm(asm.R4, 0), // BPF_ANY
			asm.FnMapUpdateElem.Call(),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		})
}

// copyWords copies the 16-byte address at ctx+off (r6 = ctx) to fp+dst,
// one word at a time (the context allows 4-byte reads of it); the first
// instruction carries sym when set.
func copyWords(off int16, dst int16, sym string) asm.Instructions {
	var out asm.Instructions
	for i := int16(0); i < 16; i += 4 {
		out = append(out, asm.LoadMem(asm.R2, asm.R6, off+i, asm.Word), asm.StoreMem(asm.RFP, dst+i, asm.R2, asm.Word))
	}
	if sym != "" {
		out = withSymbol(out, sym)
	}
	return out
}

// withSymbol labels the first of ins.
func withSymbol(ins asm.Instructions, sym string) asm.Instructions {
	ins[0] = ins[0].WithSymbol(sym)
	return ins
}

// lookup calls bpf_map_lookup_elem(m, fp+key): r0 = the value or NULL.
func lookup(m *ebpf.Map, key int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.FnMapLookupElem.Call(),
	}
}

// Attach loads the program and attaches it to the cgroup v2 directory
// cgroupPath. On any failure nothing stays loaded or attached.
func Attach(cgroupPath string) (_ *Clamper, err error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_clamp", Type: ebpf.Hash, KeySize: 32, ValueSize: 4, MaxEntries: MaxEntries})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: create map: %w", err)
	}
	c := &Clamper{m: m}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	c.applied, err = ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_clamp_sk", Type: ebpf.LRUHash, KeySize: 8, ValueSize: 4, MaxEntries: maxSockets})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: create map: %w", err)
	}
	c.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "mpd_clamp", Type: ebpf.SockOps, License: "GPL", Instructions: instructions(m, c.applied)})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: load sock_ops program: %w", err)
	}
	c.l, err = link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: c.prog})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: attach to cgroup %s: %w", cgroupPath, err)
	}
	return c, nil
}

// Set clamps the cwnd of sockets with this address pair to segs segments
// (segs > 0): sockets established from now on, and established ones at
// their next RTT callback.
func (c *Clamper) Set(k Key, segs uint32) error {
	if segs == 0 {
		return errors.New("bpfclamp: a clamp of 0 segments: use Delete to remove one")
	}
	kb, err := k.bytes()
	if err != nil {
		return err
	}
	var v [4]byte
	binary.NativeEndian.PutUint32(v[:], segs)
	if err := c.m.Put(kb[:], v[:]); err != nil {
		return fmt.Errorf("bpfclamp: set %v -> %v: %w", k.Local, k.Remote, err)
	}
	return nil
}

// Delete removes the clamp of an address pair (absent: no error).
func (c *Clamper) Delete(k Key) error {
	kb, err := k.bytes()
	if err != nil {
		return err
	}
	if err := c.m.Delete(kb[:]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpfclamp: delete %v -> %v: %w", k.Local, k.Remote, err)
	}
	return nil
}

// Close detaches the program and frees it and its map.
func (c *Clamper) Close() error {
	var errs []error
	if c.l != nil {
		errs = append(errs, c.l.Close())
		c.l = nil
	}
	if c.prog != nil {
		errs = append(errs, c.prog.Close())
		c.prog = nil
	}
	if c.m != nil {
		errs = append(errs, c.m.Close())
		c.m = nil
	}
	if c.applied != nil {
		errs = append(errs, c.applied.Close())
		c.applied = nil
	}
	return errors.Join(errs...)
}
