package benchtool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Flow completion time (the lab's rack scenario). The client connects
// and sends a 9-byte header: 'U' or 'D' and the flow's size (big-endian
// uint64). Upload: the client then writes Size bytes, shuts its side down
// and stops the clock when the sink has read every byte and answered with
// one byte. Download: the sink writes Size bytes and closes; the clock
// stops at the last byte. FCT runs from the start of connect(), so it
// includes the handshake, as a request of that size would see it.

// FlowOptions configure one flow.
type FlowOptions struct {
	Addr  string // sink host:port
	Size  int64  // bytes to send, > 0
	MPTCP bool
	CC    string // congestion control; default DefaultCC
	Netns string // network namespace of the client (netnsx spec)
	// Download: the sink sends the Size bytes, the client receives.
	Download bool
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
	var hdr [9]byte
	hdr[0] = 'U'
	if o.Download {
		hdr[0] = 'D'
	}
	binary.BigEndian.PutUint64(hdr[1:], uint64(o.Size))
	if _, err := conn.Write(hdr[:]); err != nil {
		return nil, sendErr(ctx, "write", err)
	}
	buf := make([]byte, 256<<10)
	if o.Download {
		var got int64
		for {
			n, err := conn.Read(buf)
			got += int64(n)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, sendErr(ctx, "read", err)
			}
		}
		res.FCT = time.Since(start)
		if got != o.Size {
			return nil, fmt.Errorf("download: %d bytes received, want %d", got, o.Size)
		}
		// Per subflow: bytes received (tcpi_bytes_received).
		end := subflowSnapshot(conn, rc, res.MPTCP)
		res.Subflows = subflowResults(end, nil)
		for i := range res.Subflows {
			k := res.Subflows[i].Local.String() + "-" + res.Subflows[i].Remote.String()
			if _, ok := end[k]; !ok {
				k = "tcp"
			}
			res.Subflows[i].BytesAcked = end[k].info.Bytes_received
		}
		return res, nil
	}
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

// MaxFlowSize bounds what a sink sends for one download request.
const MaxFlowSize = 10_000_000_000

// Sink reads each connection to its end, answers with one byte and closes.
type Sink struct {
	ln net.Listener
	wg sync.WaitGroup
}

// ListenSink opens a sink on addr in netns (MPTCP if mptcp); downloads
// are sent with congestion control cc ("" = the namespace's default).
func ListenSink(addr, netns string, mptcp bool, cc string) (*Sink, error) {
	ln, err := listenIn(addr, netns, mptcp)
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
				var hdr [9]byte
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				size := binary.BigEndian.Uint64(hdr[1:])
				buf := make([]byte, 256<<10)
				if hdr[0] == 'D' {
					if size > MaxFlowSize {
						return
					}
					if cc != "" {
						if rc, err := c.(*net.TCPConn).SyscallConn(); err == nil {
							var cerr error
							_ = rc.Control(func(fd uintptr) { cerr = setCongestion(fd, cc) })
							if cerr != nil {
								return
							}
						}
					}
					for left := int64(size); left > 0; {
						n, err := c.Write(buf[:min(int64(len(buf)), left)])
						if err != nil {
							return
						}
						left -= int64(n)
					}
					return
				}
				if hdr[0] != 'U' {
					return
				}
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
