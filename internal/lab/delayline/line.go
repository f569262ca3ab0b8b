package delayline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// batch is the most frames one recvmmsg or sendmmsg moves.
	batch = 64
	// window releases frames due within this time together with the one the
	// timer woke up for, trading 25 µs of earliness for fewer wake-ups at
	// high packet rates.
	window = 25 * time.Microsecond
	// lateThreshold counts frames released noticeably after their due time.
	lateThreshold = time.Millisecond
	// statsInterval is how often Run checks for drops and late releases.
	statsInterval = 10 * time.Second
)

// ReadyMessage is logged once every socket is open and frames flow; a
// process supervising the delay line can wait for it.
const ReadyMessage = "delay line running"

// Stats counts what one direction of one link did.
type Stats struct {
	Link      string `json:"link"`
	Direction string `json:"direction"` // "ab" or "ba"
	Packets   uint64 `json:"packets"`   // frames forwarded
	Bytes     uint64 `json:"bytes"`
	// Drops by cause: queue full, frame larger than a slot (offloads left
	// on), emulated loss, send errors, and the kernel's own drops when this
	// process did not read the socket fast enough.
	DropFull     uint64 `json:"drop_full"`
	DropOversize uint64 `json:"drop_oversize"`
	DropLoss     uint64 `json:"drop_loss"`
	SendErrors   uint64 `json:"send_errors"`
	KernelDrops  uint64 `json:"kernel_drops"`
	// Release lateness: how long after its due time a frame was handed to
	// the kernel.
	LateMean time.Duration `json:"late_mean_ns"`
	LateMax  time.Duration `json:"late_max_ns"`
	Late1ms  uint64        `json:"late_over_1ms"` // frames released more than 1 ms late
}

type counters struct {
	packets, bytes, dropFull, dropOversize, dropLoss, sendErrors, kernelDrops atomic.Uint64
	lateSum, lateMax, late1ms                                                 atomic.Uint64
}

type direction struct {
	link, dir string
	in, out   *packetSocket
	ring      *ring
	sched     scheduler
	loss      float64
	rng       *rand.Rand
	notify    chan struct{}
	timer     *timer
	// writer's sendmmsg state, kept here so that its callback is one
	// method value instead of a closure allocated per batch.
	sendFn    func(uintptr) bool
	sendBatch []unix.Mmsghdr
	sent      int
	sendErr   unix.Errno
	log       *slog.Logger
	c         counters
}

// Line is a running set of delayed links. Most callers use Run; tests and
// the benchmark use New, Run and Stats to read the counters.
type Line struct {
	log     *slog.Logger
	sockets []*packetSocket
	timers  []*timer
	dirs    []*direction
	once    sync.Once
}

// New opens every socket of cfg. On error nothing stays open.
func New(cfg Config, log *slog.Logger) (*Line, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Line{log: log}
	for i, lk := range cfg.Links {
		name := lk.Name
		if name == "" {
			name = fmt.Sprintf("link%d", i)
		}
		a, err := openPacketSocket(lk.Netns, lk.A)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("delay line link %s: %w", name, err)
		}
		l.sockets = append(l.sockets, a)
		b, err := openPacketSocket(lk.Netns, lk.B)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("delay line link %s: %w", name, err)
		}
		l.sockets = append(l.sockets, b)
		// A slot holds the largest frame either interface can carry, with
		// room for a VLAN tag, rounded to a cache line.
		slot := (max(a.mtu, b.mtu) + 14 + 4 + 63) &^ 63
		for _, d := range []struct {
			dir     string
			in, out *packetSocket
			delay   Duration
			loss    float64
		}{{"ab", a, b, lk.DelayAB, lk.LossAB}, {"ba", b, a, lk.DelayBA, lk.LossBA}} {
			t, err := newTimer()
			if err != nil {
				l.Close()
				return nil, err
			}
			l.timers = append(l.timers, t)
			dir := &direction{
				link: name, dir: d.dir, in: d.in, out: d.out,
				ring:   newRing(queueSlots(lk.QueueLimit, time.Duration(d.delay)), slot),
				sched:  scheduler{delay: int64(d.delay)},
				loss:   d.loss,
				rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i))),
				notify: make(chan struct{}, 1),
				timer:  t,
				log:    log.With("link", name, "dir", d.dir),
			}
			dir.sendFn = dir.sendOnce
			l.dirs = append(l.dirs, dir)
		}
	}
	return l, nil
}

