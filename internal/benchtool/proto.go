package benchtool

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Wire protocol, one TCP or MPTCP connection per measurement:
//
//	sender -> receiver: hello (16 bytes), then bulk data until the sender
//	                    half-closes (shutdown SHUT_WR, a DATA_FIN for MPTCP)
//	receiver -> sender: one JSON Summary, then close
//
// The receiver counts, because goodput is what arrives: bytes still queued
// in the sender's socket buffer or lost on the way never count. The hello
// carries the warm-up so that the receiver can split its byte count without
// trusting the sender's clock.

const (
	helloMagic = "mpdgp1\n\x00"
	helloSize  = 16
	// maxSummary bounds what the sender reads back from the receiver.
	maxSummary = 1 << 20
	// maxSamples bounds a summary: one sample per second for ~27 hours.
	maxSamples = 100_000
)

// hello is the client's preamble. With Download the roles swap: the
// server sends for Duration and the client counts what arrives.
type hello struct {
	Warmup   time.Duration
	Download bool
	Duration time.Duration // download only
}

// downloadFlag marks a download in the hello's last word, whose other 31
// bits carry the duration in ms (an upload leaves the word zero).
const downloadFlag = 1 << 31

func (h hello) marshal() []byte {
	b := make([]byte, helloSize)
	copy(b, helloMagic)
	binary.BigEndian.PutUint32(b[8:], uint32(h.Warmup/time.Millisecond))
	if h.Download {
		binary.BigEndian.PutUint32(b[12:], downloadFlag|uint32(h.Duration/time.Millisecond))
	}
	return b
}

// parseHello decodes the first bytes a client sends (untrusted).
func parseHello(b []byte) (hello, error) {
	if len(b) != helloSize {
		return hello{}, fmt.Errorf("hello is %d bytes, want %d", len(b), helloSize)
	}
	if string(b[:8]) != helloMagic {
		return hello{}, errors.New("not an mpdetour bench client (bad magic)")
	}
	ms := binary.BigEndian.Uint32(b[8:])
	if ms > 3600_000 {
		return hello{}, fmt.Errorf("warm-up %d ms is longer than an hour", ms)
	}
	h := hello{Warmup: time.Duration(ms) * time.Millisecond}
	if w := binary.BigEndian.Uint32(b[12:]); w != 0 {
		if w&downloadFlag == 0 {
			return hello{}, errors.New("reserved hello bytes are not zero")
		}
		d := w &^ downloadFlag
		if d == 0 || d > 24*3600_000 || time.Duration(d)*time.Millisecond <= h.Warmup {
			return hello{}, fmt.Errorf("download of %d ms (warm-up %d ms): want a duration longer than the warm-up, at most a day", d, ms)
		}
		h.Download, h.Duration = true, time.Duration(d)*time.Millisecond
	}
	return h, nil
}

// Sample is the data received during one second of the transfer.
type Sample struct {
	// Start is the offset of the second from the arrival of the sender's
	// first bytes (its hello), by the receiving kernel's clock.
	Start float64 `json:"start_s"`
	// Seconds is the length of the sample: 1 except for the last one.
	Seconds float64 `json:"seconds"`
	Bytes   uint64  `json:"bytes"`
	Mbps    float64 `json:"mbps"`
}

// Summary is what the receiver reports back to the sender.
type Summary struct {
	Version int `json:"version"`
	// MPTCP: the receiver's accepted connection is MPTCP (not fallen back).
	MPTCP bool `json:"mptcp"`
	// Bytes counts every data byte after the hello.
	Bytes uint64 `json:"bytes"`
	// WarmupNs is the warm-up the receiver applied; bytes that arrived
	// before it (counted from the hello) are excluded from the goodput window.
	WarmupNs int64 `json:"warmup_ns"`
	// LastNs is when the last data byte arrived (offset from the hello).
	LastNs int64 `json:"last_ns"`
	// WindowBytes arrived at or after the warm-up, up to LastNs.
	WindowBytes uint64   `json:"window_bytes"`
	Samples     []Sample `json:"samples"`
	// MaxGapNs is the longest time between two reads that delivered data
	// (after the first), MaxGapEndNs when it ended (offset from the hello):
	// how long the transfer stalled, e.g. while a path failed over.
	MaxGapNs    int64 `json:"max_gap_ns,omitempty"`
	MaxGapEndNs int64 `json:"max_gap_end_ns,omitempty"`
}

const summaryVersion = 1

