package run

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompBytes lays out struct seccomp_data for x/net/bpf's VM. The kernel
// loads 32-bit words of seccomp_data in host order, the VM in network order,
// so each word is stored big-endian at its host (little-endian) offset.
func seccompBytes(arch uint32, nr uint32, args [6]uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
	}
	return b
}

func TestFilterDecisions(t *testing.T) {
	vm, err := bpf.NewVM(filterProgram())
	if err != nil {
		t.Fatal(err)
	}
	const x86, i386 = unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_I386
	const notify, allow = unix.SECCOMP_RET_USER_NOTIF, unix.SECCOMP_RET_ALLOW
	for _, c := range []struct {
		name       string
		arch, nr   uint32
		d, ty, pro uint64
		want       uint32
	}{
		{"tcp4", x86, 41, unix.AF_INET, unix.SOCK_STREAM, 0, notify},
		{"tcp6", x86, 41, unix.AF_INET6, unix.SOCK_STREAM, 0, notify},
		{"tcp4 IPPROTO_TCP", x86, 41, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP, notify},
		{"tcp4 cloexec nonblock", x86, 41, unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK, 0, notify},
		{"high bits ignored like the kernel", x86, 41, 1<<32 | unix.AF_INET, 7<<32 | unix.SOCK_STREAM, 1 << 40, notify},
		{"x32 socket", x86, 41 | x32SyscallBit, unix.AF_INET, unix.SOCK_STREAM, 0, notify},
		{"i386 socket", i386, 359, unix.AF_INET6, unix.SOCK_STREAM, 0, notify},
		{"already mptcp", x86, 41, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP, allow},
		{"sctp stream", x86, 41, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP, allow},
		{"udp", x86, 41, unix.AF_INET, unix.SOCK_DGRAM, 0, allow},
		{"unix stream", x86, 41, unix.AF_UNIX, unix.SOCK_STREAM, 0, allow},
		{"netlink", x86, 41, unix.AF_NETLINK, unix.SOCK_RAW, 0, allow},
		{"packet", x86, 41, unix.AF_PACKET, unix.SOCK_STREAM, 0, allow},
		{"unknown type flag stays EINVAL", x86, 41, unix.AF_INET, unix.SOCK_STREAM | 0x100, 0, allow},
		{"seqpacket", x86, 41, unix.AF_INET, unix.SOCK_SEQPACKET, 0, allow},
		{"socketpair", x86, unix.SYS_SOCKETPAIR, unix.AF_INET, unix.SOCK_STREAM, 0, allow},
		{"connect", x86, unix.SYS_CONNECT, unix.AF_INET, unix.SOCK_STREAM, 0, allow},
		{"i386 socketcall not covered", i386, 102, 1, 0, 0, allow},
		{"i386 nr 41 is dup", i386, 41, unix.AF_INET, unix.SOCK_STREAM, 0, allow},
		{"other arch", 0xc00000b7, 198, unix.AF_INET, unix.SOCK_STREAM, 0, allow},
	} {
		got, err := vm.Run(seccompBytes(c.arch, c.nr, [6]uint64{c.d, c.ty, c.pro}))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if uint32(got) != c.want {
			t.Errorf("%s: filter returned %#x, want %#x", c.name, got, c.want)
		}
	}
}

