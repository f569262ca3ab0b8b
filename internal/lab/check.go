package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"golang.org/x/sys/unix"
)

// CheckOptions tune Check. The zero value measures everything with the
// defaults below.
type CheckOptions struct {
	Pings        int           // echo requests per direction; default 20
	PingInterval time.Duration // default 20 ms
	// RateDuration is each TCP transfer's length (goodput window starts
	// after 1 s); default 4 s. NoRate skips the goodput measurement.
	RateDuration time.Duration
	NoRate       bool
	// Sequential measures goodput one direction at a time instead of every
	// link's a->b direction at once, then every b->a.
	Sequential bool
	// AllAtOnce loads every direction of every link at the same time (the
	// full-load case). Each flow's queue then also carries the reverse
	// flow's ACKs, so the spec drops by AckShare.
	AllAtOnce bool
	// LossSamples is the number of UDP probes per direction; default 2000.
	LossSamples int
	// Confidence of the loss interval; default 0.99.
	Confidence float64
	// Links restricts the check to these links (default: all).
	Links []string
	// Family is the address family checked, 4 or 6 (default: 4 when the
	// lab has IPv4, else 6); a dual-stack lab is checked once per family.
	Family topology.Family
}

// Tolerances of the fidelity targets.
const (
	RTTTolAbs     = time.Millisecond
	RTTTolRel     = 0.03
	GoodputTolRel = 0.03
)

// TCPEfficiency converts a link rate into the TCP goodput it should carry:
// a 1448-byte payload (MSS with timestamps) per 1514-byte frame, which is
// what tbf counts.
const TCPEfficiency = 1448.0 / 1514.0

// AckShare is the part of a direction's capacity taken by the ACKs of a
// bulk flow in the other direction: one 66-byte ACK frame per two
// 1514-byte segments (delayed ACKs).
const AckShare = 66.0 / (2 * 1514.0)

// DirCheck is the measurement of one direction of one link.
type DirCheck struct {
	Link string `json:"link"`
	Dir  string `json:"dir"` // "ab" or "ba"
	From string `json:"from"`
	To   string `json:"to"`

	// RTT is measured from From to To's address on the link; the
	// expectation is both directions' delay plus the probes' serialization.
	RTTSpec   time.Duration `json:"rtt_spec_ns"`
	RTTMedian time.Duration `json:"rtt_median_ns"`
	RTTMin    time.Duration `json:"rtt_min_ns"`
	RTTOK     bool          `json:"rtt_ok"`

	Rate        topology.Rate `json:"rate_bps"` // 0 = unlimited (goodput not checked)
	GoodputSpec float64       `json:"goodput_spec_mbps,omitempty"`
	Goodput     float64       `json:"goodput_mbps,omitempty"`
	GoodputOK   bool          `json:"goodput_ok"`
	GoodputErr  string        `json:"goodput_error,omitempty"`
	GoodputNote string        `json:"goodput_note,omitempty"`

	// RateMeasured is the frame rate a paced UDP flood (1.2 × the rate)
	// got through, in Mbit/s of Ethernet frames as tbf counts them; the
	// spec is rate × (1 - loss). It checks the rate where TCP cannot (on
	// lossy links) and does not depend on a TCP sender being scheduled.
	RateSpec     float64 `json:"rate_spec_mbps,omitempty"`
	RateMeasured float64 `json:"rate_mbps,omitempty"`
	RateOK       bool    `json:"rate_ok"`
	RateErr      string  `json:"rate_error,omitempty"`

	LossSpec float64 `json:"loss_spec"`
	Sent     int     `json:"loss_sent"`
	Lost     int     `json:"loss_lost"`
	LossLo   float64 `json:"loss_lo"`
	LossHi   float64 `json:"loss_hi"`
	LossOK   bool    `json:"loss_ok"`
}

// OK reports whether every measured quantity of the direction is within
// its tolerance.
func (d DirCheck) OK() bool { return d.RTTOK && d.RateOK && d.GoodputOK && d.LossOK }