// ParseSummary decodes and checks the receiver's summary. The bytes come
// from the network, so every field is checked for consistency; a
// malformed summary is an error naming the field, never a wrong result.
func ParseSummary(b []byte) (*Summary, error) {
	if len(b) > maxSummary {
		return nil, fmt.Errorf("summary is %d bytes, more than %d", len(b), maxSummary)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("receiver summary: %w", err)
	}
	if s.Version != summaryVersion {
		return nil, fmt.Errorf("receiver summary: version %d, want %d", s.Version, summaryVersion)
	}
	if s.WarmupNs < 0 || s.LastNs < 0 {
		return nil, errors.New("receiver summary: negative warmup_ns or last_ns")
	}
	if s.MaxGapNs < 0 || s.MaxGapEndNs < s.MaxGapNs || s.MaxGapEndNs > s.LastNs {
		return nil, errors.New("receiver summary: max_gap_ns/max_gap_end_ns inconsistent with last_ns")
	}
	if s.WindowBytes > s.Bytes {
		return nil, fmt.Errorf("receiver summary: window_bytes %d exceed bytes %d", s.WindowBytes, s.Bytes)
	}
	if s.WindowBytes > 0 && s.LastNs <= s.WarmupNs {
		return nil, errors.New("receiver summary: window bytes but last_ns is not after warmup_ns")
	}
	if len(s.Samples) > maxSamples {
		return nil, fmt.Errorf("receiver summary: %d samples, more than %d", len(s.Samples), maxSamples)
	}
	var sum uint64
	for i, x := range s.Samples {
		if !finite(x.Start) || !finite(x.Seconds) || !finite(x.Mbps) || x.Start < 0 || x.Seconds < 0 || x.Seconds > 1 || x.Mbps < 0 {
			return nil, fmt.Errorf("receiver summary: sample %d has an invalid time or rate", i)
		}
		if i > 0 && x.Start <= s.Samples[i-1].Start {
			return nil, fmt.Errorf("receiver summary: sample %d is not after sample %d", i, i-1)
		}
		if sum+x.Bytes < sum {
			return nil, fmt.Errorf("receiver summary: sample %d overflows the byte count", i)
		}
		sum += x.Bytes
	}
	if sum != s.Bytes {
		return nil, fmt.Errorf("receiver summary: samples add up to %d bytes, bytes is %d", sum, s.Bytes)
	}
	return &s, nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// counter turns the receiver's reads, stamped with their arrival times,
// into a Summary.
type counter struct {
	warmup time.Duration
	bytes  uint64
	window uint64
	last   time.Duration
	per    []uint64 // bytes per second since the hello
	// gap is the longest time between data-carrying reads, gapEnd when it
	// ended.
	gap, gapEnd time.Duration
}

// add records n bytes that arrived at offset t from the hello.
func (c *counter) add(t time.Duration, n int) {
	if n <= 0 {
		return
	}
	if t < 0 {
		t = 0
	}
	sec := int(t / time.Second)
	if sec >= maxSamples {
		sec = maxSamples - 1
	}
	for len(c.per) <= sec {
		c.per = append(c.per, 0)
	}
	c.per[sec] += uint64(n)
	if c.bytes > 0 && t-c.last > c.gap {
		c.gap, c.gapEnd = t-c.last, t
	}
	c.bytes += uint64(n)
	if t >= c.warmup {
		c.window += uint64(n)
	}
	if t > c.last {
		c.last = t
	}
}

func (c *counter) summary(mptcp bool) Summary {
	s := Summary{Version: summaryVersion, MPTCP: mptcp, Bytes: c.bytes, WarmupNs: int64(c.warmup),
		LastNs: int64(c.last), WindowBytes: c.window, Samples: []Sample{},
		MaxGapNs: int64(c.gap), MaxGapEndNs: int64(c.gapEnd)}
	if c.window > 0 && c.last <= c.warmup {
		// Everything after the warm-up arrived within the same nanosecond
		// reading; there is no window to divide by.
		s.WindowBytes = 0
	}
	for i, b := range c.per {
		secs := 1.0
		if i == len(c.per)-1 {
			secs = max(c.last.Seconds()-float64(i), 0)
		}
		x := Sample{Start: float64(i), Seconds: secs, Bytes: b}
		if secs > 0 {
			x.Mbps = float64(b) * 8 / secs / 1e6
		}
		s.Samples = append(s.Samples, x)
	}
	return s
}
