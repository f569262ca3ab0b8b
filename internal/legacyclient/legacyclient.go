// Package legacyclient is the agent's client for the original prototype's
// detour daemons (protocol v1: the 12-byte unauthenticated UDP format of
// internal/proto/legacy.go), served by relays that opt in with legacy_v1 and
// by the reference implementation's daemons. It is a detour.Source like the
// v2 relay client, so the path manager does not know the difference.
//
// v1 has no authentication and no renewal: anyone on the path can forge a
// response, and a grant lapses after the daemon's lease. This client only
// accepts a response from the address it asked, for the server it asked,
// and asks again once the assumed lease is over. Use it only where the path
// to the daemon is trusted (docs/agent.md).
package legacyclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Relay is one v1 daemon.
type Relay struct {
	Name string
	Addr netip.AddrPort // UDP address of the daemon (port 45672 by default)
	// Lease is this daemon's grant lifetime (0: Config.Lease); daemons
	// may be configured differently.
	Lease time.Duration
}

// Config configures a V1Source.
type Config struct {
	Relays []Relay
	// Lease is how long a grant is assumed to last (v1 does not say) for
	// the daemons without their own Relay.Lease; the detour is
	// re-requested before that. Default 10 min, the relay's
	// legacy_v1.lease default.
	Lease time.Duration
	// Timeout bounds one request (default 2 s, retransmitted every 250 ms).
	Timeout time.Duration
	// RetryAfter is how long a failed request is not repeated (default 10 s).
	RetryAfter time.Duration
	// ListenPacket creates the UDP socket (default: an unbound udp4 socket).
	ListenPacket func() (net.PacketConn, error)
	Logger       *slog.Logger
}

const maxEntries = 4096

type key struct {
	relay  int
	server netip.AddrPort
}

type entry struct {
	detour   detour.Detour
	ok       bool
	inflight bool
	failedAt time.Time
	err      error
}