// CheckReport is the result of Check.
type CheckReport struct {
	Lab        string          `json:"lab"`
	Family     topology.Family `json:"family"`
	Confidence float64         `json:"confidence"`
	Samples    int             `json:"loss_samples"`
	Directions []DirCheck      `json:"directions"`
	OK         bool            `json:"ok"`
	// LoadAvg is the 1-minute load average when the check ended and CPUs
	// the number of CPUs: above CPUs, the traffic endpoints themselves
	// may be starved, which shows as goodput below spec.
	LoadAvg float64 `json:"load_avg"`
	CPUs    int     `json:"cpus"`
	// DelayLineCPU is the delay line's CPU use during the goodput phase,
	// in cores (1.0 = one core busy); 0 without a delay line.
	DelayLineCPU float64 `json:"delay_line_cpu_cores"`
}

// Failures lists a line per quantity off its target.
func (r *CheckReport) Failures() []string {
	var out []string
	for _, d := range r.Directions {
		w := fmt.Sprintf("%s %s->%s", d.Link, d.From, d.To)
		if !d.RTTOK {
			out = append(out, fmt.Sprintf("%s: RTT %v, spec %v (tolerance max(1ms, 3%%))", w, d.RTTMedian.Round(10*time.Microsecond), d.RTTSpec))
		}
		if !d.RateOK && d.RateErr != "" {
			out = append(out, fmt.Sprintf("%s: rate not measured: %s", w, d.RateErr))
		} else if !d.RateOK {
			out = append(out, fmt.Sprintf("%s: rate %.2f Mbit/s (UDP, Ethernet frames), spec %.2f = %v × (1 - loss) (tolerance 3%%)", w, d.RateMeasured, d.RateSpec, d.Rate))
		}
		if !d.GoodputOK {
			if d.GoodputErr != "" {
				out = append(out, fmt.Sprintf("%s: goodput not measured: %s", w, d.GoodputErr))
			} else {
				out = append(out, fmt.Sprintf("%s: goodput %.2f Mbit/s, spec %.2f for rate %v (tolerance 3%%)", w, d.Goodput, d.GoodputSpec, d.Rate))
			}
		}
		if !d.LossOK {
			out = append(out, fmt.Sprintf("%s: loss %d/%d, %.0f%% interval [%.3f%%, %.3f%%] excludes spec %.3f%%", w, d.Lost, d.Sent, r.Confidence*100, d.LossLo*100, d.LossHi*100, d.LossSpec*100))
		}
	}
	return out
}

func withinRTT(got, want time.Duration) bool {
	tol := max(RTTTolAbs, time.Duration(float64(want)*RTTTolRel))
	diff := got - want
	return diff <= tol && -diff <= tol
}

