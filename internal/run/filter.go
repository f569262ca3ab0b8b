package run

import (
	"fmt"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data. Argument loads take the low 32 bits
// (little-endian x86), which is all the kernel's socket(int, int, int) uses.
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg1 = 24
	offArg2 = 32
)

const (
	sysSocketX86_64  = 41         // __NR_socket, x86_64
	x32SyscallBit    = 0x40000000 // __X32_SYSCALL_BIT
	sysSocketI386    = 359        // __NR_socket, i386 (since 4.3; socketcall(2) is not covered)
	sysConnectX86_64 = 42         // __NR_connect, x86_64
	sysConnectI386   = 362        // __NR_connect, i386
	// typeFlags are the flags the kernel strips from socket()'s type before
	// looking at the socket type; any other bit makes socket() fail with
	// EINVAL, which the kernel must keep reporting itself.
	typeFlags = unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK
)

// filterProgram is the classic BPF seccomp program. Every syscall except a
// TCP stream socket() is allowed without leaving the kernel, so the
// supervisor only sees socket() calls it will convert.
func filterProgram() []bpf.Instruction { return filterProgramFor(false) }

// filterProgramFor builds the program; with connect, every connect() also
// goes to the supervisor (conversion, docs/convert.md): BPF cannot read the
// sockaddr behind the pointer, so the supervisor looks at the family and
// lets anything but IPv4/IPv6 continue at once.
func filterProgramFor(connect bool) []bpf.Instruction {
	const (
		notify = unix.SECCOMP_RET_USER_NOTIF
		allow  = unix.SECCOMP_RET_ALLOW
	)
	// A tiny assembler: jumps name labels, resolved below (offsets by hand
	// broke too easily once connect() joined).
	type jmp struct {
		val     uint32
		yes, no string // label; "" = next instruction
		cond    bpf.JumpTest
	}
	type ins struct {
		label string
		i     bpf.Instruction
		j     *jmp
	}
	var prog []ins
	add := func(label string, i bpf.Instruction) { prog = append(prog, ins{label: label, i: i}) }
	jeq := func(label string, val uint32, yes, no string) {
		prog = append(prog, ins{label: label, j: &jmp{val: val, yes: yes, no: no, cond: bpf.JumpEqual}})
	}
	add("", bpf.LoadAbsolute{Off: offArch, Size: 4})
	jeq("", unix.AUDIT_ARCH_X86_64, "x86", "")
	jeq("", unix.AUDIT_ARCH_I386, "i386", "allow")
	// x86_64 and x32 (same audit arch, syscall numbers with bit 30 set).
	add("x86", bpf.LoadAbsolute{Off: offNr, Size: 4})
	jeq("", sysSocketX86_64, "args", "")
	if connect {
		jeq("", sysSocketX86_64|x32SyscallBit, "args", "")
		jeq("", sysConnectX86_64, "notify", "")
		jeq("", sysConnectX86_64|x32SyscallBit, "notify", "allow")
	} else {
		jeq("", sysSocketX86_64|x32SyscallBit, "args", "allow")
	}
	// i386 compat.
	add("i386", bpf.LoadAbsolute{Off: offNr, Size: 4})
	if connect {
		jeq("", sysSocketI386, "args", "")
		jeq("", sysConnectI386, "notify", "allow")
	} else {
		jeq("", sysSocketI386, "args", "allow")
	}
	// socket(domain, type, protocol)
	add("args", bpf.LoadAbsolute{Off: offArg0, Size: 4})
	jeq("", unix.AF_INET, "type", "")
	jeq("", unix.AF_INET6, "type", "allow")
	add("type", bpf.LoadAbsolute{Off: offArg1, Size: 4})
	add("", bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: ^uint32(typeFlags)})
	jeq("", unix.SOCK_STREAM, "", "allow")
	add("", bpf.LoadAbsolute{Off: offArg2, Size: 4})
	jeq("", 0, "notify", "")
	jeq("", unix.IPPROTO_TCP, "notify", "allow")
	add("notify", bpf.RetConstant{Val: notify})
	add("allow", bpf.RetConstant{Val: allow})

	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	out := make([]bpf.Instruction, len(prog))
	for i, in := range prog {
		if in.j == nil {
			out[i] = in.i
			continue
		}
		skip := func(l string) uint8 {
			if l == "" {
				return 0
			}
			t, ok := at[l]
			if !ok || t <= i {
				panic("seccomp filter: bad label " + l)
			}
			return uint8(t - i - 1)
		}
		out[i] = bpf.JumpIf{Cond: in.j.cond, Val: in.j.val, SkipTrue: skip(in.j.yes), SkipFalse: skip(in.j.no)}
	}
	return out
}

// assembleFilter turns the program into the kernel's sock_filter form.
func assembleFilter(connect bool) ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble(filterProgramFor(connect))
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp filter: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// installFilter installs the filter on every thread of the calling process
// and returns the notification listener. The caller must hold its OS thread
// locked: without CAP_SYS_ADMIN the kernel requires no_new_privs on the
// calling thread, and the thread that later calls execve must be filtered.
func installFilter(connect bool) (int, error) {
	prog, err := assembleFilter(connect)
	if err != nil {
		return -1, err
	}
	if !hasCapSysAdmin() {
		// Without the capability the kernel insists on no_new_privs, which
		// also stops setuid binaries inside CMD from gaining privileges.
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return -1, fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
		}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// TSYNC reaches the Go runtime's other threads; with NEW_LISTENER the
	// kernel demands TSYNC_ESRCH so the return value stays the listener fd.
	// WAIT_KILLABLE_RECV (Linux 6.0) stops Go's preemption signals in CMD
	// from restarting a socket() the supervisor is already handling.
	base := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH)
	var lastErr error
	for _, flags := range []uintptr{base | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, base} {
		fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
		if errno == 0 {
			return int(fd), nil
		}
		lastErr = errno
		if errno != unix.EINVAL {
			break
		}
	}
	return -1, fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER): %w", lastErr)
}

// hasCapSysAdmin reports whether the effective capability set holds
// CAP_SYS_ADMIN.
func hasCapSysAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
}
