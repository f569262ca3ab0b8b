// Package bpfclamp clamps the congestion window, caps the pacing rate and
// bounds the unsent bytes (TCP_NOTSENT_LOWAT) of chosen TCP sockets (MPTCP
// subflows among them) with a BPF sock_ops program attached to a cgroup
// v2 directory. The kernel offers no
// per-subflow knob to user space: TCP_CONGESTION and buffer options on an
// MPTCP socket apply to every subflow, while bpf_setsockopt(SOL_TCP,
// TCP_BPF_SNDCWND_CLAMP) and bpf_setsockopt(SOL_SOCKET,
// SO_MAX_PACING_RATE) from sock_ops act on one subflow socket (subflows
// inherit the MPTCP socket's cgroup; see the kernel selftest
// tools/testing/selftests/bpf/progs/mptcp_subflow.c). A maximum pacing
// rate also switches on TCP's internal pacing of the socket
// (sk_pacing_status), so no fq qdisc is needed.
//
// The program looks up each socket that becomes established in a hash map
// keyed by (local address, remote address), each 16 bytes in network byte
// order, IPv4 in its IPv4-mapped IPv6 form (::ffff:a.b.c.d): an AF_INET
// socket's addresses are mapped by the program, an AF_INET6 socket's are
// taken as they are (an IPv4 connection on an AF_INET6 socket has mapped
// addresses already), so one key matches a pair whatever the socket's
// family. It applies the limits it finds (Limits: a clamp in segments, a
// pacing rate in bytes/s). It also asks the kernel for the socket's RTT
// callback (BPF_SOCK_OPS_RTT_CB_FLAG) and looks the pair up again on every
// one, so that limits the caller writes later (Set) reach sockets already
// established within one round trip: every TCP socket's with
// Options.EverySocket, else MPTCP subflows' only. A second map (LRU, keyed
// by socket cookie) remembers the limits last applied to each socket, so
// that each is set once per change, never per ACK: bpf_setsockopt
// (TCP_BPF_SNDCWND_CLAMP) also sets ssthresh (the congestion control keeps
// its own ssthresh between changes). Delete stops further changes; a
// socket keeps the limits it has.
//
// A third map, keyed by the 4-tuple (addresses as above and both ports)
// and the socket's network namespace (its cookie, bpf_get_netns_cookie:
// a program attached at the cgroup v2 root sees the sockets of every
// namespace, and two namespaces may hold the same 4-tuple), holds notsent
// lowats (SetLowat) for MPTCP subflows only: the program
// checks bpf_skc_to_mptcp_sock first, so plain TCP sockets, even of the
// same addresses and ports, keep their application's TCP_NOTSENT_LOWAT.
// The lowat matters on MPTCP subflows: the kernel sets each subflow's to
// UINT_MAX (mptcp_sockopt_sync_locked), so a subflow takes data from the
// MPTCP socket until its send buffer (MBs) is full, and the MPTCP
// scheduler, which stops pushing into a subflow whose unsent bytes exceed
// its lowat (sk_stream_memory_free), never keeps it at the MPTCP level
// where a faster subflow could take it. An entry is fixed (one size) or
// scaled to the subflow's RTT (SetLowatScaled): the bytes the subflow
// sends while the connection's slowest subflow makes one round trip,
// between a floor and a ceiling.
//
// A fourth map (counts) holds the kernel's last refusal of each kind
// (Refused) and the number of lowat settings (LowatSets): a kernel that
// does not accept SO_MAX_PACING_RATE from BPF says so there, and the
// caller can fall back.
//
// The program is assembled in Go with cilium/ebpf's asm package rather than
// compiled from C: the build hosts have no clang, and the program is a
// few dozen instructions.
//
// Attach uses a BPF link: closing it (Close, or the process exiting)
// detaches the program, so nothing stays attached after the owner is gone.
package bpfclamp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Offsets in struct bpf_sock_ops (include/uapi/linux/bpf.h).
const (
	offOp         = 0
	offArg1       = 8 // __u32 args[1]: at BPF_SOCK_OPS_RTT_CB the new srtt (8 x us)
	offFamily     = 20
	offRemoteIP   = 24
	offLocalIP    = 28
	offRemoteIP6  = 32  // __u32 remote_ip6[4]
	offLocalIP6   = 48  // __u32 local_ip6[4]
	offRemotePort = 64  // __u32 remote_port (network byte order)
	offLocalPort  = 68  // __u32 local_port (host byte order)
	offSndCwnd    = 76  // __u32 snd_cwnd (segments; 0 unless a full socket)
	offSrttUs     = 80  // __u32 srtt_us (8 x the smoothed RTT in us)
	offCbFlags    = 84  // __u32 bpf_sock_ops_cb_flags
	offMssCache   = 112 // __u32 mss_cache
	offSk         = 184 // struct bpf_sock *sk (NULL unless a full socket)
	afInet6       = 10
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
	tcpNotsentLowat      = 25 // TCP_NOTSENT_LOWAT
	solSocket            = 1  // SOL_SOCKET
	soMaxPacingRate      = 47 // SO_MAX_PACING_RATE (include/uapi/asm-generic/socket.h)
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

// Conn is one socket's addresses and ports (its 4-tuple), of either
// family, in one network namespace: the notsent lowat's key (SetLowat).
type Conn struct {
	Local, Remote netip.AddrPort
	// Netns is the cookie of the socket's network namespace (NetnsCookie
	// run in it; never 0).
	Netns uint64
}

func (c Conn) bytes() ([lowatKeySize]byte, error) {
	var b [lowatKeySize]byte
	pair, err := Key{Local: c.Local.Addr(), Remote: c.Remote.Addr()}.bytes()
	if err != nil {
		return b, err
	}
	if c.Local.Port() == 0 || c.Remote.Port() == 0 {
		return b, fmt.Errorf("bpfclamp: %v -> %v: no port (a connected socket has both)", c.Local, c.Remote)
	}
	if c.Netns == 0 {
		return b, fmt.Errorf("bpfclamp: %v -> %v: no network namespace cookie", c.Local, c.Remote)
	}
	// The program's words: the namespace cookie, both ports in host byte
	// order.
	binary.NativeEndian.PutUint64(b[:8], c.Netns)
	binary.NativeEndian.PutUint32(b[8:12], uint32(c.Local.Port()))
	binary.NativeEndian.PutUint32(b[12:16], uint32(c.Remote.Port()))
	copy(b[16:], pair[:])
	return b, nil
}

// NetnsCookie is the cookie of the calling thread's network namespace
// (SO_NETNS_COOKIE, Linux 5.14), the value the program's
// bpf_get_netns_cookie gives for the sockets of that namespace: run it
// in the namespace whose subflows get lowats (with the OS thread locked).
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("bpfclamp: network namespace cookie: socket: %w", err)
	}
	defer unix.Close(fd)
	return SocketNetnsCookie(fd)
}

