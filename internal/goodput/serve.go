package goodput

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"
)

// ServeOptions configure a receiver.
type ServeOptions struct {
	Addr  string // listen address, e.g. ":5201" or "10.0.3.2:0"
	MPTCP bool   // accept MPTCP (plain TCP clients are still served)
	Netns string // optional namespace path to listen in
	Log   *slog.Logger
	// IdleTimeout aborts a client that sends nothing for this long; default 30 s.
	IdleTimeout time.Duration
}

// Server is a listening receiver. It serves clients one at a time, so that
// measurements never share the link with each other.
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
	var lc net.ListenConfig
	lc.SetMultipathTCP(o.MPTCP)
	var ln net.Listener
	err := inNetns(o.Netns, func() error {
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", o.Addr)
		return err
	})
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

// Serve accepts clients until ctx is done, then closes the listener and
// returns nil. A misbehaving client is logged and dropped.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	defer s.ln.Close()
	for {
		c, err := s.ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		sum, err := s.handle(ctx, c)
		log := s.o.Log.With("client", c.RemoteAddr().String())
		if err != nil {
			log.Warn("client failed", "err", err)
			continue
		}
		if sum.WindowBytes == 0 {
			log.Warn("client stopped before the end of its warm-up (interrupted?)", "bytes", sum.Bytes)
			continue
		}
		g := 0.0
		if sum.LastNs > sum.WarmupNs {
			g = float64(sum.WindowBytes) * 8 / time.Duration(sum.LastNs-sum.WarmupNs).Seconds() / 1e6
		}
		log.Info("client done", "bytes", sum.Bytes, "goodput_mbps", fmt.Sprintf("%.3f", g), "mptcp", sum.MPTCP)
	}
}

// Serve listens and serves until ctx is done.
func Serve(ctx context.Context, o ServeOptions) error {
	s, err := Listen(o)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

func (s *Server) handle(ctx context.Context, c *net.TCPConn) (*Summary, error) {
	accepted := time.Now()
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	mp, _ := c.MultipathTCP()

	h := make([]byte, helloSize)
	_ = c.SetReadDeadline(accepted.Add(s.o.IdleTimeout))
	if _, err := io.ReadFull(c, h); err != nil {
		return nil, fmt.Errorf("reading hello: %w", err)
	}
	hl, err := parseHello(h)
	if err != nil {
		return nil, err
	}
	cnt := counter{warmup: hl.Warmup}
	buf := make([]byte, 256<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(s.o.IdleTimeout))
		n, err := c.Read(buf)
		cnt.add(time.Since(accepted), n)
		if err == io.EOF {
			break
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, fmt.Errorf("no data for %v", s.o.IdleTimeout)
			}
			return nil, err
		}
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