// Check measures every link direction of the lab against its spec: RTT by
// ICMP echo between the link's endpoints, TCP goodput with the goodput
// tool (cubic) where the direction has a rate, and loss with numbered UDP
// probes. The measurement happens between direct neighbours, so each
// figure belongs to one link.
func (l *Lab) Check(ctx context.Context, o CheckOptions) (*CheckReport, error) {
	if o.Pings <= 0 {
		o.Pings = 20
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 20 * time.Millisecond
	}
	if o.RateDuration <= 0 {
		o.RateDuration = 4 * time.Second
	}
	if o.LossSamples <= 0 {
		o.LossSamples = 2000
	}
	if o.Confidence <= 0 || o.Confidence >= 1 {
		o.Confidence = 0.99
	}
	var links []*topology.Link
	for _, k := range l.topo.Links {
		if len(o.Links) == 0 || containsStr(o.Links, k.Name) {
			links = append(links, k)
		}
	}
	for _, n := range o.Links {
		if l.topo.Link(n) == nil {
			return nil, fmt.Errorf("lab %s has no link %q", l.name, n)
		}
	}
	fam, err := l.checkFamily(o.Family)
	if err != nil {
		return nil, err
	}
	rep := &CheckReport{Lab: l.name, Family: fam, Confidence: o.Confidence, Samples: o.LossSamples}
	for _, k := range links {
		for _, dir := range []string{"ab", "ba"} {
			d := DirCheck{Link: k.Name, Dir: dir, From: k.A.Node, To: k.B.Node}
			sh := k.AB
			if dir == "ba" {
				d.From, d.To, sh = k.B.Node, k.A.Node, k.BA
			}
			d.RTTSpec = k.AB.Delay + k.BA.Delay + serialization(k.AB.Rate) + serialization(k.BA.Rate)
			d.Rate = sh.Rate
			d.LossSpec = float64(sh.Loss)
			if sh.Rate > 0 && !o.NoRate {
				d.RateSpec = sh.Rate.Mbit() * (1 - float64(sh.Loss))
			} else {
				d.RateOK = true
			}
			if sh.Rate > 0 && (k.AB.Loss > 0 || k.BA.Loss > 0) {
				// TCP over a lossy link is limited by the loss, not the rate
				// (Mathis et al.), so its goodput says nothing about tbf.
				d.GoodputNote = "lossy link: TCP is loss-limited, rate not checked"
				d.GoodputOK = true
			} else if sh.Rate > 0 && !o.NoRate {
				d.GoodputSpec = sh.Rate.Mbit() * tcpEfficiency(fam)
				if o.AllAtOnce {
					d.GoodputSpec *= 1 - AckShare
				}
			} else {
				d.GoodputOK = true
			}
			rep.Directions = append(rep.Directions, d)
		}
	}
	dst := func(d *DirCheck) netip.Addr {
		k := l.topo.Link(d.Link)
		a := k.A.Addr.Addr()
		if d.Dir == "ab" {
			a = k.B.Addr.Addr()
		}
		if rep.Family == topology.Family6 {
			return topology.V6(a)
		}
		return a
	}
	// 1. RTT, idle links, all at once (echo traffic is light).
	var wg sync.WaitGroup
	errs := make([]error, len(rep.Directions))
	for i := range rep.Directions {
		d := &rep.Directions[i]
		wg.Go(func() {
			// One echo first: ARP resolution would add a round trip to the
			// requests queued behind it.
			if _, err := l.Ping(ctx, d.From, dst(d), 1, time.Millisecond, time.Second+2*d.RTTSpec); err != nil {
				errs[i] = err
				return
			}
			r, err := l.Ping(ctx, d.From, dst(d), o.Pings, o.PingInterval, 2*time.Second+2*d.RTTSpec)
			if err != nil {
				errs[i] = err
				return
			}
			d.RTTMedian, d.RTTMin = r.Median(), r.Min()
			d.RTTOK = r.Received > 0 && withinRTT(d.RTTMedian, d.RTTSpec)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// 2. Loss: numbered UDP probes, every direction at once.
	for i := range rep.Directions {
		d := &rep.Directions[i]
		wg.Go(func() {
			sent, lost, err := l.udpLoss(ctx, d.From, d.To, dst(d), o.LossSamples, d.Rate)
			if err != nil {
				errs[i] = err
				return
			}
			d.Sent, d.Lost = sent, lost
			d.LossLo, d.LossHi = BinomialInterval(lost, sent, o.Confidence)
			d.LossOK = d.LossSpec >= d.LossLo && d.LossSpec <= d.LossHi
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// 3. Rate with a paced UDP flood, then goodput with TCP. The two
	// directions of a link never run together: TCP's ACKs would share the
	// measured queue, and the UDP phase is grouped the same way.
	if !o.NoRate {
		// Each group of directions is measured at once; groups run one after
		// the other (see phases).
		measure := func(sel func(DirCheck) bool, fn func(d *DirCheck)) error {
			for _, g := range phases(rep.Directions, o, sel) {
				for _, i := range g {
					wg.Go(func() { fn(&rep.Directions[i]) })
				}
				wg.Wait()
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			return nil
		}
		err := measure(func(d DirCheck) bool { return d.RateSpec > 0 }, func(d *DirCheck) {
			r, err := l.udpRate(ctx, d.From, d.To, dst(d), d.Rate)
			if err != nil {
				// A link that carried (almost) nothing fails the check; it
				// does not abort the other measurements.
				d.RateErr = err.Error()
				return
			}
			d.RateMeasured = r
			d.RateOK = math.Abs(r-d.RateSpec) <= GoodputTolRel*d.RateSpec
		})
		if err != nil {
			return nil, err
		}
		cpu0, t0 := l.delayLineCPU(), time.Now()
		err = measure(func(d DirCheck) bool { return d.GoodputSpec > 0 }, func(d *DirCheck) {
			gp, err := l.goodput(ctx, d.From, d.To, dst(d), o.RateDuration)
			if err != nil {
				d.GoodputErr = err.Error()
				return
			}
			d.Goodput = gp
			d.GoodputOK = math.Abs(gp-d.GoodputSpec) <= GoodputTolRel*d.GoodputSpec
		})
		if err != nil {
			return nil, err
		}
		if cpu0 > 0 {
			rep.DelayLineCPU = (l.delayLineCPU() - cpu0).Seconds() / time.Since(t0).Seconds()
		}
	}
	rep.CPUs = runtime.NumCPU()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			rep.LoadAvg, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	rep.OK = true
	for _, d := range rep.Directions {
		rep.OK = rep.OK && d.OK()
	}
	return rep, nil
}

// phases groups the directions that pass sel for measurements that load
// links: every a->b direction together, then every b->a (one at a time
// with Sequential, all together with AllAtOnce).
func phases(ds []DirCheck, o CheckOptions, sel func(DirCheck) bool) [][]int {
	var groups [][]int
	for _, dir := range []string{"ab", "ba"} {
		var g []int
		for i, d := range ds {
			if d.Dir == dir && sel(d) {
				if o.Sequential {
					groups = append(groups, []int{i})
				} else {
					g = append(g, i)
				}
			}
		}
		if len(g) > 0 {
			groups = append(groups, g)
		}
	}
	if o.AllAtOnce && len(groups) == 2 {
		groups = [][]int{append(groups[0], groups[1]...)}
	}
	return groups
}

// udpFrame and udpPayload: full-size frames, so tbf sees what TCP sends.
const (
	udpFrame   = 1514
	udpPayload = udpFrame - 14 - 20 - 8
)

// udpPayloadFor is udpPayload for dst's family (an IPv6 header is 20
// bytes longer, so the same frame carries 20 bytes less).
func udpPayloadFor(dst netip.Addr) int {
	if dst.Is6() {
		return udpPayload - 20
	}
	return udpPayload
}

// tcpEfficiency is TCPEfficiency for a family: an IPv6 segment carries
// 20 bytes less payload (MSS 1428) in the same 1514-byte frame.
func tcpEfficiency(f topology.Family) float64 {
	if f == topology.Family6 {
		return (1448.0 - 20) / 1514.0
	}
	return TCPEfficiency
}

// udpRate (run it on a goroutine of its own: it keeps its thread) sends
// full-size UDP datagrams from node from to dst (in node
// to) at 1.2 × rate for 2 s, so that the sender's tbf always has a
// backlog, and returns the frame rate that arrived after the first
// 0.5 s, in Mbit/s.
func (l *Lab) udpRate(ctx context.Context, from, to string, dst netip.Addr, rate topology.Rate) (float64, error) {
	var rx, tx *net.UDPConn
	if err := l.Do(to, func() error {
		var err error
		rx, err = net.ListenUDP(udpNet(dst), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0)))
		if err != nil {
			return err
		}
		if rc, err := rx.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
				// Arrival times from the kernel, not from a reader that
				// may wake up late and compress the window.
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
			})
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("%s: %w", to, err)
	}
	defer rx.Close()
	if err := l.Do(from, func() error {
		var err error
		tx, err = net.DialUDP(udpNet(dst), nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		return 0, fmt.Errorf("%s: %w", from, err)
	}
	defer tx.Close()
	const (
		dur    = 2 * time.Second
		warmup = 500 * time.Millisecond
	)
	type result struct {
		bytes int
		first time.Time
		last  time.Time
		start time.Time
	}
	resc := make(chan result, 1)
	go func() {
		var r result
		buf := make([]byte, 2048)
		oob := make([]byte, 128)
		for {
			n, oobn, _, _, err := rx.ReadMsgUDP(buf, oob)
			now := time.Now()
			if err != nil {
				resc <- r
				return
			}
			if ts, ok := rxTimestamp(oob[:oobn]); ok {
				now = ts
			}
			if r.first.IsZero() {
				r.first = now
				r.start = now.Add(warmup)
			}
			if now.After(r.start) {
				r.bytes += n
				r.last = now
			}
		}
	}()
	pps := 1.2 * float64(rate) / (udpFrame * 8)
	payload := udpPayloadFor(dst)
	msg := make([]byte, payload)
	// The queue in front of the link holds only ~60 ms at 20 Mbit/s: a
	// sender that is not scheduled for longer leaves the link idle. Give
	// the sending loop its own thread with a higher CFS weight; the
	// thread is never unlocked, so it ends with the loop and the priority
	// never reaches other goroutines.
	runtime.LockOSThread()
	unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), -10)
	start := time.Now()
	sent := 0
	for {
		el := time.Since(start)
		if el >= dur || ctx.Err() != nil {
			break
		}
		for due := int(el.Seconds() * pps); sent < due; sent++ {
			// ENOBUFS and the like: the local queue is full, which is the
			// point of sending faster than the rate.
			tx.Write(msg)
		}
		time.Sleep(time.Millisecond)
	}
	// Let the queue and the delay drain, then stop reading.
	k := l.topo.Link(linkOf(l.topo, from, to))
	drain := 200 * time.Millisecond
	if k != nil {
		drain += 2 * max(k.AB.Delay, k.BA.Delay)
	}
	time.Sleep(drain)
	rx.Close()
	r := <-resc
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	win := r.last.Sub(r.start).Seconds()
	if r.bytes == 0 || win < 0.5 {
		return 0, fmt.Errorf("%s -> %s: UDP rate probe: too little arrived (%d bytes over %.2f s)", from, to, r.bytes, win)
	}
	frames := float64(r.bytes) / float64(payload)
	return frames * udpFrame * 8 / win / 1e6, nil
}

// serialization is the time a 98-byte echo frame takes at rate r.
func serialization(r topology.Rate) time.Duration {
	if r == 0 {
		return 0
	}
	return time.Duration(98 * 8 * float64(time.Second) / float64(r))
}

// linkOf returns the name of the (first) link between nodes a and b.
func linkOf(t *topology.Topology, a, b string) string {
	for _, k := range t.Links {
		if (k.A.Node == a && k.B.Node == b) || (k.A.Node == b && k.B.Node == a) {
			return k.Name
		}
	}
	return ""
}

func containsStr(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// goodput runs one TCP transfer from node to dst (in node "to") and
// returns the reference-method goodput in Mbit/s.
func (l *Lab) goodput(ctx context.Context, from, to string, dst netip.Addr, dur time.Duration) (float64, error) {
	srv, err := benchtool.Listen(benchtool.ServeOptions{Addr: netip.AddrPortFrom(dst, 0).String(), Netns: l.NetnsPath(to)})
	if err != nil {
		return 0, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { srv.Serve(sctx); close(done) }()
	defer func() { cancel(); <-done }()
	res, err := benchtool.Send(ctx, benchtool.SendOptions{Addr: srv.Addr().String(), Duration: dur, Netns: l.NetnsPath(from)})
	if err != nil {
		return 0, err
	}
	return res.Goodput, nil
}

// udpLoss sends n numbered datagrams from node from to dst (in node to),
// paced well below the link rate so that no queue overflows, and counts
// the distinct ones that arrive.
func (l *Lab) udpLoss(ctx context.Context, from, to string, dst netip.Addr, n int, rate topology.Rate) (sent, lost int, err error) {
	var rx, tx *net.UDPConn
	var overflow0 uint64
	if err := l.Do(to, func() error {
		var err error
		rx, err = net.ListenUDP(udpNet(dst), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0)))
		if err != nil {
			return err
		}
		// A reader descheduled for a moment must not turn into "loss".
		if rc, err := rx.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
			})
		}
		overflow0, err = udpRcvbufErrors()
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", to, err)
	}
	defer rx.Close()
	if err := l.Do(from, func() error {
		var err error
		tx, err = net.DialUDP(udpNet(dst), nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", from, err)
	}
	defer tx.Close()
	// 74-byte frames (8 bytes of payload) at most a tenth of the rate.
	interval := 500 * time.Microsecond
	if rate > 0 {
		interval = max(interval, time.Duration(10*74*8*float64(time.Second)/float64(rate)))
	}
	seen := make([]bool, n)
	got := 0
	done := make(chan struct{})
	all := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			m, err := rx.Read(buf)
			if err != nil {
				return
			}
			if m != 8 {
				continue
			}
			i := binary.BigEndian.Uint64(buf)
			if i < uint64(n) && !seen[i] {
				seen[i] = true
				got++
				if got == n {
					close(all)
				}
			}
		}
	}()
	start := time.Now()
	msg := make([]byte, 8)
	for i := 0; i < n; i++ {
		// Pace by the clock, not by sleeping per packet: a sleep overshoots.
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		if ctx.Err() != nil {
			rx.Close()
			<-done
			return 0, 0, ctx.Err()
		}
		binary.BigEndian.PutUint64(msg, uint64(i))
		if _, err := tx.Write(msg); err != nil {
			rx.Close()
			<-done
			return 0, 0, fmt.Errorf("%s: udp probe: %w", from, err)
		}
	}
	// Wait for stragglers as long as the link's delay allows, plus margin.
	k := l.topo.Link(linkOf(l.topo, from, to))
	wait := time.Second
	if k != nil {
		wait += 2 * max(k.AB.Delay, k.BA.Delay)
	}
	select {
	case <-all:
	case <-time.After(wait):
	case <-ctx.Done():
	}
	rx.Close()
	<-done
	var overflow1 uint64
	if err := l.Do(to, func() (err error) { overflow1, err = udpRcvbufErrors(); return }); err != nil {
		return 0, 0, err
	}
	if overflow1 != overflow0 {
		return 0, 0, fmt.Errorf("%s: %d UDP probes dropped by the receiving socket, not the link: measurement invalid (CPU starved?)", to, overflow1-overflow0)
	}
	return n, n - got, nil
}

// udpRcvbufErrors reads Udp RcvbufErrors of the current namespace.
func udpRcvbufErrors() (uint64, error) {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	var hdr []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if hdr == nil {
			hdr = f
			continue
		}
		for i, h := range hdr {
			if h == "RcvbufErrors" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("no Udp RcvbufErrors in /proc/net/snmp")
}

// delayLineCPU returns the CPU time the lab's delay line has used so far
// (0 if there is none).
func (l *Lab) delayLineCPU() time.Duration {
	p := l.st.DelayLine
	if !p.alive() {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	// USER_HZ is 100 on every Linux ABI Go supports.
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// DelayLinePID returns the pid of the lab's delay line (0 if none runs).
func (l *Lab) DelayLinePID() int {
	if !l.st.DelayLine.alive() {
		return 0
	}
	return l.st.DelayLine.PID
}

// udpNet is the UDP network for dst's family.
func udpNet(dst netip.Addr) string {
	if dst.Is6() {
		return "udp6"
	}
	return "udp4"
}

// checkFamily resolves CheckOptions.Family: "" is IPv4 when the lab has
// it, else IPv6; a family the lab was not built with is an error.
func (l *Lab) checkFamily(want topology.Family) (topology.Family, error) {
	have := l.topo.Family()
	switch want {
	case "":
		if have.Has4() {
			return topology.Family4, nil
		}
		return topology.Family6, nil
	case topology.Family4:
		if !have.Has4() {
			return "", fmt.Errorf("lab %s has no IPv4 (family %s)", l.name, have)
		}
	case topology.Family6:
		if !have.Has6() {
			return "", fmt.Errorf("lab %s has no IPv6 (built with family %s; use --set family=dual)", l.name, have)
		}
	default:
		return "", fmt.Errorf("check family must be 4 or 6, not %q", want)
	}
	return want, nil
}
