package benchtool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// SendOptions configure one measurement.
type SendOptions struct {
	Addr     string        // receiver host:port
	Duration time.Duration // how long to write; default 10 s
	Warmup   time.Duration // start of the goodput window; default 1 s
	MPTCP    bool
	// Inet6 opens an AF_INET6 socket (not IPv6-only) also for an IPv4
	// address, which then travels IPv4-mapped: what dual-stack programs
	// do, and what an IPv4 connection needs to take IPv6 subflows.
	Inet6 bool
	CC    string // congestion control; default DefaultCC
	// Netns, if set, names the network namespace to open the socket in (a
	// netnsx spec: NAME under /run/netns or a path); the calling thread is
	// not affected.
	Netns string
	// ConnectTimeout bounds the handshake; default 10 s.
	ConnectTimeout time.Duration
	// SeriesEvery, if positive, samples every subflow's bytes this often
	// during the transfer (Result.Series).
	SeriesEvery time.Duration
	// Download swaps the roles: the receiver sends for Duration, this side
	// counts (goodput, longest stall, per-subflow bytes received).
	Download bool
}

// notsentLowat keeps the sender's unsent backlog small, so that it stops
// close to Duration instead of draining seconds of socket buffer at
// 10 Mbit/s; in-flight data is not limited by it.
const notsentLowat = 128 << 10

