package delayline

import "sync/atomic"

// ring is the FIFO of one direction: a single producer (the reader) and a
// single consumer (the writer). Frames are received straight into the slot
// buffers and sent straight from them, so a frame is never copied in user
// space and the memory is bounded by slots x slotSize, allocated once.
//
// Slots between head and tail are full; the producer owns [tail, head+n) and
// the consumer owns [head, tail). The atomics on head and tail publish the
// slot contents (Go atomics are sequentially consistent).
type ring struct {
	buf      []byte
	slotSize int
	n        uint64
	length   []int32 // 0 marks a frame to discard (truncated or lost)
	due      []int64 // release time, CLOCK_MONOTONIC ns
	head     atomic.Uint64
	tail     atomic.Uint64
}

func newRing(slots, slotSize int) *ring {
	return &ring{
		buf:      make([]byte, slots*slotSize),
		slotSize: slotSize,
		n:        uint64(slots),
		length:   make([]int32, slots),
		due:      make([]int64, slots),
	}
}

// slot returns the buffer of absolute position p.
func (r *ring) slot(p uint64) []byte {
	i := int(p % r.n)
	return r.buf[i*r.slotSize : (i+1)*r.slotSize]
}

func (r *ring) idx(p uint64) int { return int(p % r.n) }

// free is the number of slots the producer may fill, starting at tail.
func (r *ring) free() (tail uint64, n int) {
	t := r.tail.Load()
	return t, int(r.n - (t - r.head.Load()))
}

// commit publishes k filled slots.
func (r *ring) commit(k int) { r.tail.Add(uint64(k)) }

// used is the number of slots the consumer may read, starting at head.
func (r *ring) used() (head uint64, n int) {
	h := r.head.Load()
	return h, int(r.tail.Load() - h)
}

// release returns k consumed slots to the producer.
func (r *ring) release(k int) { r.head.Add(uint64(k)) }

// scheduler turns arrival times into release times for one direction. Due
// times never decrease, so the delay line cannot reorder a direction even if
// the clock steps or the kernel's timestamps jitter.
type scheduler struct {
	delay   int64
	lastDue int64
}

// due returns the release time of a frame that arrived at arrival (kernel
// timestamp) and was read at now. A timestamp from the future (clock stepped
// back) counts as now; a frame that waited longer than the delay in the
// socket is released at once rather than "catching up" later ones.
func (s *scheduler) due(arrival, now int64) int64 {
	if arrival <= 0 || arrival > now {
		arrival = now
	}
	d := arrival + s.delay
	if d < s.lastDue {
		d = s.lastDue
	}
	s.lastDue = d
	return d
}
