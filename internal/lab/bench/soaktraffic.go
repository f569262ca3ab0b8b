package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// The soak's traffic: every connection sends a pseudo-random stream (a
// ChaCha8 stream seeded with the connection's number), the server echoes
// it, and the client compares every byte it gets back with the stream it
// sent. A byte lost, duplicated or changed in either direction, a short
// answer or a connection that does not end cleanly is a failed connection,
// counted by what went wrong.

// soakStream is connection id's byte stream.
func soakStream(id uint64) io.Reader {
	var seed [32]byte
	for i := 0; i < 8; i++ {
		seed[i] = byte(id >> (8 * i))
	}
	seed[31] = 0x5a
	return rand.NewChaCha8(seed)
}

// errMismatch: the echo differs from what was sent.
var errMismatch = errors.New("echoed bytes differ from the bytes sent")

// verifyEcho reads r until EOF and compares it with want's stream; it
// returns how many bytes matched. A mismatch is errMismatch (at its offset).
func verifyEcho(r io.Reader, want io.Reader) (int64, error) {
	got := make([]byte, 32<<10)
	exp := make([]byte, 32<<10)
	var n int64
	for {
		k, err := r.Read(got)
		if k > 0 {
			if _, e := io.ReadFull(want, exp[:k]); e != nil {
				return n, e
			}
			if !bytes.Equal(got[:k], exp[:k]) {
				i := 0
				for i < k && got[i] == exp[i] {
					i++
				}
				return n + int64(i), fmt.Errorf("%w at byte %d", errMismatch, n+int64(i))
			}
			n += int64(k)
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// soakEcho serves ln: each connection gets back what it sends, and its
// write side is closed when the client's is (the client's EOF).
func soakEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 32<<10)
			// Wrapped: a plain Read/Write loop, no splice of a socket into itself.
			if _, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf); err != nil {
				return
			}
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
		}()
	}
}

// soakTally counts the soak's connections.
type soakTally struct {
	nextID    atomic.Uint64
	attempted atomic.Int64 // connections started (short and long)
	verified  atomic.Int64 // ended cleanly with every byte echoed and checked
	bytes     atomic.Int64 // bytes verified (each counted once: sent and echoed back)
	mu        sync.Mutex
	failed    map[string]int64 // by what went wrong
}

func (t *soakTally) fail(why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failed == nil {
		t.failed = map[string]int64{}
	}
	t.failed[why]++
}

// failures returns the total and a copy of the counts.
func (t *soakTally) failures() (int64, map[string]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	m := map[string]int64{}
	for k, v := range t.failed {
		n += v
		m[k] = v
	}
	return n, m
}

// shortConn sends n bytes on c, reads them back and checks them; it
// closes c. The empty string means verified; else what failed.
func (t *soakTally) shortConn(c net.Conn, n int, deadline time.Time) string {
	defer c.Close()
	id := t.nextID.Add(1)
	_ = c.SetDeadline(deadline)
	werr := make(chan error, 1)
	go func() {
		_, err := io.CopyN(c, soakStream(id), int64(n))
		if err == nil {
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			}
		}
		if err != nil {
			_ = c.SetReadDeadline(time.Now()) // the reader would wait for bytes never sent
		}
		werr <- err
	}()
	got, rerr := verifyEcho(c, soakStream(id))
	if err := <-werr; err != nil {
		return "write: " + errClass(err)
	}
	switch {
	case errors.Is(rerr, errMismatch):
		return "echo differs"
	case rerr != nil:
		return "read: " + errClass(rerr)
	case got != int64(n):
		return "echo short"
	}
	t.bytes.Add(got)
	return ""
}

// longConn sends chunk bytes every period on c until stop is closed, reads
// the echo all along and checks it, then closes its side and checks that
// everything came back. "" = verified.
func (t *soakTally) longConn(c net.Conn, chunk int, period time.Duration, stop <-chan struct{}) string {
	defer c.Close()
	id := t.nextID.Add(1)
	type result struct {
		n   int64
		err error
	}
	rd := make(chan result, 1)
	go func() {
		n, err := verifyEcho(c, soakStream(id))
		if err != nil {
			_ = c.SetWriteDeadline(time.Now()) // stop the writer
		}
		rd <- result{n, err}
	}()
	src := soakStream(id)
	buf := make([]byte, chunk)
	var written int64
	tick := time.NewTicker(period)
	defer tick.Stop()
	var werr error
	for werr == nil {
		select {
		case <-stop:
		case <-tick.C:
			_, _ = io.ReadFull(src, buf)
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			var k int
			k, werr = c.Write(buf)
			written += int64(k)
			continue
		}
		break
	}
	if werr == nil {
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			werr = cw.CloseWrite()
		}
	}
	// The echo of what is in flight: 30 s at most.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if werr != nil {
		_ = c.SetReadDeadline(time.Now())
	}
	r := <-rd
	switch {
	case errors.Is(r.err, errMismatch):
		return "echo differs"
	case werr != nil:
		return "write: " + errClass(werr)
	case r.err != nil:
		return "read: " + errClass(r.err)
	case r.n != written:
		return "echo short"
	}
	t.bytes.Add(r.n)
	return ""
}

// errClass names an error's kind for the failure counts (no addresses,
// so that counts add up).
func errClass(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "closed early"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// trend is the Theil-Sen slope of y over x (the median of the pairwise
// slopes: a GC cycle or a single outlier does not move it) and its 95 %
// confidence interval (Sen 1968, from Kendall's S distribution).
func trend(x, y []float64) (slope, lo, hi float64) {
	var s []float64
	for i := range x {
		for j := i + 1; j < len(x); j++ {
			if x[j] != x[i] {
				s = append(s, (y[j]-y[i])/(x[j]-x[i]))
			}
		}
	}
	if len(s) == 0 {
		return 0, math.Inf(-1), math.Inf(1)
	}
	sort.Float64s(s)
	N := len(s)
	if N%2 == 1 {
		slope = s[N/2]
	} else {
		slope = (s[N/2-1] + s[N/2]) / 2
	}
	n := float64(len(x))
	c := 1.96 * math.Sqrt(n*(n-1)*(2*n+5)/18)
	// 0-based ranks of the bounds ((N-C)/2 and (N+C)/2+1, 1-based).
	l := int(math.Floor((float64(N)-c)/2)) - 1
	u := int(math.Ceil((float64(N) + c) / 2))
	if l < 0 {
		lo = math.Inf(-1)
	} else {
		lo = s[l]
	}
	if u >= N {
		hi = math.Inf(1)
	} else {
		hi = s[u]
	}
	return slope, lo, hi
}