// SocketNetnsCookie is the cookie of socket fd's network namespace.
func SocketNetnsCookie(fd int) (uint64, error) {
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("bpfclamp: network namespace cookie (SO_NETNS_COOKIE): %w", err)
	}
	return v, nil
}

// Limits are what the program applies to the sockets of one address pair;
// a zero field applies nothing of its kind.
type Limits struct {
	// CwndSegments clamps the congestion window
	// (TCP_BPF_SNDCWND_CLAMP, segments).
	CwndSegments uint32
	// PacingRate is the socket's maximum pacing rate (SO_MAX_PACING_RATE,
	// bytes/s, at most MaxPacingRate). Setting one switches on TCP's
	// internal pacing of the socket (no fq qdisc needed).
	PacingRate uint64
}

// MaxPacingRate is the largest pacing rate the program can set: the
// kernel takes SO_MAX_PACING_RATE from BPF as a 32-bit value
// (net/core/filter.c sol_socket_sockopt: optlen == sizeof(int)), with
// ~0U meaning unlimited.
const MaxPacingRate = 1<<32 - 2

// Refusals are the kernel's answers to the program's last refused
// bpf_setsockopt of each kind (0: none refused since Attach).
type Refusals struct{ Cwnd, Pacing, Lowat unix.Errno }

// Clamper is the loaded and attached program with its maps.
type Clamper struct {
	m       *ebpf.Map
	applied *ebpf.Map
	lowats  *ebpf.Map
	counts  *ebpf.Map
	prog    *ebpf.Program
	l       link.Link
}

