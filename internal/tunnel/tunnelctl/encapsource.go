package tunnelctl

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// EncapSource is the TunnelSource of the unencrypted VXLAN kind: it asks conn's
// relay in the background (retrying with backoff) and offers the tunnel
// detour once it is up. Close releases the tunnel on the relay and removes
// it here.
type EncapSource struct {
	conn   *relayconn.Conn
	cfg    tunnel.EncapClientConfig
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	client *tunnel.EncapClient
}

var _ detour.Source = (*EncapSource)(nil)

// NewEncapSource starts bringing up the VXLAN tunnel to conn's relay.
func NewEncapSource(conn *relayconn.Conn, cfg tunnel.EncapClientConfig, log *slog.Logger) *EncapSource {
	if log == nil {
		log = slog.Default()
	}
	if cfg.Logger == nil {
		cfg.Logger = log
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &EncapSource{conn: conn, cfg: cfg, log: log.With("relay", conn.Relay().Name), cancel: cancel, done: make(chan struct{})}
	go s.run(ctx)
	return s
}

func (s *EncapSource) run(ctx context.Context) {
	defer close(s.done)
	wait := minRetry
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := OpenEncap(rctx, s.conn, s.cfg)
		cancel()
		if err == nil {
			s.mu.Lock()
			s.client = c
			s.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("vxlan tunnel not up yet, retrying", "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if wait *= 2; wait > maxRetry {
			wait = maxRetry
		}
	}
}

// Client returns the tunnel once it is up (nil before).
func (s *EncapSource) Client() *tunnel.EncapClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Prepare implements detour.Source.
func (s *EncapSource) Prepare(netip.AddrPort) {}

// Detours implements detour.Source.
func (s *EncapSource) Detours(server netip.AddrPort) []detour.Detour {
	if c := s.Client(); c != nil {
		return c.Detours(server)
	}
	return nil
}

// Close stops the background request, releases the tunnel on the relay
// (best effort: the relay's lease expiry removes it otherwise) and removes
// it here.
func (s *EncapSource) Close() error {
	s.cancel()
	<-s.done
	c := s.Client()
	if c == nil {
		return nil
	}
	err := c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if rerr := s.conn.EncapRelease(ctx); rerr != nil {
		s.log.Warn("vxlan release (the relay's lease expiry removes it)", "err", rerr)
	}
	return err
}

// StartAllEncap is StartAll for the VXLAN kind: removes what a crashed
// agent left, then one EncapSource per relay (index = position in conns).
func StartAllEncap(netns string, conns []*relayconn.Conn, log *slog.Logger) ([]*EncapSource, error) {
	if err := tunnel.CleanupEncapClients(netns); err != nil {
		return nil, err
	}
	if len(conns) > tunnel.MaxClients {
		return nil, fmt.Errorf("%d relays: at most %d tunnels", len(conns), tunnel.MaxClients)
	}
	out := make([]*EncapSource, 0, len(conns))
	for i, c := range conns {
		if !AsksTunnel(c) {
			continue
		}
		out = append(out, NewEncapSource(c, tunnel.EncapClientConfig{Netns: netns, Index: i}, log))
	}
	return out, nil
}