// Close releases the sockets and timers; it unblocks Run's goroutines.
func (l *Line) Close() {
	l.once.Do(func() {
		for _, s := range l.sockets {
			s.f.Close()
		}
		for _, t := range l.timers {
			t.f.Close()
		}
	})
}

// Run forwards frames until ctx is done, then closes everything and logs
// the final statistics. It returns the first unexpected socket error.
func (l *Line) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2*len(l.dirs))
	var wg sync.WaitGroup
	for _, d := range l.dirs {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- d.readLoop() }()
		go func() { defer wg.Done(); errs <- d.writeLoop(ctx.Done()) }()
	}
	// internal/lab waits for this exact message before "lab up" returns.
	l.log.Info(ReadyMessage, "directions", len(l.dirs))
	// Drops and late releases mean the emulation is off; say so while it
	// happens, not only at exit.
	tick := time.NewTicker(statsInterval)
	defer tick.Stop()
	last := l.Stats()
	var first error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case first = <-errs:
			break wait
		case <-tick.C:
			now := l.Stats()
			for i, s := range now {
				p := last[i]
				drops := s.DropFull + s.DropOversize + s.SendErrors + s.KernelDrops - (p.DropFull + p.DropOversize + p.SendErrors + p.KernelDrops)
				if late := s.Late1ms - p.Late1ms; drops > 0 || late > 0 {
					l.log.Warn("delay line off its spec", "link", s.Link, "dir", s.Direction,
						"interval", statsInterval, "drops", drops, "late_over_1ms", late, "frames", s.Packets-p.Packets)
				}
			}
			last = now
		}
	}
	cancel()
	l.Close()
	wg.Wait()
	for _, s := range l.Stats() {
		l.log.Info("delay line stats", "link", s.Link, "dir", s.Direction, "packets", s.Packets,
			"drop_full", s.DropFull, "drop_oversize", s.DropOversize, "drop_loss", s.DropLoss,
			"send_errors", s.SendErrors, "kernel_drops", s.KernelDrops,
			"late_mean", s.LateMean, "late_max", s.LateMax, "late_over_1ms", s.Late1ms)
	}
	if first != nil && !errors.Is(first, os.ErrClosed) {
		return first
	}
	return nil
}

// Stats returns the counters of every direction, links in config order.
func (l *Line) Stats() []Stats {
	out := make([]Stats, 0, len(l.dirs))
	for _, d := range l.dirs {
		d.c.kernelDrops.Add(d.in.kernelDrops())
		n := d.c.packets.Load()
		s := Stats{
			Link: d.link, Direction: d.dir,
			Packets: n, Bytes: d.c.bytes.Load(),
			DropFull: d.c.dropFull.Load(), DropOversize: d.c.dropOversize.Load(),
			DropLoss: d.c.dropLoss.Load(), SendErrors: d.c.sendErrors.Load(),
			KernelDrops: d.c.kernelDrops.Load(),
			LateMax:     time.Duration(d.c.lateMax.Load()),
			Late1ms:     d.c.late1ms.Load(),
		}
		if n > 0 {
			s.LateMean = time.Duration(d.c.lateSum.Load() / n)
		}
		out = append(out, s)
	}
	return out
}

// DefaultPriority is what Run applies to its process; see docs/lab.md for
// the measurements behind the choice.
const DefaultPriority = PriorityRealtime