// Map values (native byte order): the pair map's are {u32 cwnd segments,
// u32 pacing rate}, the applied map's the same; the lowat map's key is
// {u64 netns cookie, u32 local port, u32 remote port, local 16 bytes,
// remote 16 bytes} (ports in host byte order), its value {u32 floor, u32
// ceil, u32 maxRTT in microseconds} (Lowat; not kept in the applied map:
// the socket's lowat is read back from it, the kernel resets it). The
// counts map (mpd_clamp_cnt) is an
// array of s64: at the refusal indexes the negative errno of the last
// refusal of that kind, at countLowatSets the number of TCP_NOTSENT_LOWAT
// settings (the first on each subflow and every one after the kernel
// reset it).
const (
	valueSize          = 8
	lowatKeySize       = 48
	lowatValueSize     = 12
	appliedSize        = 8
	countCwndRefused   = 0
	countPacingRefused = 1
	countLowatRefused  = 2
	countLowatSets     = 3
	countsLen          = 4
)

// instructions returns the program reading its limits from m,
// remembering what it applied per socket in applied, and its refusals
// and settings in counts. everySocket: every established TCP socket gets
// RTT callbacks (so cwnd and pacing limits written later reach plain TCP
// sockets too); otherwise only MPTCP subflows get them.
//
// Stack: fp-32 key (local 16 bytes, remote 16 bytes), fp-40 the ports
// before it and fp-48 the netns cookie before them (the lowat map's key:
// cookie, local port, remote port), fp-88 the pair's limits (segments,
// rate), fp-48 the socket cookie (before the lowat's part: the lowat
// comes last and writes its own), fp-56 the limits applied to the
// socket (segments, rate), fp-60 counts index, fp-72 refusal code, fp-76
// the notsent lowat to set, fp-80 the socket's.
// r7 = segments, r8 = rate, r9 = whether anything was applied (the
// lowat, last, reuses them: lowat).
func instructions(m, applied, lowats, counts *ebpf.Map, everySocket bool) asm.Instructions {
	established := asm.Instructions{
		// Sockets established from now on get RTT callbacks: their
		// limits may be written after they connected.
		// bpf_sock_ops_cb_flags_set replaces the socket's flags: keep
		// what other programs of the cgroup asked for.
		asm.LoadMem(asm.R2, asm.R6, offCbFlags, asm.Word),
		asm.Or.Imm(asm.R2, rttCBFlag),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnSockOpsCbFlagsSet.Call(),
	}
	if !everySocket {
		// Only MPTCP subflows: the lowat is theirs alone, and a plain
		// TCP socket then costs no callback per ACK.
		established = slices.Concat(isSubflow("lookup"), established)
	}
	established = withSymbol(established, "established")
	return slices.Concat(asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // r6 = ctx
		asm.LoadMem(asm.R2, asm.R6, offOp, asm.Word),
		asm.JEq.Imm(asm.R2, opRTT, "lookup"),
		asm.JEq.Imm(asm.R2, opActiveEstablished, "established"),
		asm.JEq.Imm(asm.R2, opPassiveEstablished, "established"),
		asm.Ja.Label("out"),
	}, established, asm.Instructions{
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
			asm.JEq.Imm(asm.R0, 0, "lowat"),
			asm.LoadMem(asm.R7, asm.R0, 0, asm.Word), // r7 = segments
			asm.LoadMem(asm.R8, asm.R0, 4, asm.Word), // r8 = rate
			asm.StoreMem(asm.RFP, -88, asm.R7, asm.Word),
			asm.StoreMem(asm.RFP, -84, asm.R8, asm.Word),
			asm.JNE.Imm(asm.R7, 0, "cookie"),
			asm.JEq.Imm(asm.R8, 0, "lowat"),
			// What this socket has already.
			asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("cookie"),
			asm.FnGetSocketCookie.Call(),
			asm.StoreMem(asm.RFP, -48, asm.R0, asm.DWord),
			asm.Mov.Imm(asm.R9, 0),
			asm.StoreMem(asm.RFP, -56, asm.R9, asm.DWord),
		}, lookup(applied, -48), asm.Instructions{
			asm.JEq.Imm(asm.R0, 0, "cwnd"),
			asm.LoadMem(asm.R2, asm.R0, 0, asm.DWord),
			asm.StoreMem(asm.RFP, -56, asm.R2, asm.DWord),
		},
		// The cwnd clamp, then the pacing rate, each when the pair has
		// one the socket lacks.
		apply("cwnd", "pacing", asm.R7, -88, -56, solTCP, tcpBPFSndCwndClamp, counts, countCwndRefused),
		apply("pacing", "record", asm.R8, -84, -52, solSocket, soMaxPacingRate, counts, countPacingRefused),
		asm.Instructions{
			// Remember what was applied: a refused limit is tried
			// again on the next callback.
			asm.JEq.Imm(asm.R9, 0, "lowat").WithSymbol("record"),
		}, update(applied, -48, -56),
		lowat("lowat", "out", lowats, counts), asm.Instructions{
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		})
}

