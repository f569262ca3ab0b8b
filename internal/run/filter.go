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
	sysSocketX86_64 = 41         // __NR_socket, x86_64
	x32SyscallBit   = 0x40000000 // __X32_SYSCALL_BIT
	sysSocketI386   = 359        // __NR_socket, i386 (since 4.3; socketcall(2) is not covered)
	// typeFlags are the flags the kernel strips from socket()'s type before
	// looking at the socket type; any other bit makes socket() fail with
	// EINVAL, which the kernel must keep reporting itself.
	typeFlags = unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK
)

// filterProgram is the classic BPF seccomp program. Every syscall except a
// TCP stream socket() is allowed without leaving the kernel, so the
// supervisor only sees socket() calls it will convert.
func filterProgram() []bpf.Instruction {
	const (
		notify = unix.SECCOMP_RET_USER_NOTIF
		allow  = unix.SECCOMP_RET_ALLOW
	)
	return []bpf.Instruction{
		/* 0 */ bpf.LoadAbsolute{Off: offArch, Size: 4},
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_X86_64, SkipTrue: 1},
		/* 2 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_I386, SkipTrue: 3, SkipFalse: 15}, // -> 6, else allow
		// x86_64 and x32 (same audit arch, syscall numbers with bit 30 set).
		/* 3 */ bpf.LoadAbsolute{Off: offNr, Size: 4},
		/* 4 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: sysSocketX86_64, SkipTrue: 3},
		/* 5 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: sysSocketX86_64 | x32SyscallBit, SkipTrue: 2, SkipFalse: 12},
		// i386 compat.
		/* 6 */ bpf.LoadAbsolute{Off: offNr, Size: 4},
		/* 7 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: sysSocketI386, SkipFalse: 10},
		// socket(domain, type, protocol)
		/* 8 */ bpf.LoadAbsolute{Off: offArg0, Size: 4},
		/* 9 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET, SkipTrue: 1},
		/* 10 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET6, SkipFalse: 7},
		/* 11 */ bpf.LoadAbsolute{Off: offArg1, Size: 4},
		/* 12 */ bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: ^uint32(typeFlags)},
		/* 13 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_STREAM, SkipFalse: 4},
		/* 14 */ bpf.LoadAbsolute{Off: offArg2, Size: 4},
		/* 15 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 1},
		/* 16 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.IPPROTO_TCP, SkipFalse: 1},
		/* 17 */ bpf.RetConstant{Val: notify},
		/* 18 */ bpf.RetConstant{Val: allow},
	}
}

// assembleFilter turns the program into the kernel's sock_filter form.
func assembleFilter() ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble(filterProgram())
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
func installFilter() (int, error) {
	prog, err := assembleFilter()
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