// PriorityEnv overrides DefaultPriority ("normal", "nice", "realtime"),
// e.g. on a machine shared with other work that must not be starved.
const PriorityEnv = "MPDETOUR_DELAYLINE_PRIORITY"

// Run serves cfg until ctx is done. It is what the lab's delay-line process
// runs, and it assumes it owns that process: it raises the process's
// scheduling priority (DefaultPriority) so that frames leave on time even
// when the traffic saturates the CPUs. A refused priority is logged, not
// fatal. Tests that embed a delay line use New and Line.Run instead.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l, err := New(cfg, log)
	if err != nil {
		return err
	}
	prio := DefaultPriority
	if p := os.Getenv(PriorityEnv); p != "" {
		prio = Priority(p)
	}
	if err := SetPriority(prio); err != nil {
		log.Warn("delay line keeps normal priority", "err", err)
	}
	return l.Run(ctx)
}

// transient socket errors: the interface went down (lab teardown, link
// flap) or the kernel ran out of buffers for a moment. The socket recovers
// by itself when the interface comes back.
func transient(e unix.Errno) bool {
	switch e {
	case unix.ENETDOWN, unix.ENXIO, unix.ENOBUFS, unix.EINTR, unix.ENOMEM:
		return true
	}
	return false
}

func (d *direction) readLoop() error {
	hs := make([]unix.Mmsghdr, batch)
	iovs := make([]unix.Iovec, batch)
	ctrl := make([]byte, batch*ctrlSize)
	scratch := make([]byte, d.ring.slotSize)
	var warnedOversize bool
	// One closure for the whole loop: a closure per recvmmsg would be a heap
	// allocation per batch for the garbage collector to chase.
	var (
		pending []unix.Mmsghdr
		n       int
		errno   unix.Errno
	)
	recv := func(fd uintptr) bool {
		n, errno = recvmmsg(fd, pending)
		return errno != unix.EAGAIN
	}
	for {
		tail, free := d.ring.free()
		k := min(free, batch)
		full := k == 0
		if full {
			// Keep draining the socket so the drops are ours and counted,
			// not silent overruns of the socket buffer.
			k = batch
		}
		for i := range k {
			buf := scratch
			if !full {
				buf = d.ring.slot(tail + uint64(i))
			}
			iovs[i].Base = &buf[0]
			iovs[i].SetLen(len(buf))
			hs[i].Hdr.Iov = &iovs[i]
			hs[i].Hdr.Iovlen = 1
			hs[i].Hdr.Control = &ctrl[i*ctrlSize]
			hs[i].Hdr.SetControllen(ctrlSize)
			hs[i].Hdr.Flags = 0
		}
		pending = hs[:k]
		err := d.in.rc.Read(recv)
		if err != nil {
			return err
		}
		if errno != 0 {
			if transient(errno) {
				continue
			}
			return fmt.Errorf("delay line %s/%s: recvmmsg: %w", d.link, d.dir, errno)
		}
		realNow, now := time.Now().UnixNano(), monotonic()
		if full {
			d.c.dropFull.Add(uint64(n))
			continue
		}
		for i := range n {
			l := int32(hs[i].Len)
			if hs[i].Hdr.Flags&unix.MSG_TRUNC != 0 {
				d.c.dropOversize.Add(1)
				if !warnedOversize {
					warnedOversize = true
					d.log.Warn("frame larger than the interface MTU dropped: turn off TSO/GSO/GRO on the link's veths", "slot", d.ring.slotSize)
				}
				l = 0
			} else if d.loss > 0 && d.rng.Float64() < d.loss {
				d.c.dropLoss.Add(1)
				l = 0
			}
			ts := parseTimestamp(ctrl[i*ctrlSize : i*ctrlSize+int(hs[i].Hdr.Controllen)])
			j := d.ring.idx(tail + uint64(i))
			d.ring.length[j] = l
			d.ring.due[j] = d.sched.due(arrival(ts, realNow, now), now)
		}
		d.ring.commit(n)
		select {
		case d.notify <- struct{}{}:
		default:
		}
	}
}