// isSubflow continues at no unless the socket (ctx in r6) is an MPTCP
// subflow: bpf_skc_to_mptcp_sock answers NULL for any other socket, as
// in the kernel selftest tools/testing/selftests/bpf/progs/mptcp_sock.c
// (a sockops program). ctx->sk is NULL unless the socket is a full one.
func isSubflow(no string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.R6, offSk, asm.DWord),
		asm.JEq.Imm(asm.R1, 0, no),
		asm.FnSkcToMptcpSock.Call(),
		asm.JEq.Imm(asm.R0, 0, no),
	}
}

// apply is one limit: the pair's value in reg (also at fp+val), the
// socket's at fp+have (32 bits each). Unless the value is 0 or the socket
// has it, it calls bpf_setsockopt(ctx, level, name, fp+val, 4) (r6 =
// ctx); on success the value goes to fp+have and r9 = 1, a refusal (its
// negative errno) to index idx of counts. The first instruction is
// labelled sym; it continues at next.
func apply(sym, next string, reg asm.Register, val, have int16, level, name int32, counts *ebpf.Map, idx int32) asm.Instructions {
	return slices.Concat(asm.Instructions{
		asm.JEq.Imm(reg, 0, next).WithSymbol(sym),
		asm.LoadMem(asm.R2, asm.RFP, have, asm.Word),
		asm.JEq.Reg(asm.R2, reg, next),
	}, sockopt(asm.FnSetsockopt, level, name, int32(val)), asm.Instructions{
		asm.JEq.Imm(asm.R0, 0, sym+"-ok"),
	}, refuse(counts, idx), asm.Instructions{
		asm.Ja.Label(next),
		asm.StoreMem(asm.RFP, have, reg, asm.Word).WithSymbol(sym + "-ok"),
		asm.Mov.Imm(asm.R9, 1),
	})
}

// refuse records the refusal in r0 (a negative errno) at index idx of
// counts: fp-72 the code, fp-60 the index.
func refuse(counts *ebpf.Map, idx int32) asm.Instructions {
	return slices.Concat(asm.Instructions{
		asm.StoreMem(asm.RFP, -72, asm.R0, asm.DWord),
		asm.StoreImm(asm.RFP, -60, int64(idx), asm.Word),
	}, update(counts, -60, -72))
}

