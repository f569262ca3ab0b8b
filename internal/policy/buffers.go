package policy

import "time"

// BufferWanted is the socket buffer maximum (bytes) the measured
// connections need: for each, 2 x the sum of its subflows' delivery rates x
// its largest smoothed RTT (the receiver holds up to one largest-RTT's
// worth of every path's data out of order, and the window needs the same
// again to keep the paths busy), the largest over all connections; 0
// without measurements. The kernel caps MPTCP's buffer autotuning by
// tcp_rmem[2] (6 MiB by default; the maintainers' advice for long or
// unbalanced paths is to raise tcp_[rw]mem, never to set SO_*BUF, which
// locks every subflow and turns autotuning off). The agent applies it
// (buffer_sizing).
func (p *Engine) BufferWanted() int64 {
	var want float64
	for _, k := range p.conns {
		var sum float64
		var rtt time.Duration
		for _, s := range k.subs {
			if !s.up || s.stale || !s.seen {
				continue
			}
			sum += s.rate
			rtt = max(rtt, s.rtt)
		}
		want = max(want, 2*sum*rtt.Seconds())
	}
	return int64(want)
}
