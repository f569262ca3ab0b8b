package breaks

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

const (
	// junkSources: more distinct spoofed sources than the per-address
	// table of the builds before the fix held (100,000), each sending one
	// 32-byte transport packet naming no session.
	junkSources = 131_000
	// junkRate paces them (packets/s) so that a relay on loaded cores
	// reads them rather than its socket dropping them (the drops are
	// reported).
	junkRate = 8000
	// junkGrant: the bound for a genuine member's handshake and
	// grant.
	junkGrant = time.Second
	// junkWait: how long the member waits for its grant before the case
	// calls it locked out.
	junkWait = 5 * time.Second
)

// junkFrom is where the spoofed sources come from (RFC 2544's
// benchmarking range, 131,072 addresses, routed nowhere in the lab).
var junkFrom = netip.MustParsePrefix("198.18.0.0/15")

func spoofedJunk(ctx context.Context, o Options) Result {
	r := Result{Break: 1, Metric: "new member's handshake+grant after the junk, s", Target: "<= 1"}
	l, keys, err := begin(ctx, o, "j", 2)
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	relayKey, memberKey := keys[0], keys[1]
	relayAddr := netip.AddrPortFrom(l.Addr("detour1"), relayPort)
	server := netip.AddrPortFrom(l.Addr("server"), 5201)
	if _, err := l.startRelay(ctx, o, "detour1", "relay", fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 1m\nallow_destinations: [%s/32]\nmembers:\n  - {name: client, public_key: %s}\n",
		relayAddr, relayKey, server.Addr(), memberKey.Public())); err != nil {
		return r.failed(err)
	}
	// The relay is up when it answers on its port (a refusal of junk
	// from the client's own address would be counted as seen; instead
	// wait for the status).
	up := false
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && !up; time.Sleep(200 * time.Millisecond) {
		_, err := l.output(ctx, "detour1", o.Binary, "relay", "status", "--json")
		up = err == nil
	}
	if !up {
		r.Error = fmt.Sprintf("the relay did not answer its status within 15 s (log in %s)", o.Dir)
		return r
	}
	return r.judge(junkAttack(ctx, l, "detour1", relayconn.Relay{Name: "detour1", Addr: relayAddr, PublicKey: relayKey.Public()}, memberKey, server, "a member from a new address"))
}

// junkAttack sends the junk from the client node at relay (in node), then
// asks relay for a grant to server as member on a new session from the
// client node (who: how the detail names it): the seconds that took (junkWait when refused or
// unanswered), whether within junkGrant, and what it saw. An error: the
// attack could not be made.
func junkAttack(ctx context.Context, l *caseLab, node string, relay relayconn.Relay, member proto.Key, server netip.AddrPort, who string) (float64, bool, string, error) {
	var sent int
	drops0 := udpDrops(l, node)
	t0 := time.Now()
	if err := l.do("client", func() error {
		var err error
		sent, err = sendJunk(relay.Addr, junkSources)
		return err
	}); err != nil {
		return 0, false, "", fmt.Errorf("sending the junk: %w", err)
	}
	sendTime := time.Since(t0)
	time.Sleep(500 * time.Millisecond) // let the relay read what is queued
	dropped := udpDrops(l, node) - drops0
	c, err := l.dialRelay(relay, member, nil)
	if err != nil {
		return 0, false, "", err
	}
	defer c.Close()
	gctx, cancel := context.WithTimeout(ctx, junkWait)
	defer cancel()
	t1 := time.Now()
	_, _, gerr := c.Grant(gctx, server, 0)
	took := time.Since(t1)
	value := took.Round(time.Millisecond).Seconds()
	detail := fmt.Sprintf("%d spoofed 32-byte transport packets from %d sources of %s sent in %s (%d dropped at the relay's socket, UDP RcvbufErrors); then %s: ", sent, junkSources, junkFrom, sendTime.Round(time.Millisecond), dropped, who)
	if gerr != nil {
		detail += fmt.Sprintf("no grant within %s (%v)", junkWait, gerr)
	} else {
		detail += fmt.Sprintf("handshake and grant in %s", took.Round(time.Millisecond))
	}
	return value, gerr == nil && took <= junkGrant, detail, nil
}

// sendJunk sends one junk transport packet (no session) from each of n
// spoofed sources to dst through a raw socket of the calling thread's
// namespace.
func sendJunk(dst netip.AddrPort, n int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20); err != nil {
		return 0, err
	}
	to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	pkt := make([]byte, 20+8+32)
	pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	copy(pkt[16:20], to.Addr[:])
	binary.BigEndian.PutUint16(pkt[22:], dst.Port())
	binary.BigEndian.PutUint16(pkt[24:], 8+32) // UDP checksum 0: none
	pkt[28], pkt[29] = proto.TypeTransport, proto.Version
	base := binary.BigEndian.Uint32(junkFrom.Addr().AsSlice())
	sent := 0
	start := time.Now()
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint32(pkt[12:16], base+uint32(i)+1)
		binary.BigEndian.PutUint16(pkt[20:], uint16(1024+i%60000))
		binary.BigEndian.PutUint32(pkt[32:], uint32(i)+1) // receiver index: no session
		for {
			err := unix.Sendto(fd, pkt, 0, to)
			if err == nil {
				sent++
				break
			}
			if err != unix.ENOBUFS && err != unix.EAGAIN {
				return sent, err
			}
			time.Sleep(time.Millisecond)
		}
		if i%500 == 499 {
			if d := time.Until(start.Add(time.Duration(i+1) * time.Second / junkRate)); d > 0 {
				time.Sleep(d)
			}
		}
	}
	return sent, nil
}

// udpDrops is node's UDP RcvbufErrors (datagrams a full socket buffer
// dropped), -1 when unreadable.
func udpDrops(l *caseLab, node string) int64 {
	n := int64(-1)
	l.do(node, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Udp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i := range f {
				if i < len(names) && names[i] == "RcvbufErrors" {
					n, _ = strconv.ParseInt(f[i], 10, 64)
				}
			}
		}
		return nil
	})
	return n
}
