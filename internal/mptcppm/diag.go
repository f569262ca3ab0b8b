package mptcppm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// inet_diag constants (uapi inet_diag.h, sock_diag.h).
const (
	sockDiagByFamily  = 20
	diagReqProtocol   = 3  // INET_DIAG_REQ_PROTOCOL: u32, for protocols > 255
	diagInfo          = 2  // INET_DIAG_INFO
	diagULPInfo       = 19 // INET_DIAG_ULP_INFO
	ulpInfoName       = 1  // INET_ULP_INFO_NAME
	ulpInfoMPTCP      = 3  // INET_ULP_INFO_MPTCP
	diagMsgLen        = 72 // struct inet_diag_msg
	sfTokenRem        = 1  // MPTCP_SUBFLOW_ATTR_TOKEN_REM
	sfTokenLoc        = 2
	sfFlags           = 8
	sfIDRem           = 9
	sfIDLoc           = 10
	tcpListen         = 10
	tcpTimeWait       = 6
	tcpNewSynRecv     = 12
	subflowBackupLoc  = 1 << 5 // MPTCP_SUBFLOW_FLAG_BKUP_LOC
	subflowBackupRem  = 1 << 4
	subflowFullyEstab = 1 << 6
)

// MPTCPInfo is struct mptcp_info (fields up to Linux 6.10; shorter kernel
// structs leave the tail zero).
type MPTCPInfo struct {
	Subflows, AddAddrSignal, AddAddrAccepted           uint8
	SubflowsMax, AddAddrSignalMax, AddAddrAcceptedMax  uint8
	Flags, Token                                       uint32
	WriteSeq, SndUna, RcvNxt                           uint64
	LocalAddrUsed, LocalAddrMax, CsumEnabled           uint8
	Retransmits                                        uint32
	BytesRetrans, BytesSent, BytesReceived, BytesAcked uint64
	SubflowsTotal                                      uint8
	LastDataSent, LastDataRecv, LastAckRecv            uint32 // ms
}

// DecodeMPTCPInfo parses struct mptcp_info as inet_diag or getsockopt
// return it (little fields beyond len(b) stay zero).
func DecodeMPTCPInfo(b []byte) (MPTCPInfo, error) {
	var i MPTCPInfo
	if len(b) < 16 {
		return i, fmt.Errorf("mptcp_info of %d bytes, want at least 16", len(b))
	}
	ne := binary.NativeEndian
	u8 := func(off int) uint8 {
		if off < len(b) {
			return b[off]
		}
		return 0
	}
	u32 := func(off int) uint32 {
		if off+4 <= len(b) {
			return ne.Uint32(b[off:])
		}
		return 0
	}
	u64 := func(off int) uint64 {
		if off+8 <= len(b) {
			return ne.Uint64(b[off:])
		}
		return 0
	}
	i.Subflows, i.AddAddrSignal, i.AddAddrAccepted = u8(0), u8(1), u8(2)
	i.SubflowsMax, i.AddAddrSignalMax, i.AddAddrAcceptedMax = u8(3), u8(4), u8(5)
	i.Flags, i.Token = u32(8), u32(12)
	i.WriteSeq, i.SndUna, i.RcvNxt = u64(16), u64(24), u64(32)
	i.LocalAddrUsed, i.LocalAddrMax, i.CsumEnabled = u8(40), u8(41), u8(42)
	i.Retransmits = u32(44)
	i.BytesRetrans, i.BytesSent, i.BytesReceived, i.BytesAcked = u64(48), u64(56), u64(64), u64(72)
	i.SubflowsTotal = u8(80)
	i.LastDataSent, i.LastDataRecv, i.LastAckRecv = u32(84), u32(88), u32(92)
	return i, nil
}

// InfoFlagFallback (MPTCP_INFO_FLAG_FALLBACK): the connection fell back
// to plain TCP; it can never take another subflow.
const InfoFlagFallback = 1 << 0