// Send runs one transfer to a Serve receiver and returns its result.
// Cancelling ctx aborts the transfer.
func Send(ctx context.Context, o SendOptions) (*Result, error) {
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = DefaultWarmup
	}
	if o.CC == "" {
		o.CC = DefaultCC
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.Duration <= o.Warmup || o.Warmup < 0 {
		return nil, fmt.Errorf("duration %v must be longer than the warm-up %v", o.Duration, o.Warmup)
	}
	if o.Warmup > time.Hour {
		return nil, fmt.Errorf("warm-up %v longer than an hour", o.Warmup)
	}
	conn, err := dial(ctx, o)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Closing the connection is how cancellation interrupts blocked I/O.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	res := &Result{Addr: o.Addr, MPTCPRequested: o.MPTCP, Duration: o.Duration.Seconds(), Warmup: o.Warmup.Seconds()}
	var proto int
	_ = rc.Control(func(fd uintptr) {
		proto = socketProtocol(fd)
		res.CongestionControl = getCongestion(fd)
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, notsentLowat)
	})
	if mp, err := conn.MultipathTCP(); err == nil {
		res.MPTCP = mp && proto == ipprotoMPTCP
	}
	res.Fallback = o.MPTCP && !res.MPTCP

	if o.Download {
		return download(ctx, conn, rc, o, res)
	}
	if _, err := conn.Write(hello{Warmup: o.Warmup}.marshal()); err != nil {
		return nil, sendErr(ctx, "hello", err)
	}
	start := time.Now()
	stopSeries := sampleSeries(conn, rc, res, start, o.SeriesEvery, false)
	defer stopSeries()
	// The warm-up sample is taken concurrently with the writes; the
	// kernel answers getsockopt while another thread blocks in write.
	warm := make(chan map[string]rawSubflow, 1)
	wt := time.AfterFunc(o.Warmup, func() { warm <- subflowSnapshot(conn, rc, res.MPTCP) })
	defer wt.Stop()

	buf := make([]byte, 256<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	if err := conn.SetWriteDeadline(start.Add(o.Duration)); err != nil {
		return nil, err
	}
	for {
		if _, err := conn.Write(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			return nil, sendErr(ctx, "write", err)
		}
	}
	stopSeries()
	// First look before the close can tear subflows down.
	end := subflowSnapshot(conn, rc, res.MPTCP)
	if err := conn.CloseWrite(); err != nil {
		return nil, sendErr(ctx, "close", err)
	}
	var base map[string]rawSubflow
	select {
	case base = <-warm:
	default:
	}

	// The receiver answers once it has read everything still in flight, so
	// when its summary starts to arrive every data byte has been acked: a
	// second snapshot then gives complete per-subflow byte counts. Subflows
	// already gone by then keep their values from the first.
	_ = conn.SetReadDeadline(time.Now().Add(30*time.Second + o.Duration))
	first := make([]byte, 4096)
	n, err := conn.Read(first)
	if n > 0 {
		for k, v := range subflowSnapshot(conn, rc, res.MPTCP) {
			end[k] = v
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, sendErr(ctx, "reading the receiver's summary", err)
	}
	res.Subflows = subflowResults(end, base)
	for _, s := range res.Subflows {
		res.Retransmits += uint64(s.Retransmits)
	}
	rest, err := io.ReadAll(io.LimitReader(conn, maxSummary))
	if err != nil {
		return nil, sendErr(ctx, "reading the receiver's summary", err)
	}
	b := append(first[:n], rest...)
	if len(b) == 0 {
		return nil, fmt.Errorf("receiver closed without a summary (is it an mpdetour bench receiver?) on %s->%s", conn.LocalAddr(), conn.RemoteAddr())
	}
	sum, err := ParseSummary(b)
	if err != nil {
		return nil, err
	}
	fill(res, sum)
	return res, nil
}

// download sends the hello, counts what the server sends with the
// kernel's receive timestamps (as the receiver of an upload does) and takes
// the per-subflow bytes received at the warm-up and at the end.
func download(ctx context.Context, conn *net.TCPConn, rc syscall.RawConn, o SendOptions, res *Result) (*Result, error) {
	r, err := newStampedReader(conn)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := conn.Write(hello{Warmup: o.Warmup, Download: true, Duration: o.Duration}.marshal()); err != nil {
		return nil, sendErr(ctx, "hello", err)
	}
	startNs := start.UnixNano()
	stopSeries := sampleSeries(conn, rc, res, start, o.SeriesEvery, true)
	defer stopSeries()
	warm := make(chan map[string]rawSubflow, 1)
	wt := time.AfterFunc(o.Warmup, func() { warm <- subflowSnapshot(conn, rc, res.MPTCP) })
	defer wt.Stop()
	cnt := counter{warmup: o.Warmup}
	buf := make([]byte, 256<<10)
	_ = conn.SetReadDeadline(time.Now().Add(o.Duration + 30*time.Second))
	for {
		n, ts, err := r.read(buf)
		if err != nil {
			return nil, sendErr(ctx, "download read", err)
		}
		if n == 0 {
			break
		}
		cnt.add(time.Duration(ts-startNs), n)
	}
	stopSeries()
	end := subflowSnapshot(conn, rc, res.MPTCP)
	_ = conn.CloseWrite()
	var base map[string]rawSubflow
	select {
	case base = <-warm:
	default:
	}
	res.Subflows = subflowResults(end, base)
	for i := range res.Subflows {
		// Downloads: the bytes each subflow received (tcpi_bytes_received).
		k := res.Subflows[i].Local.String() + "-" + res.Subflows[i].Remote.String()
		if _, ok := end[k]; !ok {
			k = "tcp"
		}
		e := end[k]
		res.Subflows[i].BytesAcked = e.info.Bytes_received
		res.Subflows[i].WindowBytesAcked = e.info.Bytes_received
		if w, ok := base[k]; ok && w.info.Bytes_received <= e.info.Bytes_received {
			res.Subflows[i].WindowBytesAcked = e.info.Bytes_received - w.info.Bytes_received
		}
		res.Retransmits += uint64(res.Subflows[i].Retransmits)
	}
	sum := cnt.summary(res.MPTCP)
	fill(res, &sum)
	res.ServerMPTCP = res.MPTCP
	res.Download = true
	return res, nil
}

// sampleSeries appends a SeriesPoint to res.Series every `every` until
// stop is called (idempotent; a no-op when every <= 0).
func sampleSeries(conn *net.TCPConn, rc syscall.RawConn, res *Result, start time.Time, every time.Duration, received bool) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			pt := SeriesPoint{T: time.Since(start).Seconds(), Bytes: map[string]uint64{}}
			for k, sf := range subflowSnapshot(conn, rc, res.MPTCP) {
				if received {
					pt.Bytes[k] = sf.info.Bytes_received
				} else {
					pt.Bytes[k] = sf.info.Bytes_acked
				}
			}
			res.Series = append(res.Series, pt)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}

// fill copies the receiver's counts into res and computes the goodput.
func fill(res *Result, s *Summary) {
	res.ServerMPTCP = s.MPTCP
	res.Bytes = s.Bytes
	res.WindowBytes = s.WindowBytes
	res.Samples = s.Samples
	res.MaxGap, res.MaxGapEnd = time.Duration(s.MaxGapNs).Seconds(), time.Duration(s.MaxGapEndNs).Seconds()
	if s.LastNs > s.WarmupNs {
		res.WindowSeconds = time.Duration(s.LastNs - s.WarmupNs).Seconds()
		res.Goodput = float64(s.WindowBytes) * 8 / res.WindowSeconds / 1e6
	}
	if res.Duration > res.Warmup {
		res.EqualBytes = EqualWindow(s.Samples, res.Warmup, res.Duration)
		res.EqualGoodput = float64(res.EqualBytes) * 8 / (res.Duration - res.Warmup) / 1e6
	}
}

