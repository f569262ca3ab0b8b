package benchtool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// Flow completion time (the rack scenario, issue 19): the sender connects,
// writes Size bytes, shuts its side down and stops the clock when the sink
// has read every byte and answered with one byte. FCT runs from the start
// of connect() to that answer, so it includes the handshake, as a
// request of that size would see it.

// FlowOptions configure one flow.
type FlowOptions struct {
	Addr  string // sink host:port
	Size  int64  // bytes to send, > 0
	MPTCP bool
	CC    string // congestion control; default DefaultCC
	Netns string // network namespace of the sender (netnsx spec)
	// Timeout bounds the whole flow; default 2 minutes.
	Timeout time.Duration
}

// FlowResult is one completed flow.
type FlowResult struct {
	FCT               time.Duration
	MPTCP             bool
	CongestionControl string
	// Subflows is the sender's kernel view when the sink's answer arrived
	// (every byte acknowledged): each subflow's bytes acked.
	Subflows []Subflow
}

// Flow sends one flow of o.Size bytes to a Sink and measures its completion time.
func Flow(ctx context.Context, o FlowOptions) (*FlowResult, error) {
	if o.Size <= 0 {
		return nil, fmt.Errorf("flow size %d: must be positive", o.Size)
	}
	if o.CC == "" {
		o.CC = DefaultCC
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	start := time.Now()
	conn, err := dial(ctx, SendOptions{Addr: o.Addr, MPTCP: o.MPTCP, CC: o.CC, Netns: o.Netns, ConnectTimeout: o.Timeout})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	res := &FlowResult{}
	var proto int
	_ = rc.Control(func(fd uintptr) {
		proto = socketProtocol(fd)
		res.CongestionControl = getCongestion(fd)
	})
	if mp, err := conn.MultipathTCP(); err == nil {
		res.MPTCP = mp && proto == ipprotoMPTCP
	}
	buf := make([]byte, 256<<10)
	for left := o.Size; left > 0; {
		n := int64(len(buf))
		if left < n {
			n = left
		}
		w, err := conn.Write(buf[:n])
		if err != nil {
			return nil, sendErr(ctx, "write", err)
		}
		left -= int64(w)
	}
	if err := conn.CloseWrite(); err != nil {
		return nil, sendErr(ctx, "close", err)
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return nil, sendErr(ctx, "waiting for the sink's answer", err)
	}
	res.FCT = time.Since(start)
	res.Subflows = subflowResults(subflowSnapshot(conn, rc, res.MPTCP), nil)
	return res, nil
}

// Sink reads each connection to its end, answers with one byte and closes.
type Sink struct {
	ln net.Listener
	wg sync.WaitGroup
}

// ListenSink opens a sink on addr in netns (MPTCP if mptcp).
func ListenSink(addr, netns string, mptcp bool) (*Sink, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(mptcp)
	var ln net.Listener
	err := netnsx.Do(netns, func() error {
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("flow sink on %s: %w", addr, err)
	}
	s := &Sink{ln: ln}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() {
				defer c.Close()
				// A flow of 100 MB at a few Mbit/s still ends in time.
				c.SetDeadline(time.Now().Add(5 * time.Minute))
				buf := make([]byte, 256<<10)
				for {
					_, err := c.Read(buf)
					if errors.Is(err, io.EOF) {
						_, _ = c.Write([]byte{1})
						return
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return s, nil
}

// Addr is the listening address.
func (s *Sink) Addr() net.Addr { return s.ln.Addr() }

// Close stops the sink and waits for its connections (they end when their
// sender's side does, or at their deadline).
func (s *Sink) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	return err
}