// lowat sets the socket's TCP_NOTSENT_LOWAT from the entry its 4-tuple
// has in lowats (Lowat), if the socket is an MPTCP subflow and the
// entry's floor is not 0. A fixed entry (ceil or maxRTT 0) gives the
// floor, set whenever the socket has another value; a scaled one gives
// clamp(cwnd x mss x (maxRTT - srtt) / srtt, floor, ceil) from the
// socket's own congestion window, MSS and smoothed RTT (the floor when
// srtt is 0 or at least maxRTT), set only when it differs from the
// socket's value by more than 1/8 of that value, so that a window that
// moves with every ACK does not mean a setting per ACK. The socket's own
// value is read back with bpf_getsockopt at every callback, because the
// MPTCP code resets a subflow's to UINT_MAX after the program may have set
// it (mptcp_sockopt_sync_locked runs when the subflow joins, deferred
// while the application holds the MPTCP socket); that also makes the
// first setting of a scaled entry certain. Setting it is not recorded in
// the applied map for that reason. Any other socket is left alone: its
// lowat is its application's. A refusal (of the read or the setting)
// goes to index countLowatRefused of counts, a setting adds one at index
// countLowatSets. The address key is at fp-32 already; the ports go to
// fp-40 and the namespace's cookie (bpf_get_netns_cookie) to fp-48; r7 =
// the value to set, r8 = ceil, r9 = whether the entry is scaled. The
// first instruction is labelled sym; it continues at next.
func lowat(sym, next string, lowats, counts *ebpf.Map) asm.Instructions {
	return slices.Concat(withSymbol(isSubflow(next), sym), asm.Instructions{
		asm.LoadMem(asm.R2, asm.R6, offLocalPort, asm.Word),
		asm.StoreMem(asm.RFP, -40, asm.R2, asm.Word),
	}, remotePort(asm.R2), asm.Instructions{
		asm.StoreMem(asm.RFP, -36, asm.R2, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetNetnsCookie.Call(),
		asm.StoreMem(asm.RFP, -48, asm.R0, asm.DWord),
	}, lookup(lowats, -48), asm.Instructions{
		asm.JEq.Imm(asm.R0, 0, next),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word), // floor
		asm.JEq.Imm(asm.R7, 0, next),
		asm.LoadMem(asm.R8, asm.R0, 4, asm.Word), // ceil
		asm.LoadMem(asm.R9, asm.R0, 8, asm.Word), // maxRTT (us)
	}, scaledLowat(sym), asm.Instructions{
		asm.StoreMem(asm.RFP, -76, asm.R7, asm.Word).WithSymbol(sym + "-want"),
		asm.StoreImm(asm.RFP, -80, 0, asm.Word),
	}, sockopt(asm.FnGetsockopt, solTCP, tcpNotsentLowat, -80), asm.Instructions{
		// Unreadable: a refusal, not a setting at every callback.
		asm.JNE.Imm(asm.R0, 0, sym+"-refused"),
		asm.LoadMem(asm.R2, asm.RFP, -80, asm.Word),
		asm.JEq.Reg(asm.R2, asm.R7, next),
		asm.JEq.Imm(asm.R9, 0, sym+"-set"),
		// Scaled: |have - want| x 8 <= have keeps what the socket has.
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.Sub.Reg(asm.R3, asm.R7),
		asm.JGT.Reg(asm.R2, asm.R7, sym+"-diff"),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.LSh.Imm(asm.R3, 3).WithSymbol(sym + "-diff"),
		asm.JLE.Reg(asm.R3, asm.R2, next),
	}, withSymbol(sockopt(asm.FnSetsockopt, solTCP, tcpNotsentLowat, -76), sym+"-set"), asm.Instructions{
		asm.JEq.Imm(asm.R0, 0, sym+"-ok"),
	}, withSymbol(refuse(counts, countLowatRefused), sym+"-refused"), asm.Instructions{
		asm.Ja.Label(next),
		// Set: count it.
		asm.StoreImm(asm.RFP, -60, countLowatSets, asm.Word).WithSymbol(sym + "-ok"),
	}, lookup(counts, -60), asm.Instructions{
		asm.JEq.Imm(asm.R0, 0, next),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
	})
}

