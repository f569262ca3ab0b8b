// Package benchtool is "mpdetour bench": it measures bulk-transfer goodput the way the reference
// evaluation did: a sender writes for a fixed duration, the receiver counts
// the bytes it reads, and goodput is the bytes that arrived from t = warm-up
// (1 s) to the last byte, divided by that elapsed time. Starting the window
// late drops slow start; ending it at the last byte (not at a fixed 10 s)
// keeps MPTCP's slower close out of the measurement, but averages a
// transfer that delivers for longer (an MPTCP subflow draining its unsent
// backlog after the writing stops) over a longer window, so the result
// also carries the goodput over the same window for every transfer, the
// warm-up to the end of the writing (EqualWindow). Arrival times are the
// receiving kernel's timestamps, so a receiver that is short of CPU and
// reads late does not shift bytes into the window.
//
// The sender sets the congestion control of its socket (default cubic,
// whatever the host default) and reports what the kernel applied. For MPTCP
// it reads every subflow's TCP_INFO from the kernel (MPTCP_FULL_INFO, or
// MPTCP_TCPINFO + MPTCP_SUBFLOW_ADDRS on older kernels) just after the
// warm-up and just before it stops writing, so per-subflow bytes include
// subflows that joined late. Per-subflow bytes are the sender's
// tcpi_bytes_acked: the receiver sees only the reassembled MPTCP stream.
//
// Send and Serve are used by "mpdetour bench", by "mpdetour-lab check" and
// by the benchmark runner; Result is their JSON output format.
package benchtool

import (
	"net/netip"
	"time"
)

// DefaultCC is the congestion control the reference evaluation used. The
// host default (BBR here) overruns small tbf queues.
const DefaultCC = "cubic"

// DefaultWarmup is the start of the goodput window.
const DefaultWarmup = time.Second

// Result is one measured transfer. All rates are in Mbit/s (10^6 bit/s).
type Result struct {
	Addr string `json:"addr"`
	// MPTCPRequested is --mptcp. MPTCP is whether the connection really is
	// MPTCP at the sender; Fallback is set when MPTCP was requested but the
	// socket could not be created as MPTCP or the connection fell back to
	// TCP (e.g. the server or a middlebox does not speak it).
	MPTCPRequested bool `json:"mptcp_requested"`
	MPTCP          bool `json:"mptcp"`
	ServerMPTCP    bool `json:"server_mptcp"`
	Fallback       bool `json:"fallback"`
	// CongestionControl is read back from the socket after connecting.
	CongestionControl string `json:"congestion_control"`

	Duration float64 `json:"duration_s"` // how long the sender wrote
	// Download: the server sent and this side counted; per-subflow
	// BytesAcked are then the bytes each subflow received.
	Download bool    `json:"download,omitempty"`
	Warmup   float64 `json:"warmup_s"`
	// Bytes is every byte the receiver read; WindowBytes those read after
	// the warm-up, over WindowSeconds (warm-up to last byte).
	Bytes         uint64  `json:"bytes"`
	WindowBytes   uint64  `json:"window_bytes"`
	WindowSeconds float64 `json:"window_s"`
	// Goodput is the reference method: WindowBytes*8 / WindowSeconds.
	Goodput float64 `json:"goodput_mbps"`
	// EqualBytes arrived between the warm-up and the end of the writing
	// duration ([Warmup, Duration] from the hello, from the receiver's
	// per-second counts: EqualWindow), EqualGoodput is EqualBytes*8 /
	// (Duration - Warmup): the same window for every transfer of the same
	// settings, where Goodput's window ends at each transfer's last byte
	// (and a transfer that drains a backlog after the writing stops, as an
	// MPTCP subflow does, is averaged over a longer window).
	EqualBytes   uint64  `json:"equal_bytes"`
	EqualGoodput float64 `json:"equal_goodput_mbps"`
	// MaxGap is the longest stall of the receiver (no data delivered), in
	// seconds, and MaxGapEnd when it ended (from the hello).
	MaxGap    float64 `json:"max_gap_s"`
	MaxGapEnd float64 `json:"max_gap_end_s"`
	// Series, when SendOptions.SeriesEvery is set: this side's per-subflow
	// byte counts (acked for uploads, received for downloads) sampled
	// during the transfer, to see when a path carried data again.
	Series []SeriesPoint `json:"series,omitempty"`
	// Samples are the receiver's per-second counts, from the arrival of the
	// first data.
	Samples []Sample `json:"samples"`

	// Subflows is the sender's kernel view at the end of the transfer: every
	// MPTCP subflow, or the TCP connection itself as one entry.
	Subflows []Subflow `json:"subflows"`
	// Retransmits sums the subflows' retransmitted segments.
	Retransmits uint64 `json:"retransmits"`
}

// Subflow is one TCP subflow (or the plain TCP connection) as the sender's
// kernel reports it.
type Subflow struct {
	ID     uint32         `json:"id"` // kernel subflow id (0 for TCP or old kernels)
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	// BytesAcked over the whole connection and within the goodput window
	// (difference to the sample taken at the warm-up).
	BytesAcked       uint64 `json:"bytes_acked"`
	WindowBytesAcked uint64 `json:"window_bytes_acked"`
	BytesRetrans     uint64 `json:"bytes_retrans"`
	Retransmits      uint32 `json:"retransmits"` // segments (tcpi_total_retrans)
	// RTT is the smoothed RTT, MinRTT the lowest seen, both in ms.
	RTT    float64 `json:"rtt_ms"`
	MinRTT float64 `json:"min_rtt_ms"`
	Cwnd   uint32  `json:"cwnd"`
	MSS    uint32  `json:"mss"`
}

// SeriesPoint is one sample of every subflow's byte count, T seconds after
// the transfer started; Bytes is keyed by "local-remote".
type SeriesPoint struct {
	T     float64           `json:"t"`
	Bytes map[string]uint64 `json:"bytes"`
}