// EqualWindow sums the receiver's per-second counts over [from, to)
// seconds from the hello. A sample covers [Start, Start+Seconds) (the
// last one ends at the last byte); one that straddles a boundary counts
// pro rata, its bytes taken as evenly spread over it. That is exact when
// both boundaries fall on whole seconds (the default warm-up, 1 s, and
// duration, 10 s), since samples are whole seconds but the last. Bytes
// after to do not count however late they arrive, and a transfer whose
// last byte came before to counts as idle for the rest: the window is the
// same for every transfer.
func EqualWindow(samples []Sample, from, to float64) uint64 {
	var sum float64
	var total uint64 // exact, to bound the rounded sum
	for _, x := range samples {
		if total+x.Bytes >= total {
			total += x.Bytes
		}
		if x.Seconds <= 0 {
			// A last sample of no length: its bytes arrived at Start.
			if x.Start >= from && x.Start < to {
				sum += float64(x.Bytes)
			}
			continue
		}
		if in := min(x.Start+x.Seconds, to) - max(x.Start, from); in > 0 {
			sum += float64(x.Bytes) * in / x.Seconds
		}
	}
	if r := math.Round(sum); r < float64(total) {
		return uint64(r)
	}
	return total
}

func sendErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s: %w", what, err)
}

func dial(ctx context.Context, o SendOptions) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: o.ConnectTimeout}
	d.SetMultipathTCP(o.MPTCP)
	if o.Inet6 {
		// A local address of :: makes Go open an AF_INET6 socket for an
		// IPv4 destination too.
		d.LocalAddr = &net.TCPAddr{IP: net.IPv6unspecified}
	}
	var ccErr error
	d.Control = func(network, address string, c syscall.RawConn) error {
		if err := c.Control(func(fd uintptr) { ccErr = setCongestion(fd, o.CC) }); err != nil {
			return err
		}
		return ccErr
	}
	var c net.Conn
	err := netnsx.Do(o.Netns, func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", o.Addr)
		return err
	})
	if err != nil {
		if ccErr != nil {
			return nil, ccErr
		}
		return nil, fmt.Errorf("connect to %s: %w", o.Addr, err)
	}
	return c.(*net.TCPConn), nil
}

// subflowSnapshot reads the kernel's view of every subflow, keyed by the
// address pair (ids are not available on old kernels).
func subflowSnapshot(c *net.TCPConn, rc syscall.RawConn, mptcp bool) map[string]rawSubflow {
	out := map[string]rawSubflow{}
	_ = rc.Control(func(fd uintptr) {
		if mptcp {
			sfs, err := mptcpSubflows(fd)
			if err == nil {
				for _, s := range sfs {
					out[s.local.String()+"-"+s.remote.String()] = s
				}
				return
			}
		}
		if ti, err := tcpInfo(fd); err == nil {
			l, _ := netip.ParseAddrPort(c.LocalAddr().String())
			r, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			out["tcp"] = rawSubflow{local: l, remote: r, info: ti}
		}
	})
	return out
}

// subflowResults turns the end snapshot into Subflows, subtracting the
// warm-up snapshot of the same subflow for the window's bytes. Subflows
// that joined after the warm-up count entirely.
func subflowResults(end, warm map[string]rawSubflow) []Subflow {
	out := make([]Subflow, 0, len(end))
	for k, s := range end {
		sf := Subflow{
			ID: s.id, Local: s.local, Remote: s.remote,
			BytesAcked:   s.info.Bytes_acked,
			BytesRetrans: s.info.Bytes_retrans,
			Retransmits:  s.info.Total_retrans,
			RTT:          float64(s.info.Rtt) / 1000,
			MinRTT:       float64(s.info.Min_rtt) / 1000,
			Cwnd:         s.info.Snd_cwnd,
			MSS:          s.info.Snd_mss,
		}
		sf.WindowBytesAcked = sf.BytesAcked
		if w, ok := warm[k]; ok && w.info.Bytes_acked <= sf.BytesAcked {
			sf.WindowBytesAcked = sf.BytesAcked - w.info.Bytes_acked
		}
		out = append(out, sf)
	}
	slices.SortFunc(out, func(a, b Subflow) int {
		if a.ID != b.ID {
			return int(a.ID) - int(b.ID)
		}
		return strings.Compare(a.Local.String()+a.Remote.String(), b.Local.String()+b.Remote.String())
	})
	return out
}