// Connection is one MPTCP socket found by inet_diag.
type Connection struct {
	Token  uint32
	Local  netip.AddrPort
	Remote netip.AddrPort
	State  uint8 // TCP state numbering (1 = ESTABLISHED)
	// ServerSide: the connection was accepted from an MPTCP listener of
	// this namespace (inet_diag does not say so directly).
	ServerSide bool
	// Inet6: the socket is AF_INET6 (Local and Remote are unmapped, so an
	// IPv4 connection of an AF_INET6 socket shows only here; only such a
	// socket can carry subflows of the other family).
	Inet6    bool
	Info     MPTCPInfo
	Subflows []Subflow
}

// Subflow is one TCP subflow of an MPTCP connection found by inet_diag.
type Subflow struct {
	Token       uint32 // the connection's local token
	RemoteToken uint32
	LocalID     uint8
	RemoteID    uint8
	Flags       uint32 // MPTCP_SUBFLOW_FLAG_*
	Local       netip.AddrPort
	Remote      netip.AddrPort
	State       uint8
	// Retransmits counts consecutive retransmission timeouts (tcpi_retransmits):
	// a path that swallows everything makes it grow.
	Retransmits   uint8
	RTT           time.Duration
	BytesSent     uint64
	BytesReceived uint64
	BytesAcked    uint64
	BytesRetrans  uint64
	// The rest of struct tcp_info the path manager judges a path by.
	RTTVar, MinRTT time.Duration
	TotalRetrans   uint32 // segments retransmitted over the subflow's life
	Unacked        uint32 // segments in flight
	Lost           uint32
	SegsOut        uint32
	DeliveryRate   uint64 // bytes per second, the kernel's estimate
	// What limits the sender (backup-first judges by these): the
	// congestion window and MSS, the kernel's pacing rate (bytes/s), the
	// bytes the socket holds not yet sent, whether the last delivery-rate
	// sample was application limited, and the time (microseconds, over the
	// subflow's life) it was busy sending, of which limited by the peer's
	// receive window and by its own send buffer.
	SndCwnd, SndMSS                      uint32
	PacingRate                           uint64
	NotsentBytes                         uint32
	AppLimited                           bool
	BusyTime, RwndLimited, SndbufLimited uint64
	// Time since the subflow last sent data, received data and received an ACK.
	SinceDataSent, SinceDataRecv, SinceAckRecv time.Duration
}

// Backup reports whether this end marked the subflow as backup.
func (s Subflow) Backup() bool { return s.Flags&subflowBackupLoc != 0 }

// Dump lists the MPTCP connections of namespace o.NetNS (not listeners)
// with their subflows, sorted by token.
func Dump(o Options) ([]Connection, error) {
	c, err := dialDiag(o)
	if err != nil {
		return nil, err
	}
	defer c.Close()

	listeners := map[netip.AddrPort]bool{}
	for _, fam := range []uint8{afInet, afInet6} {
		msgs, err := diagDumpStates(c, fam, protoMPTCP, 1<<tcpListen)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			_, l, _, _, err := diagHeader(m)
			if err != nil {
				return nil, err
			}
			listeners[l] = true
		}
	}
	byToken := map[uint32]*Connection{}
	var order []uint32
	for _, fam := range []uint8{afInet, afInet6} {
		msgs, err := diagDump(c, fam, protoMPTCP)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			conn, err := parseMPTCPDiag(m)
			if err != nil {
				return nil, err
			}
			if _, dup := byToken[conn.Token]; !dup {
				order = append(order, conn.Token)
			}
			any4, any6 := netip.IPv4Unspecified(), netip.IPv6Unspecified()
			conn.ServerSide = listeners[conn.Local] || listeners[netip.AddrPortFrom(any4, conn.Local.Port())] ||
				listeners[netip.AddrPortFrom(any6, conn.Local.Port())]
			cc := conn
			byToken[conn.Token] = &cc
		}
	}
	sfs, err := dumpSubflows(c)
	if err != nil {
		return nil, err
	}
	for _, sf := range sfs {
		if conn := byToken[sf.Token]; conn != nil {
			conn.Subflows = append(conn.Subflows, sf)
		}
	}
	out := make([]Connection, 0, len(order))
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	for _, t := range order {
		out = append(out, *byToken[t])
	}
	return out, nil
}

