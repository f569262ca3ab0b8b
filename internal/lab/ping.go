package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// PingResult is the outcome of a series of ICMP echo requests.
type PingResult struct {
	Sent, Received int
	RTTs           []time.Duration // of the replies, in order
}

// Min returns the smallest RTT (0 if none).
func (r PingResult) Min() time.Duration {
	var m time.Duration
	for i, d := range r.RTTs {
		if i == 0 || d < m {
			m = d
		}
	}
	return m
}

// Median returns the median RTT (0 if none).
func (r PingResult) Median() time.Duration {
	if len(r.RTTs) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), r.RTTs...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[len(s)/2]
}

var pingID atomic.Uint32

// Ping sends count ICMP echo requests from node to dst, interval apart,
// each carrying its send time, and collects the replies until timeout
// after the last one. A raw ICMP socket opened inside the node's namespace
// measures what any host would: no helper program is needed.
func (l *Lab) Ping(ctx context.Context, node string, dst netip.Addr, count int, interval, timeout time.Duration) (PingResult, error) {
	var conn *net.IPConn
	err := l.Do(node, func() error {
		network, laddr := "ip4:icmp", "0.0.0.0"
		if dst.Is6() {
			network, laddr = "ip6:ipv6-icmp", "::"
		}
		c, err := net.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		conn = c.(*net.IPConn)
		// Kernel receive timestamps: a measuring process that is slow to
		// wake up must not inflate the RTT it reports.
		rc, err := conn.SyscallConn()
		if err == nil {
			err = rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
			})
		}
		return err
	})
	if err != nil {
		return PingResult{}, fmt.Errorf("%s: icmp socket: %w", node, err)
	}
	defer conn.Close()
	// A raw socket sees every echo reply in the namespace: tell ours apart
	// by an identifier unique to this call.
	id := int(uint32(os.Getpid())^pingID.Add(1)*7919) & 0xffff
	res := PingResult{}
	done := make(chan struct{})
	got := make(map[int]bool)
	var proto int = 1 // ICMP
	var request, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		// Raw ICMPv6 sockets never include the IPv6 header, and the kernel
		// fills in the checksum (RFC 3542).
		proto, request, reply = 58, ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}

	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		oob := make([]byte, 128)
		for {
			n, oobn, _, _, err := conn.ReadMsgIP(buf, oob)
			now := time.Now()
			if err != nil {
				return
			}
			if ts, ok := rxTimestamp(oob[:oobn]); ok {
				now = ts
			}
			pkt := buf[:n]
			// Raw IPv4 sockets may hand over the IP header too.
			if proto == 1 && len(pkt) >= 20 && pkt[0]>>4 == 4 {
				pkt = pkt[int(pkt[0]&0x0f)*4:]
			}
			m, err := icmp.ParseMessage(proto, pkt)
			if err != nil || m.Type != reply {
				continue
			}
			e, ok := m.Body.(*icmp.Echo)
			if !ok || e.ID != id || len(e.Data) < 8 || got[e.Seq] {
				continue
			}
			got[e.Seq] = true
			sent := time.Unix(0, int64(binary.BigEndian.Uint64(e.Data)))
			res.RTTs = append(res.RTTs, now.Sub(sent))
			res.Received++
			if res.Received == count {
				return
			}
		}
	}()
	to := &net.IPAddr{IP: dst.AsSlice()}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := range count {
		payload := make([]byte, 56)
		binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
		msg := icmp.Message{Type: request, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}
		b, _ := msg.Marshal(nil)
		if _, err := conn.WriteTo(b, to); err != nil && !errors.Is(err, net.ErrClosed) {
			conn.Close()
			<-done
			res.Sent = seq
			return res, fmt.Errorf("%s: ping %s: %w", node, dst, err)
		}
		if seq == count-1 {
			break
		}
		select {
		case <-ctx.Done():
			conn.Close()
			<-done
			res.Sent = seq + 1
			return res, ctx.Err()
		case <-tick.C:
		}
	}
	conn.SetReadDeadline(time.Now().Add(timeout))
	<-done
	res.Sent = count
	return res, nil
}

// rxTimestamp extracts SCM_TIMESTAMPNS from a control message.
func rxTimestamp(oob []byte) (time.Time, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			return time.Unix(sec, nsec), true
		}
	}
	return time.Time{}, false
}