// scaledLowat turns an entry's floor (r7), ceil (r8) and maxRTT in
// microseconds (r9, each read as a u32) into the value to set (r7) and
// whether the entry is scaled (r9 = 1) or fixed (r9 = 0, r7 the floor):
// fixed when ceil or maxRTT is 0; scaled, the value is
// clamp(cwnd x mss x (maxRTT - srtt) / srtt, floor, ceil) with the
// socket's (ctx in r6) snd_cwnd, mss_cache and smoothed RTT in 64-bit
// arithmetic. The smoothed RTT is srtt_us >> 3, except at an RTT
// callback, which the kernel makes once per round trip before it stores
// the new srtt (tcp_rtt_estimator, net/ipv4/tcp_input.c) and passes that
// in args[1] (Linux 6.10; an older kernel passes 0 there, and srtt_us,
// one sample old, is used): cwnd x mss is capped at 2^32-1 bytes (both fields are
// u32) so that its product with maxRTT - srtt (< 2^32) cannot overflow;
// srtt 0 (no sample yet) or at least maxRTT (the connection's slowest
// subflow) gives the floor. It continues at sym-want.
func scaledLowat(sym string) asm.Instructions {
	return asm.Instructions{
		asm.JEq.Imm(asm.R8, 0, sym+"-fixed"),
		asm.JEq.Imm(asm.R9, 0, sym+"-fixed"),
		asm.LoadMem(asm.R2, asm.R6, offSrttUs, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, offOp, asm.Word),
		asm.JNE.Imm(asm.R3, opRTT, sym+"-srtt"),
		asm.LoadMem(asm.R3, asm.R6, offArg1, asm.Word),
		asm.JEq.Imm(asm.R3, 0, sym+"-srtt"),
		asm.Mov.Reg(asm.R2, asm.R3),
		asm.RSh.Imm(asm.R2, 3).WithSymbol(sym + "-srtt"),
		asm.JEq.Imm(asm.R2, 0, sym+"-scaled"),
		asm.JGE.Reg(asm.R2, asm.R9, sym+"-scaled"),
		asm.LoadMem(asm.R3, asm.R6, offSndCwnd, asm.Word),
		asm.LoadMem(asm.R4, asm.R6, offMssCache, asm.Word),
		asm.Mul.Reg(asm.R3, asm.R4),
		asm.Mov.Imm32(asm.R4, -1), // 2^32-1 (a 32-bit move zero-extends)
		asm.JLE.Reg(asm.R3, asm.R4, sym+"-window"),
		asm.Mov.Reg(asm.R3, asm.R4),
		asm.Sub.Reg(asm.R9, asm.R2).WithSymbol(sym + "-window"),
		asm.Mul.Reg(asm.R3, asm.R9),
		asm.Div.Reg(asm.R3, asm.R2),
		asm.JLE.Reg(asm.R3, asm.R7, sym+"-scaled"),
		asm.Mov.Reg(asm.R7, asm.R8),
		asm.JGE.Reg(asm.R3, asm.R8, sym+"-scaled"),
		asm.Mov.Reg(asm.R7, asm.R3),
		asm.Mov.Imm(asm.R9, 1).WithSymbol(sym + "-scaled"),
		asm.Ja.Label(sym + "-want"),
		asm.Mov.Imm(asm.R9, 0).WithSymbol(sym + "-fixed"),
	}
}

// remotePort loads the socket's remote port (ctx in r6) into reg in host
// byte order. The context's remote_port holds the port in network byte
// order, shifted into the upper 16 bits on a little-endian host
// (net/core/filter.c, sock_ops_convert_ctx_access).
func remotePort(reg asm.Register) asm.Instructions {
	ins := asm.Instructions{asm.LoadMem(reg, asm.R6, offRemotePort, asm.Word)}
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 { // little-endian
		ins = append(ins, asm.RSh.Imm32(reg, 16), asm.HostTo(asm.BE, reg, asm.Half))
	}
	return ins
}

// sockopt calls fn (bpf_setsockopt or bpf_getsockopt) on ctx (r6) with
// level, name and the 4-byte value at fp+val.
func sockopt(fn asm.BuiltinFunc, level, name int32, val int32) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, level),
		asm.Mov.Imm(asm.R3, name),
		asm.Mov.Reg(asm.R4, asm.RFP),
		asm.Add.Imm(asm.R4, val),
		asm.Mov.Imm(asm.R5, 4),
		fn.Call(),
	}
}

// update calls bpf_map_update_elem(m, fp+key, fp+val, BPF_ANY).
func update(m *ebpf.Map, key, val int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, val),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnMapUpdateElem.Call(),
	}
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

// Options choose what the program watches.
type Options struct {
	// EverySocket asks for RTT callbacks on every TCP socket of the
	// cgroup, so that cwnd and pacing limits written after a plain TCP
	// socket connected still reach it (each ACK of each socket then runs
	// the program and one map lookup). Without it only MPTCP subflows
	// get them; a plain TCP socket gets cwnd and pacing limits only if
	// its pair's entry existed when it connected. The notsent lowat goes
	// to MPTCP subflows only, either way.
	EverySocket bool
}

// Attach loads the program and attaches it to the cgroup v2 directory
// cgroupPath. On any failure nothing stays loaded or attached.
func Attach(cgroupPath string, o Options) (*Clamper, error) {
	c, err := load(o)
	if err != nil {
		return nil, err
	}
	c.l, err = link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: c.prog})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bpfclamp: attach to cgroup %s: %w", cgroupPath, err)
	}
	return c, nil
}