// DumpSubflows lists only the MPTCP subflows (TCP sockets with MPTCP ULP
// info) of namespace o.NetNS: the cheaper half of Dump, for periodic
// health checks.
func DumpSubflows(o Options) ([]Subflow, error) {
	c, err := dialDiag(o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return dumpSubflows(c)
}

// dialDiag opens a sock_diag socket inside namespace o.NetNS.
func dialDiag(o Options) (*netlink.Conn, error) {
	fd, done, err := openNS(o.NetNS)
	if err != nil {
		return nil, err
	}
	defer done()
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: fd})
	if err != nil {
		return nil, fmt.Errorf("sock_diag netlink: %w", err)
	}
	return c, nil
}

// dumpSubflows lists the TCP sockets that carry MPTCP subflow info.
func dumpSubflows(c *netlink.Conn) ([]Subflow, error) {
	var out []Subflow
	for _, fam := range []uint8{afInet, afInet6} {
		msgs, err := diagDump(c, fam, unix.IPPROTO_TCP)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			sf, ok, err := parseSubflowDiag(m)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out, sf)
			}
		}
	}
	return out, nil
}

func diagDump(c *netlink.Conn, family uint8, proto uint32) ([][]byte, error) {
	return diagDumpStates(c, family, proto, uint32(0xfff)&^(1<<tcpListen|1<<tcpTimeWait|1<<tcpNewSynRecv))
}

// diagRequest is struct inet_diag_req_v2 for TCP-family sockets of proto
// in the given states, asking for INET_DIAG_INFO, with the socket cookie
// (INET_DIAG_NOCOOKIE for a dump; MPTCP's exact lookup takes the token
// from cookie[0]), and the protocol attribute for protocols that do not
// fit in its byte (MPTCP, 262).
func diagRequest(family uint8, proto, states uint32, cookie [2]uint32) ([]byte, error) {
	req := make([]byte, 56)
	req[0] = family
	req[1] = unix.IPPROTO_TCP // MPTCP (262) does not fit: see the protocol attribute
	req[2] = 1 << (diagInfo - 1)
	binary.NativeEndian.PutUint32(req[4:], states)
	binary.NativeEndian.PutUint32(req[48:], cookie[0])
	binary.NativeEndian.PutUint32(req[52:], cookie[1])
	if proto != unix.IPPROTO_TCP {
		ab, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: diagReqProtocol, Data: binary.NativeEndian.AppendUint32(nil, proto)}})
		if err != nil {
			return nil, err
		}
		req = append(req, ab...)
	}
	return req, nil
}

func diagDumpStates(c *netlink.Conn, family uint8, proto, states uint32) ([][]byte, error) {
	// cookie = INET_DIAG_NOCOOKIE: no specific socket.
	req, err := diagRequest(family, proto, states, [2]uint32{^uint32(0), ^uint32(0)})
	if err != nil {
		return nil, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
		Data:   req,
	})
	if err != nil {
		return nil, fmt.Errorf("inet_diag dump (family %d, protocol %d): %w", family, proto, err)
	}
	out := make([][]byte, 0, len(msgs))
	for _, m := range msgs {
		if m.Header.Type == sockDiagByFamily {
			out = append(out, m.Data)
		}
	}
	return out, nil
}

