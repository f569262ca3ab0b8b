package benchtool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MPTCP socket options from upstream include/uapi/linux/mptcp.h; Debian's
// 6.1 headers and x/sys lack MPTCP_FULL_INFO, so the layouts are defined here.
const (
	solMPTCP        = 284
	optTCPInfo      = 2
	optSubflowAddrs = 3
	optFullInfo     = 4
	ipprotoMPTCP    = 262
)

// mptcpFullInfo mirrors struct mptcp_full_info (upstream, kernel >= 6.6).
type mptcpFullInfoT struct {
	SizeTCPInfoKernel uint32
	SizeTCPInfoUser   uint32
	SizeSfInfoKernel  uint32
	SizeSfInfoUser    uint32
	NumSubflows       uint32
	SizeArraysUser    uint32
	SubflowInfo       uint64 // user pointer to []mptcpSubflowInfo
	TCPInfo           uint64 // user pointer to []unix.TCPInfo
	MPTCPInfo         [96]byte
}

// mptcpSubflowAddrs mirrors struct mptcp_subflow_addrs: two
// __kernel_sockaddr_storage unions.
type mptcpSubflowAddrs struct {
	Local, Remote [128]byte
}

// mptcpSubflowInfo mirrors struct mptcp_subflow_info: the id is padded to the
// 8-byte alignment of sockaddr_storage.
type mptcpSubflowInfo struct {
	ID    uint32
	_     uint32
	Addrs mptcpSubflowAddrs
}

// mptcpSubflowData mirrors struct mptcp_subflow_data, the header of the
// MPTCP_TCPINFO and MPTCP_SUBFLOW_ADDRS arrays.
type mptcpSubflowData struct {
	SizeSubflowData uint32
	NumSubflows     uint32
	SizeKernel      uint32
	SizeUser        uint32
}

// rawSubflow is one subflow's kernel view at one instant.
type rawSubflow struct {
	id            uint32
	local, remote netip.AddrPort
	info          unix.TCPInfo
}

func getsockopt(fd uintptr, level, opt int, p unsafe.Pointer, l *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// mptcpSubflows returns every subflow of an MPTCP socket, with MPTCP_FULL_INFO
// when the kernel has it and MPTCP_TCPINFO + MPTCP_SUBFLOW_ADDRS otherwise.
func mptcpSubflows(fd uintptr) ([]rawSubflow, error) {
	sfs, err := fullInfo(fd)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOPROTOOPT) || errors.Is(err, unix.EINVAL) {
		return splitInfo(fd)
	}
	return sfs, err
}

func fullInfo(fd uintptr) ([]rawSubflow, error) {
	for n := 8; ; n *= 4 {
		sfi := make([]mptcpSubflowInfo, n)
		tis := make([]unix.TCPInfo, n)
		// The kernel writes through the two user pointers inside the
		// struct, which the garbage collector cannot see: pin the arrays.
		var pin runtime.Pinner
		pin.Pin(&sfi[0])
		pin.Pin(&tis[0])
		fi := mptcpFullInfoT{
			SizeTCPInfoUser: uint32(unsafe.Sizeof(unix.TCPInfo{})),
			SizeSfInfoUser:  uint32(unsafe.Sizeof(mptcpSubflowInfo{})),
			SizeArraysUser:  uint32(n),
			SubflowInfo:     uint64(uintptr(unsafe.Pointer(&sfi[0]))),
			TCPInfo:         uint64(uintptr(unsafe.Pointer(&tis[0]))),
		}
		l := uint32(unsafe.Sizeof(fi))
		err := getsockopt(fd, solMPTCP, optFullInfo, unsafe.Pointer(&fi), &l)
		pin.Unpin()
		if err != nil {
			return nil, fmt.Errorf("MPTCP_FULL_INFO: %w", err)
		}
		if int(fi.NumSubflows) > n && n < 1024 {
			continue // subflows appeared meanwhile; ask again with room
		}
		k := min(int(fi.NumSubflows), n)
		out := make([]rawSubflow, 0, k)
		for i := range k {
			out = append(out, rawSubflow{id: sfi[i].ID, local: sockaddr(sfi[i].Addrs.Local[:]),
				remote: sockaddr(sfi[i].Addrs.Remote[:]), info: tis[i]})
		}
		return out, nil
	}
}

// splitInfo is the pre-6.6 path: two getsockopts whose arrays the kernel
// fills in the same subflow-list order. Subflow ids are not available.
func splitInfo(fd uintptr) ([]rawSubflow, error) {
	const n = 32
	var ti struct {
		H mptcpSubflowData
		A [n]unix.TCPInfo
	}
	ti.H = mptcpSubflowData{SizeSubflowData: 16, SizeUser: uint32(unsafe.Sizeof(unix.TCPInfo{}))}
	l := uint32(unsafe.Sizeof(ti))
	if err := getsockopt(fd, solMPTCP, optTCPInfo, unsafe.Pointer(&ti), &l); err != nil {
		return nil, fmt.Errorf("MPTCP_TCPINFO: %w", err)
	}
	var ad struct {
		H mptcpSubflowData
		A [n]mptcpSubflowAddrs
	}
	ad.H = mptcpSubflowData{SizeSubflowData: 16, SizeUser: uint32(unsafe.Sizeof(mptcpSubflowAddrs{}))}
	l = uint32(unsafe.Sizeof(ad))
	if err := getsockopt(fd, solMPTCP, optSubflowAddrs, unsafe.Pointer(&ad), &l); err != nil {
		return nil, fmt.Errorf("MPTCP_SUBFLOW_ADDRS: %w", err)
	}
	k := min(int(ti.H.NumSubflows), int(ad.H.NumSubflows), n)
	out := make([]rawSubflow, 0, k)
	for i := range k {
		out = append(out, rawSubflow{local: sockaddr(ad.A[i].Local[:]), remote: sockaddr(ad.A[i].Remote[:]), info: ti.A[i]})
	}
	return out, nil
}

// sockaddr decodes a sockaddr_in or sockaddr_in6 from a sockaddr_storage.
func sockaddr(b []byte) netip.AddrPort {
	if len(b) < 28 {
		return netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(b[2:])
	switch binary.NativeEndian.Uint16(b) {
	case unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), port)
	}
	return netip.AddrPort{}
}

// tcpInfo returns TCP_INFO of a plain TCP socket (or of an MPTCP socket
// that fell back to TCP).
func tcpInfo(fd uintptr) (unix.TCPInfo, error) {
	ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return unix.TCPInfo{}, fmt.Errorf("TCP_INFO: %w", err)
	}
	return *ti, nil
}

// socketProtocol returns SO_PROTOCOL: 6 for TCP, 262 for MPTCP.
func socketProtocol(fd uintptr) int {
	p, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return 0
	}
	return p
}

func setCongestion(fd uintptr, cc string) error {
	if err := unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc); err != nil {
		return fmt.Errorf("congestion control %q: %w (see net.ipv4.tcp_available_congestion_control)", cc, err)
	}
	return nil
}

func getCongestion(fd uintptr) string {
	s, err := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil {
		return ""
	}
	return s
}