// load creates the maps and loads the program, not attached.
func load(o Options) (_ *Clamper, err error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_clamp", Type: ebpf.Hash, KeySize: 32, ValueSize: valueSize, MaxEntries: MaxEntries})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: create map: %w", err)
	}
	c := &Clamper{m: m}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	c.applied, err = ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_clamp_sk", Type: ebpf.LRUHash, KeySize: 8, ValueSize: appliedSize, MaxEntries: maxSockets})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: create map: %w", err)
	}
	c.lowats, err = ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_lowat", Type: ebpf.Hash, KeySize: lowatKeySize, ValueSize: lowatValueSize, MaxEntries: MaxEntries})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: create map: %w", err)
	}
	c.counts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "mpd_clamp_cnt", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: countsLen})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: create map: %w", err)
	}
	c.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "mpd_clamp", Type: ebpf.SockOps, License: "GPL", Instructions: instructions(m, c.applied, c.lowats, c.counts, o.EverySocket)})
	if err != nil {
		return nil, fmt.Errorf("bpfclamp: load sock_ops program: %w", err)
	}
	return c, nil
}

// Set gives sockets with this address pair the limits l (at least one
// nonzero; a clamp of at most 2^31-1 segments, a rate of at most
// MaxPacingRate): sockets established from now on, and established ones
// at their next RTT callback. A limit of zero leaves that kind alone (a
// socket keeps what it was given before).
func (c *Clamper) Set(k Key, l Limits) error {
	if l.CwndSegments == 0 && l.PacingRate == 0 {
		return errors.New("bpfclamp: no cwnd clamp and no pacing rate: use Delete to remove a pair's limits")
	}
	if l.CwndSegments > math.MaxInt32 {
		// The kernel takes the clamp as an int and refuses one <= 0.
		return fmt.Errorf("bpfclamp: cwnd clamp of %d segments above the kernel's %d", l.CwndSegments, math.MaxInt32)
	}
	if l.PacingRate > MaxPacingRate {
		return fmt.Errorf("bpfclamp: pacing rate %d bytes/s above the kernel's 32-bit SO_MAX_PACING_RATE from BPF (at most %d)", l.PacingRate, uint64(MaxPacingRate))
	}
	kb, err := k.bytes()
	if err != nil {
		return err
	}
	var v [valueSize]byte
	binary.NativeEndian.PutUint32(v[:4], l.CwndSegments)
	binary.NativeEndian.PutUint32(v[4:], uint32(l.PacingRate))
	if err := c.m.Put(kb[:], v[:]); err != nil {
		return fmt.Errorf("bpfclamp: set %v -> %v: %w", k.Local, k.Remote, err)
	}
	return nil
}

// SetLowat gives the MPTCP subflow with this 4-tuple a TCP_NOTSENT_LOWAT of
// bytes (1 to math.MaxInt32): if it is established already, at its next
// RTT callback, else when it is. On an MPTCP subflow the kernel sets it
// to UINT_MAX (mptcp_sockopt_sync_locked, net/mptcp/sockopt.c), so the
// subflow takes data from the MPTCP socket until its send buffer is
// full; the program reads the subflow's value back at every callback and
// sets it again whenever it differs, so a reset by the kernel lasts until
// the next RTT callback (up to one round trip of that subflow). A socket that is not an MPTCP subflow is never touched.
// It is SetLowatScaled with Lowat{Floor: bytes}.
func (c *Clamper) SetLowat(k Conn, bytes uint32) error {
	return c.SetLowatScaled(k, Lowat{Floor: bytes})
}

// Lowat is one subflow's TCP_NOTSENT_LOWAT: the fixed Floor, or, with
// Ceil and MaxRTT set, one scaled to the subflow's RTT.
type Lowat struct {
	// Floor is the fixed lowat and the scaled one's least (bytes, 1 to
	// math.MaxInt32).
	Floor uint32
	// Ceil is the scaled lowat's largest (bytes, at least Floor, at most
	// math.MaxInt32); 0: fixed.
	Ceil uint32
	// MaxRTT is the largest smoothed RTT of the subflow's connection (T);
	// 0: fixed (e.g. no measurement yet). Kept in microseconds, at most
	// MaxLowatRTT.
	MaxRTT time.Duration
}

// MaxLowatRTT is the largest Lowat.MaxRTT: the map holds microseconds in
// 32 bits.
const MaxLowatRTT = time.Duration(math.MaxUint32) * time.Microsecond

