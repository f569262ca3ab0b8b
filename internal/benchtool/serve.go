package benchtool

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ServeOptions configure a receiver.
type ServeOptions struct {
	Addr  string // listen address, e.g. ":5201" or "10.0.3.2:0"
	MPTCP bool   // accept MPTCP (plain TCP clients are still served)
	Netns string // optional namespace to listen in (netnsx spec: name or path)
	Log   *slog.Logger
	// IdleTimeout aborts a client that sends nothing for this long; default 30 s.
	IdleTimeout time.Duration
}

// Server is a listening receiver. Each client is measured on its own, so
// concurrent clients (flows sharing a bottleneck) each get their own
// summary.
type Server struct {
	ln    *net.TCPListener
	o     ServeOptions
	mptcp bool
}

// Listen opens the receiver's socket.
func Listen(o ServeOptions) (*Server, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 30 * time.Second
	}
	ln, err := listenIn(o.Addr, o.Netns, o.MPTCP)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", o.Addr, err)
	}
	s := &Server{ln: ln.(*net.TCPListener), o: o}
	// Go quietly falls back to a TCP listener when the kernel refuses
	// MPTCP sockets; say so instead of measuring something else.
	if rc, err := s.ln.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { s.mptcp = socketProtocol(fd) == ipprotoMPTCP })
	}
	if o.MPTCP && !s.mptcp {
		o.Log.Warn("MPTCP listener unavailable, serving plain TCP", "addr", s.ln.Addr())
	}
	return s, nil
}

// Addr is the listening address (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// MPTCP reports whether the listening socket is MPTCP.
func (s *Server) MPTCP() bool { return s.mptcp }

// Close stops listening.
func (s *Server) Close() error { return s.ln.Close() }

// Serve accepts clients until ctx is done, then closes the listener, ends
// the transfers in progress and returns nil. A misbehaving client is logged
// and dropped.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	defer s.ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := s.ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveOne(ctx, c)
		}()
	}
}

func (s *Server) serveOne(ctx context.Context, c *net.TCPConn) {
	log := s.o.Log.With("client", c.RemoteAddr().String())
	sum, err := s.handle(ctx, c)
	if err != nil {
		log.Warn("client failed", "err", err)
		return
	}
	if sum == nil {
		log.Info("download served")
		return
	}
	if sum.WindowBytes == 0 {
		log.Warn("client stopped before the end of its warm-up (interrupted?)", "bytes", sum.Bytes)
		return
	}
	g := float64(sum.WindowBytes) * 8 / time.Duration(sum.LastNs-sum.WarmupNs).Seconds() / 1e6
	log.Info("client done", "bytes", sum.Bytes, "goodput_mbps", fmt.Sprintf("%.3f", g), "mptcp", sum.MPTCP)
}

// Serve listens and serves until ctx is done.
func Serve(ctx context.Context, o ServeOptions) error {
	s, err := Listen(o)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// handle measures one client. Times come from the kernel's receive
// timestamps (SO_TIMESTAMPNS, supported by TCP and MPTCP sockets): when a
// busy receiver reads late, the bytes still count at the time they arrived.
// t = 0 is the arrival of the client's hello, i.e. the start of its data.
func (s *Server) handle(ctx context.Context, c *net.TCPConn) (*Summary, error) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	mp, _ := c.MultipathTCP()
	r, err := newStampedReader(c)
	if err != nil {
		return nil, err
	}

	h := make([]byte, helloSize)
	var start int64
	for got := 0; got < helloSize; {
		_ = c.SetReadDeadline(time.Now().Add(s.o.IdleTimeout))
		n, ts, err := r.read(h[got:])
		if err != nil {
			return nil, fmt.Errorf("reading hello: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("reading hello: %w", io.ErrUnexpectedEOF)
		}
		if got == 0 {
			start = ts
		}
		got += n
	}
	hl, err := parseHello(h)
	if err != nil {
		return nil, err
	}
	if hl.Download {
		return nil, s.sendDownload(c, hl)
	}
	cnt := counter{warmup: hl.Warmup}
	buf := make([]byte, 256<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(s.o.IdleTimeout))
		n, ts, err := r.read(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, fmt.Errorf("no data for %v", s.o.IdleTimeout)
			}
			return nil, err
		}
		if n == 0 {
			break
		}
		cnt.add(time.Duration(ts-start), n)
	}
	sum := cnt.summary(mp)
	b, err := json.Marshal(sum)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(s.o.IdleTimeout))
	if _, err := c.Write(b); err != nil {
		return nil, fmt.Errorf("writing summary: %w", err)
	}
	return &sum, nil
}

// sendDownload writes to a downloading client for the hello's duration,
// then closes its direction and waits for the client to close (it counts).
func (s *Server) sendDownload(c *net.TCPConn, h hello) error {
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, notsentLowat)
		})
	}
	if err := writeFor(c, h.Duration); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	if err := c.CloseWrite(); err != nil {
		return fmt.Errorf("download: close: %w", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(s.o.IdleTimeout))
	_, _ = io.Copy(io.Discard, c)
	return nil
}

// writeFor writes a fixed pattern to c for d (the deadline ends it).
func writeFor(c *net.TCPConn, d time.Duration) error {
	buf := make([]byte, 256<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	if err := c.SetWriteDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	for {
		if _, err := c.Write(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil
			}
			return err
		}
	}
}

// stampedReader reads a stream socket with recvmsg to get, with each read,
// the kernel's arrival time of the newest data it returned.
type stampedReader struct {
	rc  syscall.RawConn
	oob []byte
}

func newStampedReader(c *net.TCPConn) (*stampedReader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_TIMESTAMPNS: %w", serr)
	}
	return &stampedReader{rc: rc, oob: make([]byte, 128)}, nil
}

// read returns n = 0 at end of stream. ts is Unix ns: the kernel's stamp,
// or the current time when the kernel sent none.
func (r *stampedReader) read(p []byte) (n int, ts int64, err error) {
	var oobn int
	var rerr error
	err = r.rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), p, r.oob, 0)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, 0, err
	}
	ts = rxTimestamp(r.oob[:oobn])
	if ts == 0 {
		ts = time.Now().UnixNano()
	}
	return n, ts, nil
}

// rxTimestamp returns the SCM_TIMESTAMPNS time in Unix ns, or 0.
func rxTimestamp(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:]))
			return sec*1e9 + nsec
		}
	}
	return 0
}