// diagHeader parses struct inet_diag_msg: state and the socket's addresses.
func diagHeader(b []byte) (state uint8, local, remote netip.AddrPort, attrs []netlink.Attribute, err error) {
	if len(b) < diagMsgLen {
		return 0, local, remote, nil, fmt.Errorf("inet_diag message of %d bytes", len(b))
	}
	fam, state := b[0], b[1]
	sport := binary.BigEndian.Uint16(b[4:])
	dport := binary.BigEndian.Uint16(b[6:])
	var src, dst netip.Addr
	switch fam {
	case afInet:
		src, dst = netip.AddrFrom4([4]byte(b[8:12])), netip.AddrFrom4([4]byte(b[24:28]))
	case afInet6:
		src, dst = netip.AddrFrom16([16]byte(b[8:24])).Unmap(), netip.AddrFrom16([16]byte(b[24:40])).Unmap()
	default:
		return 0, local, remote, nil, fmt.Errorf("inet_diag message of family %d", fam)
	}
	attrs, err = netlink.UnmarshalAttributes(b[diagMsgLen:])
	if err != nil {
		return 0, local, remote, nil, fmt.Errorf("inet_diag attributes: %w", err)
	}
	return state, netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport), attrs, nil
}

func parseMPTCPDiag(b []byte) (Connection, error) {
	state, l, r, attrs, err := diagHeader(b)
	if err != nil {
		return Connection{}, err
	}
	conn := Connection{Local: l, Remote: r, State: state, Inet6: len(b) > 0 && b[0] == afInet6}
	for _, a := range attrs {
		if a.Type&0x3fff == diagInfo {
			conn.Info, err = DecodeMPTCPInfo(a.Data)
			if err != nil {
				return conn, err
			}
			conn.Token = conn.Info.Token
		}
	}
	return conn, nil
}

// parseSubflowDiag returns ok=false for TCP sockets that are not MPTCP subflows.
func parseSubflowDiag(b []byte) (Subflow, bool, error) {
	state, l, r, attrs, err := diagHeader(b)
	if err != nil {
		return Subflow{}, false, err
	}
	sf := Subflow{Local: l, Remote: r, State: state}
	isMPTCP := false
	for _, a := range attrs {
		switch a.Type & 0x3fff {
		case diagInfo:
			decodeTCPInfo(a.Data, &sf)
		case diagULPInfo:
			ulp, err := netlink.UnmarshalAttributes(a.Data)
			if err != nil {
				return sf, false, fmt.Errorf("inet_diag ULP info: %w", err)
			}
			for _, u := range ulp {
				if u.Type&0x3fff != ulpInfoMPTCP {
					continue
				}
				isMPTCP = true
				sa, err := netlink.UnmarshalAttributes(u.Data)
				if err != nil {
					return sf, false, fmt.Errorf("inet_diag MPTCP subflow info: %w", err)
				}
				for _, s := range sa {
					d := s.Data
					switch s.Type & 0x3fff {
					case sfTokenRem:
						if len(d) == 4 {
							sf.RemoteToken = binary.NativeEndian.Uint32(d)
						}
					case sfTokenLoc:
						if len(d) == 4 {
							sf.Token = binary.NativeEndian.Uint32(d)
						}
					case sfFlags:
						if len(d) == 4 {
							sf.Flags = binary.NativeEndian.Uint32(d)
						}
					case sfIDRem:
						if len(d) == 1 {
							sf.RemoteID = d[0]
						}
					case sfIDLoc:
						if len(d) == 1 {
							sf.LocalID = d[0]
						}
					}
				}
			}
		}
	}
	return sf, isMPTCP, nil
}