// SetLowatScaled gives the MPTCP subflow with this 4-tuple the lowat l.
// Fixed (Ceil or MaxRTT 0), it is SetLowat's. Scaled, the program sets
// the subflow's TCP_NOTSENT_LOWAT at each RTT callback to
// clamp(cwnd x mss x (MaxRTT - srtt) / srtt, Floor, Ceil) from the
// subflow's own congestion window, MSS and smoothed RTT (srtt; Floor when
// srtt is unknown or at least MaxRTT), and only when that differs from
// the subflow's value by more than 1/8 of it: the bytes the subflow
// sends in the time the connection's slowest subflow takes for one round
// trip, so that the MPTCP scheduler's lowest-linger-time rule does not
// stop at a short subflow's fixed cap while a long one is still worth
// waiting for (docs/agent.md, "Per-subflow unsent limit").
func (c *Clamper) SetLowatScaled(k Conn, l Lowat) error {
	if l.Floor == 0 || l.Floor > math.MaxInt32 {
		return fmt.Errorf("bpfclamp: notsent lowat of %d bytes is not 1-%d (DeleteLowat removes one)", l.Floor, math.MaxInt32)
	}
	if l.Ceil != 0 && (l.Ceil < l.Floor || l.Ceil > math.MaxInt32) {
		return fmt.Errorf("bpfclamp: notsent lowat ceiling of %d bytes is not %d-%d (0: a fixed lowat)", l.Ceil, l.Floor, math.MaxInt32)
	}
	if l.MaxRTT < 0 || l.MaxRTT > MaxLowatRTT {
		return fmt.Errorf("bpfclamp: notsent lowat RTT %v is not 0-%v", l.MaxRTT, MaxLowatRTT)
	}
	kb, err := k.bytes()
	if err != nil {
		return err
	}
	var v [lowatValueSize]byte
	binary.NativeEndian.PutUint32(v[0:4], l.Floor)
	binary.NativeEndian.PutUint32(v[4:8], l.Ceil)
	binary.NativeEndian.PutUint32(v[8:12], uint32(l.MaxRTT/time.Microsecond))
	if err := c.lowats.Put(kb[:], v[:]); err != nil {
		return fmt.Errorf("bpfclamp: set the lowat of %v -> %v: %w", k.Local, k.Remote, err)
	}
	return nil
}

// DeleteLowat removes a 4-tuple's lowat (absent: no error); a subflow
// keeps the lowat it has.
func (c *Clamper) DeleteLowat(k Conn) error {
	kb, err := k.bytes()
	if err != nil {
		return err
	}
	return remove(c.lowats, kb[:], fmt.Sprintf("the lowat of %v -> %v", k.Local, k.Remote))
}

// remove deletes key from m (absent: no error); what names the entry in
// the error.
func remove(m *ebpf.Map, key []byte, what string) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpfclamp: delete %s: %w", what, err)
	}
	return nil
}

// Refused reports the kernel's refusals of the program's
// bpf_setsockopt calls since Attach (a kernel that does not take
// SO_MAX_PACING_RATE from BPF answers EINVAL or ENOPROTOOPT).
func (c *Clamper) Refused() (Refusals, error) {
	var r Refusals
	for i, dst := range []*unix.Errno{&r.Cwnd, &r.Pacing, &r.Lowat} {
		var v int64
		if err := c.counts.Lookup(uint32(i), &v); err != nil {
			return r, fmt.Errorf("bpfclamp: read refusals: %w", err)
		}
		*dst = unix.Errno(-v)
	}
	return r, nil
}

// LowatSets counts the program's TCP_NOTSENT_LOWAT settings since
// Attach: one per subflow that got its lowat, plus one each time the
// kernel had reset it (see SetLowat).
func (c *Clamper) LowatSets() (uint64, error) {
	var v uint64
	if err := c.counts.Lookup(uint32(countLowatSets), &v); err != nil {
		return 0, fmt.Errorf("bpfclamp: read the lowat count: %w", err)
	}
	return v, nil
}

// Delete removes the limits of an address pair (absent: no error); a
// socket keeps the limits it has.
func (c *Clamper) Delete(k Key) error {
	kb, err := k.bytes()
	if err != nil {
		return err
	}
	return remove(c.m, kb[:], fmt.Sprintf("%v -> %v", k.Local, k.Remote))
}

// Close detaches the program and frees it and its maps.
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
	for _, m := range []**ebpf.Map{&c.m, &c.applied, &c.lowats, &c.counts} {
		if *m != nil {
			errs = append(errs, (*m).Close())
			*m = nil
		}
	}
	return errors.Join(errs...)
}