func (d *direction) writeLoop(done <-chan struct{}) error {
	hs := make([]unix.Mmsghdr, batch)
	iovs := make([]unix.Iovec, batch)
	for {
		head, used := d.ring.used()
		if used == 0 {
			select {
			case <-d.notify:
				continue
			case <-done:
				return nil
			}
		}
		now := monotonic()
		if first := d.ring.due[d.ring.idx(head)]; first > now+int64(window) {
			if err := d.timer.waitUntil(first); err != nil {
				return err
			}
			continue
		}
		k, m := 0, 0
		var bytes uint64
		for k < used && m < batch {
			j := d.ring.idx(head + uint64(k))
			due := d.ring.due[j]
			if due > now+int64(window) {
				break
			}
			if l := d.ring.length[j]; l > 0 {
				buf := d.ring.slot(head + uint64(k))
				iovs[m].Base = &buf[0]
				iovs[m].SetLen(int(l))
				hs[m].Hdr.Iov = &iovs[m]
				hs[m].Hdr.Iovlen = 1
				bytes += uint64(l)
				if late := now - due; late > 0 {
					d.c.lateSum.Add(uint64(late))
					if uint64(late) > d.c.lateMax.Load() {
						d.c.lateMax.Store(uint64(late))
					}
					if late > int64(lateThreshold) {
						d.c.late1ms.Add(1)
					}
				}
				m++
			}
			k++
		}
		if m > 0 {
			failed, err := d.send(hs[:m])
			if err != nil {
				return err
			}
			d.c.packets.Add(uint64(m - failed))
			d.c.bytes.Add(bytes)
		}
		d.ring.release(k)
	}
}

// send hands every frame to the kernel, waiting for socket buffer space
// when needed. A frame the kernel refuses is counted and skipped so one bad
// frame cannot stall the direction.
func (d *direction) send(hs []unix.Mmsghdr) (failed int, err error) {
	d.sendBatch = hs
	for len(d.sendBatch) > 0 {
		err := d.out.rc.Write(d.sendFn)
		if err != nil {
			return failed, err
		}
		n := d.sent
		if d.sendErr != 0 {
			if !transient(d.sendErr) && d.sendErr != unix.EMSGSIZE {
				return failed, fmt.Errorf("delay line %s/%s: sendmmsg: %w", d.link, d.dir, d.sendErr)
			}
			d.c.sendErrors.Add(1)
			failed++
			n = 1
		}
		d.sendBatch = d.sendBatch[n:]
	}
	return failed, nil
}

// sendOnce is the writer's sendmmsg callback, bound once per direction.
func (d *direction) sendOnce(fd uintptr) bool {
	d.sent, d.sendErr = sendmmsg(fd, d.sendBatch)
	return d.sendErr != unix.EAGAIN
}

// monotonic is CLOCK_MONOTONIC in ns: release times are kept on it so that
// a wall-clock step (NTP) cannot hold frames back or release them early.
func monotonic() int64 { return int64(time.Since(monoBase)) + monoOffset }

// Go's monotonic clock is CLOCK_MONOTONIC read through the vDSO; only its
// origin is hidden. One clock_gettime at start recovers the origin, so each
// later reading costs no system call.
var monoBase, monoOffset = func() (time.Time, int64) {
	base := time.Now()
	var ts unix.Timespec
	before := time.Since(base)
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	after := time.Since(base)
	return base, ts.Nano() - int64(before+after)/2
}()

// arrival converts a kernel receive timestamp (CLOCK_REALTIME, Unix ns) to
// the monotonic clock: the frame arrived realNow-ts ago. A missing stamp, or
// one from the future (the wall clock stepped back), means "just now".
func arrival(ts, realNow, monoNow int64) int64 {
	if ts <= 0 || ts > realNow {
		return monoNow
	}
	return monoNow - (realNow - ts)
}