// decodeTCPInfo picks the struct tcp_info fields status and the path
// manager need (offsets from uapi linux/tcp.h; shorter structs from older
// kernels leave the tail zero).
func decodeTCPInfo(b []byte, sf *Subflow) {
	ne := binary.NativeEndian
	if len(b) >= 3 {
		sf.Retransmits = b[2]
	}
	ms := func(off int) time.Duration { return time.Duration(ne.Uint32(b[off:])) * time.Millisecond }
	us := func(off int) time.Duration { return time.Duration(ne.Uint32(b[off:])) * time.Microsecond }
	if len(b) >= 8 {
		sf.AppLimited = b[7]&1 != 0 // tcpi_delivery_rate_app_limited
	}
	if len(b) >= 60 {
		sf.SndMSS = ne.Uint32(b[16:])
		sf.Unacked, sf.Lost = ne.Uint32(b[24:]), ne.Uint32(b[32:])
		sf.SinceDataSent, sf.SinceDataRecv, sf.SinceAckRecv = ms(44), ms(52), ms(56)
	}
	if len(b) >= 104 {
		sf.RTT, sf.RTTVar = us(68), us(72)
		sf.TotalRetrans = ne.Uint32(b[100:])
	}
	if len(b) >= 112 {
		sf.SndCwnd = ne.Uint32(b[80:])
		sf.PacingRate = ne.Uint64(b[104:])
	}
	if len(b) >= 168 {
		sf.SegsOut = ne.Uint32(b[136:])
		sf.MinRTT = us(148)
		sf.DeliveryRate = ne.Uint64(b[160:])
		sf.NotsentBytes = ne.Uint32(b[144:])
	}
	if len(b) >= 192 {
		sf.BusyTime, sf.RwndLimited, sf.SndbufLimited = ne.Uint64(b[168:]), ne.Uint64(b[176:]), ne.Uint64(b[184:])
	}
	if len(b) >= 136 {
		sf.BytesAcked = ne.Uint64(b[120:])
		sf.BytesReceived = ne.Uint64(b[128:])
	}
	if len(b) >= 216 {
		sf.BytesSent = ne.Uint64(b[200:])
		sf.BytesRetrans = ne.Uint64(b[208:])
	}
}

// FindSubflow dumps o's MPTCP connections and returns the first subflow
// that match accepts of the connection whose local address (its first
// subflow's) is local; found is false when there is none. An error is the
// dump's: no evidence either way about the subflow.
func FindSubflow(o Options, local netip.AddrPort, match func(Subflow) bool) (s Subflow, found bool, err error) {
	conns, err := Dump(o)
	if err != nil {
		return Subflow{}, false, err
	}
	for _, mc := range conns {
		if mc.Local != local {
			continue
		}
		for _, s := range mc.Subflows {
			if match(s) {
				return s, true, nil
			}
		}
	}
	return Subflow{}, false, nil
}

// ConnState asks inet_diag for the MPTCP-level state of the connection
// with local token tok in namespace o.NetNS (TCP state numbering: 1 =
// ESTABLISHED; after the peer's DATA_FIN it is CLOSE_WAIT or later).
// found is false when the kernel knows no such token (the connection is
// gone); a kernel without MPTCP socket diagnostics is an error, not
// "gone" (both answer the lookup with ENOENT). It is one exact lookup, not a dump: mptcp_diag's dump_one takes
// the token from the request's cookie (net/mptcp/mptcp_diag.c).
func ConnState(o Options, tok uint32) (state uint8, found bool, err error) {
	c, err := dialDiag(o)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	// The handler answers with the socket's own family; mptcp_info
	// carries the token.
	req, err := diagRequest(afInet, protoMPTCP, 0xfff, [2]uint32{tok, 0})
	if err != nil {
		return 0, false, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request},
		Data:   req,
	})
	if errors.Is(err, unix.ENOENT) {
		// ENOENT is also inet_diag's answer when no handler serves the
		// protocol (a kernel without mptcp_diag): "gone" only if a dump
		// of MPTCP sockets works (listeners only: no output to speak of).
		if _, derr := diagDumpStates(c, afInet, protoMPTCP, 1<<tcpListen); derr != nil {
			return 0, false, fmt.Errorf("inet_diag lookup of token %08x: MPTCP socket diagnostics unavailable (mptcp_diag, CONFIG_INET_MPTCP_DIAG): %w", tok, derr)
		}
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("inet_diag lookup of token %08x: %w", tok, err)
	}
	for _, m := range msgs {
		if m.Header.Type != sockDiagByFamily {
			continue
		}
		conn, err := parseMPTCPDiag(m.Data)
		if err != nil {
			return 0, false, err
		}
		if conn.Token == tok {
			return conn.State, true, nil
		}
	}
	return 0, false, nil
}
