package delayline

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// wire is A -- mid -- B: two endpoint namespaces whose veths meet in a
// middle namespace where the delay line runs, as the lab builds it.
type wire struct {
	A, Mid, B *netnstest.NS
	cfg       Config
}

const (
	addrA = "10.77.0.1"
	addrB = "10.77.0.2"
)

func newWire(t testing.TB, ab, ba time.Duration) *wire {
	t.Helper()
	ws := newWires(t, 1, ab, ba)
	return ws[0]
}

// newWires builds n independent A -- mid -- B wires sharing one middle
// namespace (interfaces a0/b0, a1/b1, ...) and one delay line config.
func newWires(t testing.TB, n int, ab, ba time.Duration) []*wire {
	t.Helper()
	testenv.Root(t)
	mid := netnstest.New(t, "tdM")
	// The middle namespace must stay silent: no IPv6 link-local chatter
	// mixed into the measured traffic.
	if err := mid.Sysctl("net/ipv6/conf/default/disable_ipv6", "1"); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	var ws []*wire
	for i := range n {
		w := &wire{A: netnstest.New(t, "tdA"), Mid: mid, B: netnstest.New(t, "tdB")}
		a, b := "a", "b"
		if n > 1 {
			a, b = fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
		}
		netnstest.Veth(t, w.A, "eth0", mid, a)
		netnstest.Veth(t, w.B, "eth0", mid, b)
		w.A.Addr(t, "eth0", addrA+"/24")
		w.B.Addr(t, "eth0", addrB+"/24")
		cfg.Links = append(cfg.Links, Link{
			Name: fmt.Sprintf("l%d", i), Netns: mid.Path, A: a, B: b,
			DelayAB: Duration(ab), DelayBA: Duration(ba),
		})
		ws = append(ws, w)
	}
	for _, w := range ws {
		w.cfg = cfg
	}
	return ws
}

// start runs the delay line in this process until the test ends.
func (w *wire) start(t *testing.T) *Line {
	t.Helper()
	l, err := New(w.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("delay line: %v", err)
		}
	})
	return l
}

// pingRTTs sends n ICMP echo requests from ns to dst, every gap, and
// returns the RTTs of the replies. Replies are timed by the kernel's receive
// timestamp (SO_TIMESTAMPNS), so that a busy test process reading late does
// not inflate what is really the network's RTT.
func pingRTTs(t testing.TB, ns *netnstest.NS, dst string, n int, gap time.Duration) []time.Duration {
	t.Helper()
	var fd int
	if err := ns.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	id := os.Getpid() & 0xffff
	sent := make([]atomic.Int64, n)
	var rtts []time.Duration
	var stop atomic.Bool
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 1500)
		oob := make([]byte, 128)
		for !stop.Load() {
			k, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
			if err != nil {
				continue
			}
			ts := parseTimestamp(oob[:oobn])
			if ts == 0 || k < 20 {
				continue
			}
			ihl := int(buf[0]&0x0f) * 4
			m, err := icmp.ParseMessage(1, buf[ihl:k])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			e, ok := m.Body.(*icmp.Echo)
			if !ok || e.ID != id || e.Seq >= n {
				continue
			}
			rtts = append(rtts, time.Duration(ts-sent[e.Seq].Load()))
		}
	}()
	to := &unix.SockaddrInet4{Addr: [4]byte(net.ParseIP(dst).To4())}
	for i := range n {
		m := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: i, Data: make([]byte, 56)}}
		b, _ := m.Marshal(nil)
		sent[i].Store(time.Now().UnixNano())
		if err := unix.Sendto(fd, b, 0, to); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap)
	}
	// Wait for the last replies: the largest RTT in these tests is ~200 ms.
	time.Sleep(time.Second)
	stop.Store(true)
	<-readDone
	return rtts
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func TestRTT(t *testing.T) {
	for _, tc := range []struct{ ab, ba time.Duration }{
		{5 * time.Millisecond, 5 * time.Millisecond},
		{50 * time.Millisecond, 50 * time.Millisecond},
		{100 * time.Millisecond, 100 * time.Millisecond},
		{2 * time.Millisecond, 30 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%v-%v", tc.ab, tc.ba), func(t *testing.T) {
			w := newWire(t, tc.ab, tc.ba)
			l := w.start(t)
			// First exchange resolves ARP through the delay line.
			pingRTTs(t, w.A, addrB, 1, 0)
			spec := tc.ab + tc.ba
			// The best of 20 samples shows the delay line's own precision: a
			// systematic overshoot (such as a millisecond sleep granularity)
			// shows in every sample and every attempt. Up to three attempts
			// keep the test robust to a shared machine where other
			// (real-time) work starves this process for a second at a time.
			// The fidelity target itself is measured by TestFidelityReport.
			var attempts []string
			for range 3 {
				rtts := pingRTTs(t, w.A, addrB, 20, 20*time.Millisecond)
				if len(rtts) == 0 {
					attempts = append(attempts, "no replies")
					continue
				}
				lo := slices.Min(rtts)
				t.Logf("spec %v: %d replies, min %v median %v max %v", spec, len(rtts), lo, median(rtts), slices.Max(rtts))
				// The delay line can never deliver early: each direction
				// holds a frame at least its delay minus the release window.
				if lo < spec-2*window {
					t.Fatalf("RTT %v shorter than the configured %v", lo, spec)
				}
				if len(rtts) >= 15 && lo <= spec+5*time.Millisecond {
					attempts = nil
					break
				}
				attempts = append(attempts, fmt.Sprintf("%d replies, best %v", len(rtts), lo))
			}
			if attempts != nil {
				t.Errorf("RTT far from %v in every attempt: %v", spec, attempts)
			}
			for _, s := range l.Stats() {
				if s.Packets < 21 {
					t.Errorf("%s/%s forwarded %d frames, want >= 21", s.Link, s.Direction, s.Packets)
				}
			}
		})
	}
}