// V1Source hands out v1 grants as NAT detours.
type V1Source struct {
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	entries map[key]*entry
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New validates cfg and returns a V1Source.
func New(cfg Config) (*V1Source, error) {
	if len(cfg.Relays) == 0 {
		return nil, errors.New("legacy v1: no relays")
	}
	for i, r := range cfg.Relays {
		if !r.Addr.IsValid() || !r.Addr.Addr().Unmap().Is4() || r.Addr.Port() == 0 {
			return nil, fmt.Errorf("legacy v1 relay %d (%s): address %s is not IPv4:port", i, r.Name, r.Addr)
		}
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 10 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 10 * time.Second
	}
	if cfg.ListenPacket == nil {
		cfg.ListenPacket = func() (net.PacketConn, error) { return net.ListenUDP("udp4", nil) }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &V1Source{cfg: cfg, log: log, entries: map[key]*entry{}, ctx: ctx, cancel: cancel}, nil
}

// Prepare asks every daemon for a detour to server unless a fresh grant,
// a request in flight or a recent failure is there. It never blocks.
func (s *V1Source) Prepare(server netip.AddrPort) {
	if !server.Addr().Unmap().Is4() {
		return // v1 carries IPv4 servers only
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	if len(s.entries) >= maxEntries {
		// Bounded memory: forget lapsed grants and old failures.
		for k, e := range s.entries {
			if !e.inflight && (!e.ok || now.After(e.detour.Expires)) {
				delete(s.entries, k)
			}
		}
	}
	for i := range s.cfg.Relays {
		k := key{i, server}
		e := s.entries[k]
		switch {
		case e == nil:
			e = &entry{}
			s.entries[k] = e
		case e.inflight:
			continue
		case e.ok && now.Before(e.detour.Expires):
			continue
		case !e.ok && e.err != nil && now.Sub(e.failedAt) < s.cfg.RetryAfter:
			continue
		}
		e.inflight = true
		s.wg.Add(1)
		go s.request(k, e)
	}
}

func (s *V1Source) request(k key, e *entry) {
	defer s.wg.Done()
	r := s.cfg.Relays[k.relay]
	start := time.Now()
	port, err := s.ask(r, k.server)
	s.mu.Lock()
	defer s.mu.Unlock()
	e.inflight = false
	if err != nil {
		e.ok, e.err, e.failedAt = false, err, time.Now()
		s.log.Info("legacy v1 grant failed", "relay", r.Name, "server", k.server, "err", err)
		return
	}
	// Re-ask before the daemon forgets the mapping: the lease counted from
	// when the request was sent, less a tenth.
	e.ok, e.err = true, nil
	lease := r.Lease
	if lease <= 0 {
		lease = s.cfg.Lease
	}
	e.detour = detour.Detour{Kind: detour.NAT, Relay: r.Name, Remote: netip.AddrPortFrom(r.Addr.Addr().Unmap(), port),
		Expires: start.Add(lease - lease/10)}
	s.log.Debug("legacy v1 grant", "relay", r.Name, "server", k.server, "detour", e.detour.Remote)
}

// ask sends a v1 request and waits for the matching response from the
// daemon's address, retransmitting every 250 ms until Timeout. It proposes
// the server's own port as the detour port, as the original client does:
// the original daemon maps the port proposed (or another when that one is
// taken) and answers a proposal of 0 with 0, keeping a rule for it.
func (s *V1Source) ask(r Relay, server netip.AddrPort) (uint16, error) {
	req, err := proto.MarshalLegacy(proto.LegacyMsg{Server: server, Port: server.Port()})
	if err != nil {
		return 0, err
	}
	pc, err := s.cfg.ListenPacket()
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	stop := context.AfterFunc(s.ctx, func() { pc.Close() })
	defer stop()
	dst := net.UDPAddrFromAddrPort(r.Addr)
	deadline := time.Now().Add(s.cfg.Timeout)
	buf := make([]byte, 64)
	for time.Now().Before(deadline) {
		if _, err := pc.WriteTo(req, dst); err != nil {
			return 0, fmt.Errorf("send to %s: %w", r.Addr, err)
		}
		next := time.Now().Add(250 * time.Millisecond)
		if next.After(deadline) {
			next = deadline
		}
		for {
			if err := pc.SetReadDeadline(next); err != nil {
				return 0, err
			}
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break // retransmit
				}
				return 0, err
			}
			ua, ok := from.(*net.UDPAddr)
			if !ok || ua.AddrPort().Addr().Unmap() != r.Addr.Addr().Unmap() || ua.AddrPort().Port() != r.Addr.Port() {
				s.log.Debug("legacy v1: datagram from another address ignored", "from", from, "relay", r.Name)
				continue
			}
			m, err := proto.ParseLegacy(buf[:n])
			if err != nil || !m.Response || m.Server != server {
				s.log.Debug("legacy v1: unusable response ignored", "relay", r.Name, "err", err)
				continue
			}
			if m.Port == 0 {
				return 0, fmt.Errorf("daemon answered detour port 0 to a proposal of %d: no usable mapping", server.Port())
			}
			return m.Port, nil
		}
	}
	return 0, fmt.Errorf("no response from %s within %s", r.Addr, s.cfg.Timeout)
}

// Detours returns the grants for server that have not lapsed.
func (s *V1Source) Detours(server netip.AddrPort) []detour.Detour {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []detour.Detour
	for i := range s.cfg.Relays {
		if e := s.entries[key{i, server}]; e != nil && e.ok && now.Before(e.detour.Expires) {
			out = append(out, e.detour)
		}
	}
	return out
}

// Err is the last failure asking relay i for server (nil: none).
func (s *V1Source) Err(relay int, server netip.AddrPort) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[key{relay, server}]; e != nil && !e.ok {
		return e.err
	}
	return nil
}

// Close stops requests in flight.
func (s *V1Source) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

func (s *V1Source) String() string { return fmt.Sprintf("legacy-v1(%d)", len(s.cfg.Relays)) }