func TestFilterDecisionsConvert(t *testing.T) {
	vm, err := bpf.NewVM(filterProgramFor(true))
	if err != nil {
		t.Fatal(err)
	}
	const x86, i386 = unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_I386
	const notify, allow = unix.SECCOMP_RET_USER_NOTIF, unix.SECCOMP_RET_ALLOW
	for _, c := range []struct {
		name       string
		arch, nr   uint32
		d, ty, pro uint64
		want       uint32
	}{
		{"tcp4", x86, 41, unix.AF_INET, unix.SOCK_STREAM, 0, notify},
		{"x32 socket", x86, 41 | x32SyscallBit, unix.AF_INET, unix.SOCK_STREAM, 0, notify},
		{"udp", x86, 41, unix.AF_INET, unix.SOCK_DGRAM, 0, allow},
		{"already mptcp", x86, 41, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP, allow},
		{"connect", x86, unix.SYS_CONNECT, 3, 0, 16, notify},
		{"x32 connect", x86, unix.SYS_CONNECT | x32SyscallBit, 3, 0, 16, notify},
		{"i386 connect", i386, 362, 3, 0, 16, notify},
		{"i386 socket", i386, 359, unix.AF_INET6, unix.SOCK_STREAM, 0, notify},
		{"accept", x86, unix.SYS_ACCEPT, 3, 0, 0, allow},
		{"sendto", x86, unix.SYS_SENDTO, 3, 0, 0, allow},
		{"i386 socketcall", i386, 102, 3, 0, 0, allow},
		{"other arch", 0xc00000b7, 203, 3, 0, 16, allow},
	} {
		got, err := vm.Run(seccompBytes(c.arch, c.nr, [6]uint64{c.d, c.ty, c.pro}))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if uint32(got) != c.want {
			t.Errorf("%s: filter returned %#x, want %#x", c.name, got, c.want)
		}
	}
	if _, err := assembleFilter(true); err != nil {
		t.Fatal(err)
	}
}

func TestAssembleFilter(t *testing.T) {
	p, err := assembleFilter(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != len(filterProgram()) || len(p) > 4096 {
		t.Fatalf("assembled %d instructions", len(p))
	}
}

func TestParseStatusFsIDs(t *testing.T) {
	st := "Name:\tx\nUmask:\t0022\nUid:\t1000\t1001\t1002\t1003\nGid:\t20\t21\t22\t23\nFDSize:\t64\n"
	uid, gid, err := parseStatusFsIDs([]byte(st))
	if err != nil || uid != 1003 || gid != 23 {
		t.Fatalf("got %d %d %v, want 1003 23", uid, gid, err)
	}
	for _, bad := range []string{"", "Uid:\t1\t2\t3\n", "Uid:\t1 2 3 x\nGid:\t1 2 3 4\n", "Uid:\t1 2 3\nGid:\t1 2 3 4\n"} {
		if _, _, err := parseStatusFsIDs([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseStatusFsIDs(f *testing.F) {
	f.Add([]byte("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"))
	f.Add([]byte("Uid:\t1\t2\nGid:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uid, gid, err := parseStatusFsIDs(b)
		if err == nil && (uid < 0 || gid < 0) {
			t.Fatalf("negative ids without error: %d %d", uid, gid)
		}
	})
}

func TestWithPreload(t *testing.T) {
	got := withPreload([]string{"A=1", "LD_PRELOAD=/x.so"}, "/w.so")
	if len(got) != 2 || got[0] != "A=1" || got[1] != "LD_PRELOAD=/w.so:/x.so" {
		t.Fatalf("got %q", got)
	}
	got = withPreload([]string{"A=1"}, "/w.so")
	if got[len(got)-1] != "LD_PRELOAD=/w.so" {
		t.Fatalf("got %q", got)
	}
}

func TestKernelAtLeast(t *testing.T) {
	for rel, want := range map[string]bool{"6.18.44-fc": true, "5.14.0": true, "5.13.19": false, "4.19": false, "x": false, "10.0": true} {
		if kernelAtLeast(rel, 5, 14) != want {
			t.Errorf("%s: want %v", rel, want)
		}
	}
}

func TestParseMechanism(t *testing.T) {
	for _, s := range []string{"auto", "seccomp", "preload"} {
		if _, err := ParseMechanism(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseMechanism("bpf"); err == nil {
		t.Error("bpf accepted")
	}
}

func TestPidfdInfoSize(t *testing.T) {
	if n := unsafe.Sizeof(pidfdInfo{}); n != 64 {
		t.Fatalf("pidfdInfo is %d bytes, want 64 (PIDFD_INFO_SIZE_VER0)", n)
	}
}
