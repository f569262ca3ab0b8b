package tunnelctl

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/tunnel"
)

// TunnelSource keeps a tunnel to one relay: it asks for it in the background,
// retrying with backoff while the relay is unreachable or refuses, and
// serves as a detour.Source that offers nothing until the tunnel is up.
// This is what the agent passes to agent.New, one per relay.
type TunnelSource struct {
	conn   *relayconn.Conn
	cfg    tunnel.ClientConfig
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	client *tunnel.Client
}

var _ detour.Source = (*TunnelSource)(nil)

// Retry bounds for the background tunnel request.
const (
	minRetry = 500 * time.Millisecond
	maxRetry = 30 * time.Second
)

// NewSource starts bringing up the tunnel to conn's relay with cfg (see
// Open). Close stops it and removes the tunnel.
func NewSource(conn *relayconn.Conn, cfg tunnel.ClientConfig, log *slog.Logger) *TunnelSource {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &TunnelSource{conn: conn, cfg: cfg, log: log.With("relay", conn.Relay().Name), cancel: cancel, done: make(chan struct{})}
	go s.run(ctx)
	return s
}

// followEvery is how often a TunnelSource compares its tunnel's key with its
// relay connection's.
const followEvery = time.Second

// follow keeps the tunnel on the member key of the relay connection's
// session: after a key rotation the agent rekeys the tunnel at once
// (Rekey), but a rotation whose new session came into use later (a new
// certificate refused first, then fixed) is followed here.
func (s *TunnelSource) follow(ctx context.Context) {
	t := time.NewTicker(followEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		priv := s.conn.Key()
		if s.conn.SessionKey() != priv.Public() || s.conn.ConfirmedKey() != priv.Public() {
			// The relay still knows us by the old key, or it refused
			// the rotation: its WireGuard peer keeps the old key.
			continue
		}
		s.mu.Lock()
		same := s.cfg.PrivateKey == wgtypes.Key(priv)
		s.mu.Unlock()
		if !same {
			s.log.Info("tunnel: following the relay connection's new member key")
			if err := s.Rekey(priv); err != nil {
				s.log.Warn("tunnel: rekey", "err", err)
			}
		}
	}
}

func (s *TunnelSource) run(ctx context.Context) {
	defer close(s.done)
	wait := minRetry
	defer func() {
		// Once the tunnel is up (or the source closes): follow rotations.
		if ctx.Err() == nil {
			s.follow(ctx)
		}
	}()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s.mu.Lock()
		cfg := s.cfg
		s.mu.Unlock()
		c, err := Open(rctx, s.conn, cfg)
		cancel()
		if err == nil {
			s.mu.Lock()
			s.client = c
			rekeyed := s.cfg.PrivateKey != cfg.PrivateKey
			key := s.cfg.PrivateKey
			s.mu.Unlock()
			if rekeyed {
				// A Rekey came while the tunnel was being opened with
				// the old key: it found no client to rekey.
				if err := c.Rekey(key); err != nil {
					s.log.Warn("tunnel: rekey after opening", "err", err)
				}
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("tunnel not up yet, retrying", "in", wait, "err", err)
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
func (s *TunnelSource) Client() *tunnel.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Rekey switches the tunnel to the member's new key after its relay
// connection rotated (relayconn.Conn.Rotate moved the relay's peer to
// the new key): the tunnel keeps its address, a new handshake follows.
// A tunnel not up yet is asked for with the new key.
func (s *TunnelSource) Rekey(priv proto.Key) error {
	s.mu.Lock()
	s.cfg.PrivateKey = wgtypes.Key(priv)
	c := s.client
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.Rekey(wgtypes.Key(priv))
}

// Conn is the relay connection the tunnel is asked for on.
func (s *TunnelSource) Conn() *relayconn.Conn { return s.conn }

// Prepare implements detour.Source (a tunnel needs no per-server request).
func (s *TunnelSource) Prepare(netip.AddrPort) {}

// Detours implements detour.Source.
func (s *TunnelSource) Detours(server netip.AddrPort) []detour.Detour {
	if c := s.Client(); c != nil {
		return c.Detours(server)
	}
	return nil
}

// Close stops the background request and removes the tunnel.
func (s *TunnelSource) Close() error {
	s.cancel()
	<-s.done
	if c := s.Client(); c != nil {
		return c.Close()
	}
	return nil
}

// StartAll is the agent's single call: it removes the tunnels a crashed
// agent left in netns ("" = the agent's own namespace), then starts one
// TunnelSource per relay connection (tunnel index = position in conns). Pass the
// sources to agent.New; close them at exit.
func StartAll(netns string, conns []*relayconn.Conn, member proto.Key, log *slog.Logger) ([]*TunnelSource, error) {
	if err := tunnel.CleanupClients(netns); err != nil {
		return nil, err
	}
	if len(conns) > tunnel.MaxClients {
		return nil, fmt.Errorf("%d relays: at most %d tunnels", len(conns), tunnel.MaxClients)
	}
	out := make([]*TunnelSource, 0, len(conns))
	for i, c := range conns {
		if !AsksTunnel(c) {
			continue
		}
		out = append(out, NewSource(c, tunnel.ClientConfig{Netns: netns, Index: i, PrivateKey: wgtypes.Key(member)}, log))
	}
	return out, nil
}

// AsksTunnel says whether a tunnel is asked over c: not over the second
// session of a relay configured with one address per family (the relay
// gives a member one tunnel; the first session's carries both families
// inside when the relay has tunnel.subnet6, or tunnel.vxlan.subnet6).
func AsksTunnel(c *relayconn.Conn) bool { return !c.Relay().NoTunnel }