// TestOrderAndNoLoss sends a burst of numbered UDP datagrams much faster
// than they leave and checks that all arrive, in order.
func TestOrderAndNoLoss(t *testing.T) {
	w := newWire(t, 20*time.Millisecond, 20*time.Millisecond)
	l := w.start(t)
	pingRTTs(t, w.A, addrB, 1, 0) // ARP
	var rx, tx *net.UDPConn
	if err := w.B.Do(func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(addrB), Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := rx.SetReadBuffer(8 << 20); err != nil {
		t.Fatal(err)
	}
	if err := w.A.Do(func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addrB), Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	const n = 1000
	payload := make([]byte, 1200)
	for i := range n {
		binary.BigEndian.PutUint32(payload, uint32(i))
		if _, err := tx.Write(payload); err != nil {
			t.Fatal(err)
		}
		// Short pauses keep the burst (which still leaves hundreds of
		// frames queued in the delay line at once) from overrunning the
		// kernel's per-CPU backlog (1000 frames) on a loaded machine,
		// which is not what this tests.
		if i%20 == 19 {
			time.Sleep(200 * time.Microsecond)
		}
	}
	buf := make([]byte, 2000)
	next := uint32(0)
	_ = rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	for next < n {
		k, err := rx.Read(buf)
		if err != nil {
			t.Fatalf("after %d datagrams: %v (stats %+v)", next, err, l.Stats())
		}
		if k < 4 {
			continue
		}
		if got := binary.BigEndian.Uint32(buf); got != next {
			t.Fatalf("datagram %d arrived when %d was expected", got, next)
		}
		next++
	}
	s := l.Stats()[0]
	if s.DropFull+s.KernelDrops+s.SendErrors+s.DropOversize != 0 {
		t.Errorf("delay line dropped frames: %+v", s)
	}
}

// TestLoss checks the optional random loss against a binomial bound.
func TestLoss(t *testing.T) {
	w := newWire(t, time.Millisecond, time.Millisecond)
	w.cfg.Links[0].LossAB = 0.2
	l := w.start(t)
	// Resolve ARP first (its frames are subject to the loss too).
	for i := 0; i < 10 && len(pingRTTs(t, w.A, addrB, 3, 0)) == 0; i++ {
	}
	before := l.Stats()[0].DropLoss
	rtts := pingRTTs(t, w.A, addrB, 400, time.Millisecond)
	// 20% of 400 echo requests: 80 expected, 99.9% binomial interval about
	// 80 +- 26. The counter may also include A's ARP and IPv6 frames; echo
	// replies can additionally go missing on a starved machine, so only the
	// counter gets an upper bound.
	n := l.Stats()[0].DropLoss - before
	if n < 50 || n > 125 {
		t.Errorf("dropped %d frames at 20%% loss while sending 400 echo requests", n)
	}
	if lost := 400 - len(rtts); uint64(lost) < min(n, 50) {
		t.Errorf("only %d of 400 echo requests lost, %d frames dropped", lost, n)
	}
}

// TestGoodputThroughDelay: TCP through tbf (10 Mbit/s) and the delay line
// (5 ms each way) gets close to the shaped rate, and the delay line itself
// drops nothing.
func TestGoodputThroughDelay(t *testing.T) {
	w := newWire(t, 5*time.Millisecond, 5*time.Millisecond)
	w.A.Tbf(t, "eth0", 10_000_000, 100*1514)
	l := w.start(t)
	srv, err := benchtool.Listen(benchtool.ServeOptions{Addr: addrB + ":5201", Netns: w.B.Path})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	ideal := 10 * 1448.0 / 1514
	// Up to two transfers: on a shared 2-core machine, real-time processes
	// elsewhere can starve this test's sender and in-process delay line for
	// a second; a delay line that limits the rate does so every time.
	// docs/lab.md has the measured table. Drops are checked exactly below.
	var r *benchtool.Result
	for try := range 2 {
		var err error
		r, err = benchtool.Send(ctx, benchtool.SendOptions{Addr: addrB + ":5201", Duration: 3 * time.Second, Netns: w.A.Path})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("goodput %.3f Mbit/s (ideal %.3f), rtt %.2f ms, retransmits %d", r.Goodput, ideal, r.Subflows[0].RTT, r.Retransmits)
		if r.Goodput > 1.02*ideal {
			t.Fatalf("goodput %.3f Mbit/s above the %.3f a 10 Mbit/s link allows", r.Goodput, ideal)
		}
		if r.Goodput >= 0.8*ideal {
			break
		}
		if try == 1 {
			t.Errorf("goodput %.3f Mbit/s through a 10 Mbit/s link, ideal %.3f", r.Goodput, ideal)
		}
	}
	for _, s := range l.Stats() {
		if s.DropFull+s.DropOversize+s.SendErrors+s.KernelDrops != 0 {
			t.Errorf("delay line dropped frames: %+v", s)
		}
	}
	if r.Subflows[0].MinRTT < 10 {
		t.Errorf("min RTT %.2f ms below the configured 10 ms", r.Subflows[0].MinRTT)
	}
}

// TestOversizeFramesCounted: frames larger than the slots sized at start
// (here: the MTU raised while the delay line runs) are dropped and counted,
// never truncated and forwarded.
func TestOversizeFramesCounted(t *testing.T) {
	w := newWire(t, time.Millisecond, time.Millisecond)
	l := w.start(t)
	for _, side := range []struct {
		ns  *netnstest.NS
		ifc string
	}{{w.A, "eth0"}, {w.Mid, "a"}} {
		link, err := side.ns.Netlink().LinkByName(side.ifc)
		if err != nil {
			t.Fatal(err)
		}
		if err := side.ns.Netlink().LinkSetMTU(link, 9000); err != nil {
			t.Fatal(err)
		}
	}
	var c *net.UDPConn
	if err := w.A.Do(func() (err error) {
		c, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(addrB), Port: 9002})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Resolve ARP with a small datagram first, then send jumbo ones.
	_, _ = c.Write([]byte("x"))
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats()[0].DropOversize == 0 && time.Now().Before(deadline) {
		_, _ = c.Write(make([]byte, 8000))
		time.Sleep(50 * time.Millisecond)
	}
	if s := l.Stats()[0]; s.DropOversize == 0 {
		t.Errorf("no oversize frames counted: %+v", s)
	}
}
