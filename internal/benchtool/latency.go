package benchtool

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Setup latency ("connect() to first byte", docs/convert.md): the client
// starts the clock, connects, writes one byte and stops the clock when the
// responder's one-byte answer arrives, as a request/response protocol
// (HTTP's time to first byte) would see it.

// LatencyServer answers every connection's first byte with one byte.
type LatencyServer struct {
	ln net.Listener
	wg sync.WaitGroup
}

// ListenLatency opens a plain TCP (or MPTCP) responder on addr in netns.
func ListenLatency(addr, netns string, mptcp bool) (*LatencyServer, error) {
	ln, err := listenIn(addr, netns, mptcp)
	if err != nil {
		return nil, fmt.Errorf("latency responder on %s: %w", addr, err)
	}
	s := &LatencyServer{ln: ln}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				var b [1]byte
				if _, err := io.ReadFull(c, b[:]); err == nil {
					_, _ = c.Write(b[:])
				}
			})
		}
	})
	return s, nil
}

// Addr is the listening address.
func (s *LatencyServer) Addr() net.Addr { return s.ln.Addr() }

// Close stops the responder and waits for its connections.
func (s *LatencyServer) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// Latency measures n connections to addr, one after the other, with plain
// TCP sockets (what an unmodified program opens; under "mpdetour run" they
// become MPTCP, possibly converted). It returns each connection's time from
// the start of connect() to the first byte received.
func Latency(ctx context.Context, addr string, n int, pause time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < n; i++ {
		if i > 0 && pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
		d := net.Dialer{Timeout: 10 * time.Second}
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return out, fmt.Errorf("connect to %s: %w", addr, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		var b [1]byte
		if _, err := c.Write([]byte{'?'}); err != nil {
			c.Close()
			return out, fmt.Errorf("write: %w", err)
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			c.Close()
			return out, fmt.Errorf("first byte: %w", err)
		}
		out = append(out, time.Since(start))
		c.Close()
	}
	return out, nil
}
