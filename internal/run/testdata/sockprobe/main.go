// Command sockprobe is a statically linked test program (CGO_ENABLED=0, raw
// syscalls, no libc) that reports what the kernel made of its sockets, so
// the run tests can check "mpdetour run" from inside the program.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sock describes one socket() call.
type Sock struct {
	Proto    int    `json:"proto"`
	Domain   int    `json:"domain"`
	Type     int    `json:"type"`
	NonBlock bool   `json:"nonblock"`
	CloExec  bool   `json:"cloexec"`
	Errno    string `json:"errno,omitempty"`
}

func probe(domain, typ, proto int) Sock {
	fd, err := unix.Socket(domain, typ, proto)
	return describe(fd, err)
}

// probeDirect calls the socket syscall itself: on 386, Go's own Socket goes
// through socketcall(2), which the filter cannot inspect, while C libraries
// use the direct socket syscall (359) since Linux 4.3.
func probeDirect(domain, typ, proto int) Sock {
	r, _, errno := unix.RawSyscall(unix.SYS_SOCKET, uintptr(domain), uintptr(typ), uintptr(proto))
	if errno != 0 {
		return describe(-1, errno)
	}
	return describe(int(r), nil)
}

func describe(fd int, err error) Sock {
	if err != nil {
		return Sock{Proto: -1, Errno: err.(syscall.Errno).Error()}
	}
	defer unix.Close(fd)
	var s Sock
	s.Proto, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	s.Domain, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	s.Type, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	fdfl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	s.NonBlock = fl&unix.O_NONBLOCK != 0
	s.CloExec = fdfl&unix.FD_CLOEXEC != 0
	return s
}

func connProto(c net.Conn) int {
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return -1
	}
	p := -1
	rc.Control(func(fd uintptr) { p, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) })
	return p
}

func emit(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sockprobe report|dial ADDR|serve ADDR|bench N")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "report":
		emit(map[string]Sock{
			"tcp4":           probe(unix.AF_INET, unix.SOCK_STREAM, 0),
			"tcp6":           probe(unix.AF_INET6, unix.SOCK_STREAM, 0),
			"tcp4_ipproto":   probe(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP),
			"tcp4_flags":     probe(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0),
			"tcp6_cloexec":   probe(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP),
			"tcp4_badflag":   probe(unix.AF_INET, unix.SOCK_STREAM|0x100, 0),
			"explicit_mptcp": probe(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP),
			"udp4":           probe(unix.AF_INET, unix.SOCK_DGRAM, 0),
			"udp6":           probe(unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP),
			"unix_stream":    probe(unix.AF_UNIX, unix.SOCK_STREAM, 0),
			"unix_dgram":     probe(unix.AF_UNIX, unix.SOCK_DGRAM, 0),
			"tcp4_direct":    probeDirect(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0),
			"udp4_direct":    probeDirect(unix.AF_INET, unix.SOCK_DGRAM, 0),
		})
	case "dial":
		// Go's Dialer uses plain TCP by default, so any MPTCP comes from outside.
		c, err := net.DialTimeout("tcp", os.Args[2], 5*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Fprintln(c, "ping")
		reply, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		emit(map[string]any{"proto": connProto(c), "reply": reply})
	case "serve":
		var lc net.ListenConfig
		lc.SetMultipathTCP(false) // Go 1.24+ listens with MPTCP by default
		l, err := lc.Listen(context.Background(), "tcp", os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var lp int
		rc, _ := l.(*net.TCPListener).SyscallConn()
		rc.Control(func(fd uintptr) { lp, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) })
		fmt.Printf("listening %d\n", lp)
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "pong %d\n", connProto(c))
		c.Close()
		emit(map[string]any{"listener": lp, "accepted": connProto(c), "got": line})
	case "bench":
		n, err := strconv.Atoi(os.Args[2])
		if err != nil || n <= 0 {
			fmt.Fprintln(os.Stderr, "bad count")
			os.Exit(2)
		}
		typ, proto := unix.SOCK_STREAM, 0
		if len(os.Args) > 3 {
			switch os.Args[3] {
			case "udp":
				typ = unix.SOCK_DGRAM
			case "mptcp": // the cost of an MPTCP socket itself, without supervisor
				proto = unix.IPPROTO_MPTCP
			}
		}
		start := time.Now()
		for i := 0; i < n; i++ {
			fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, proto)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			unix.Close(fd)
		}
		fmt.Println(time.Since(start).Nanoseconds() / int64(n))
	case "deny-seccomp":
		// Exec the rest of the command line under a filter that refuses
		// seccomp(2) with EPERM, as some container runtimes do.
		prog := []unix.SockFilter{
			{Code: 0x20, K: 0}, // ld [nr]
			{Code: 0x15, Jt: 0, Jf: 1, K: uint32(unix.SYS_SECCOMP)},
			{Code: 0x06, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
			{Code: 0x06, K: unix.SECCOMP_RET_ALLOW},
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); e != 0 {
			fmt.Fprintln(os.Stderr, "seccomp:", e)
			os.Exit(1)
		}
		err := syscall.Exec(os.Args[2], os.Args[2:], os.Environ())
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode")
		os.Exit(2)
	}
}
