// Package relayclient is the NAT-grant detour kind on the client: NATSource
// asks a set of relays for NAT detours over their control sessions
// (internal/relayconn) and hands them to the agent (it implements
// detour.Source and detour.Releaser); roster.go adds relays discovered
// from the collective's roster; file.go is the agent file's `relays:`
// section (File, the YAML form, validated into SourceConfig).
package relayclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// SourceConfig configures a NATSource.
type SourceConfig struct {
	PrivateKey proto.Key // the member key (also its WireGuard key for tunnels)
	Relays     []relayconn.Relay
	Options    relayconn.Options
	// RequestTimeout bounds one grant or renew (default 5 s).
	RequestTimeout time.Duration
	// RetryAfter is how long a refused or failed grant is not asked again
	// (default 10 s), so a busy agent does not hammer a relay that said no.
	RetryAfter time.Duration
	// Discovery: also use relays of the collective's roster (nil: only
	// Relays; roster.go).
	Discovery *Discovery
	// Observe, when set, is told the outcome of every grant and renewal
	// (the agent's per-relay state: agentd.RelayHealth). It must not block.
	Observe func(relay, op string, server netip.AddrPort, err error)
}

// NATSource asks relays for NAT detours: Prepare starts a grant in the
// background, Detours returns the ones ready, leases are renewed at half
// their length until Release. Grants are cached per (relay, server
// address and port), so every connection to the same server shares them.
type NATSource struct {
	cfg    SourceConfig
	log    *slog.Logger
	static []*relayconn.Conn // the configured relays (conns[:len(static)])

	mu sync.Mutex
	// conns: the configured relays, then discovered ones (roster.go); a
	// dropped discovered relay leaves nil, so indices stay stable.
	conns   []*relayconn.Conn
	entries map[entryKey]*entry
	// releasing: a release of that key's grant is in flight; the channel
	// closes when it is done. A new grant for the key waits for it: the
	// relay hands one mapping per member and server, so a grant answered
	// first would return the mapping the release then removes.
	releasing map[entryKey]chan struct{}
	found     map[proto.Key]*discovered
	// rosterFrom: the configured relay the roster was last read from
	// (at start one chosen at random, so that the agents' reads spread
	// over the configured relays: docs/collective.md, serving);
	// rosterDigest and rosterLast: the digest of what it sent (0: none)
	// and its verified entries; rosterNoDigest: configured relays that
	// refused a digest (older relays). Used by the discover goroutine
	// only. rosterReads: reads that got the roster, reads answered
	// "unchanged" (RosterReads).
	rosterFrom     int
	rosterDigest   uint64
	rosterLast     []*roster.Entry
	rosterNoDigest map[int]bool
	rosterReads    [2]atomic.Uint64
	refused        atomic.Uint64
	// changed: a grant arrived or a discovered relay was dropped
	// (detour.Notifier).
	changed chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type entryKey struct {
	relay  int
	server netip.AddrPort
}

type entry struct {
	pending  bool
	detour   netip.AddrPort
	expires  time.Time
	renewAt  time.Time
	failedAt time.Time
	err      error
	// refusedAt: when a refused subflow last made this grant be asked
	// again (Refused); one such re-grant per RegrantGap.
	refusedAt time.Time
}

// RegrantGap bounds the re-grants Refused starts: at most one per grant in
// this time, however many subflows are refused (no storm toward a relay
// whose server refuses, or while a new grant is in flight).
const RegrantGap = 2 * time.Second

var (
	_ detour.Source   = (*NATSource)(nil)
	_ detour.Releaser = (*NATSource)(nil)
	_ detour.Notifier = (*NATSource)(nil)
	_ detour.Refuser  = (*NATSource)(nil)
)

// NewSource dials every relay (handshakes start at once, in the background).
func NewSource(cfg SourceConfig) (*NATSource, error) {
	if cfg.PrivateKey.IsZero() {
		return nil, errors.New("relay source: private key is required")
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 10 * time.Second
	}
	s := &NATSource{cfg: cfg, log: cfg.Options.Logger, entries: map[entryKey]*entry{}, releasing: map[entryKey]chan struct{}{}, found: map[proto.Key]*discovered{}, rosterNoDigest: map[int]bool{},
		changed: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, r := range cfg.Relays {
		c, err := relayconn.Dial(r, cfg.PrivateKey, cfg.Options)
		if err != nil {
			s.closeConns()
			return nil, err
		}
		s.conns = append(s.conns, c)
	}
	s.static = slices.Clone(s.conns)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.renewer()
	if d := cfg.Discovery; d != nil {
		if d.Trust == nil {
			s.closeConns()
			return nil, errors.New("relay source: discovery needs the collective's authority")
		}
		if d.Max <= 0 {
			d.Max = 4
		}
		if d.Every <= 0 {
			d.Every = DefaultDiscoveryEvery
		}
		if d.Fetch <= 0 {
			d.Fetch = 256
		}
		s.wg.Add(1)
		go s.discover()
	}
	return s, nil
}

func (s *NATSource) closeConns() {
	s.mu.Lock()
	conns := slices.Clone(s.conns)
	s.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			_ = c.Close()
		}
	}
}

// Conns returns the configured relays' connections (e.g. for tunnel
// requests); discovered relays are not among them.
func (s *NATSource) Conns() []*relayconn.Conn { return s.static }

// Prepare implements detour.Source: it never blocks. Discovered relays'
// sessions of server's family open now if they are not open yet
// (roster.go: openFor).
func (s *NATSource) Prepare(server netip.AddrPort) {
	s.openFor(server)
	now := time.Now()
	s.eachRelay(server, func(k entryKey, _ *relayconn.Conn) {
		e := s.entries[k]
		if e != nil && (e.pending || e.detour.IsValid() || now.Sub(e.failedAt) < s.cfg.RetryAfter) {
			return
		}
		e = &entry{pending: true}
		s.entries[k] = e
		s.wg.Add(1)
		go s.grant(k, e, s.conns[k.relay])
	})
}

// eachRelay calls fn, with s.mu held, for every relay (configured and
// discovered) whose session can grant toward server, with its entry key;
// nothing once the source is closing.
func (s *NATSource) eachRelay(server netip.AddrPort, fn func(k entryKey, c *relayconn.Conn)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	for i, c := range s.conns {
		if c != nil && grantsToward(c, server) {
			fn(entryKey{i, server}, c)
		}
	}
}

// grantsToward says whether c's session can grant toward server: a relay
// grants only within its control session's family (docs/relay.md, IPv6),
// so a session of the other family is not asked at all (it would answer
// policy-denied, which status and the log would show as the relay
// refusing the destination, for every server of that family).
func grantsToward(c *relayconn.Conn, server netip.AddrPort) bool {
	return c.Relay().Addr.Addr().Unmap().Is4() == server.Addr().Unmap().Is4()
}

// grant asks session c (s.conns[k.relay] when it was started: a closed
// discovered session's slot may hold another session by the time it runs,
// roster.go's openLocked) for entry e's detour.
func (s *NATSource) grant(k entryKey, e *entry, c *relayconn.Conn) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	live := c != nil && s.conns[k.relay] == c
	inFlight := s.releasing[k]
	s.mu.Unlock()
	if !live {
		return // dropped meanwhile (roster)
	}
	if inFlight != nil {
		select {
		case <-inFlight:
		case <-ctx.Done():
		}
	}
	d, lease, err := c.Grant(ctx, k.server, 0)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entries[k] != e { // released meanwhile
		if err == nil {
			s.giveBackLocked(k, c, d)
		}
		return
	}
	e.pending = false
	s.observe(c, "grant", k.server, err)
	if err != nil {
		e.failedAt, e.err = now, err
		s.log.Info("relay grant failed", "relay", c.Relay().Name, "server", k.server, "err", err)
		if s.ctx.Err() == nil && c.SessionKey().IsZero() {
			s.handshakeFailedLocked(k.relay) // a discovered session never hand shook: closed, backed off
		}
		return
	}
	e.detour, e.expires, e.renewAt = d, now.Add(lease), now.Add(lease/2)
	s.grantedLocked(k.relay)
	s.log.Debug("relay grant", "relay", c.Relay().Name, "server", k.server, "detour", d, "lease", lease)
	s.notify()
}

// observe reports an outcome to SourceConfig.Observe (a cancelled request
// of a closing NATSource is no outcome).
func (s *NATSource) observe(c *relayconn.Conn, op string, server netip.AddrPort, err error) {
	if s.cfg.Observe != nil && s.ctx.Err() == nil {
		s.cfg.Observe(c.Relay().Name, op, server, err)
	}
}

// Changed implements detour.Notifier: a value arrives after a grant came
// in or a discovered relay was dropped (one per burst).
func (s *NATSource) Changed() <-chan struct{} { return s.changed }

func (s *NATSource) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *NATSource) release(c *relayconn.Conn, port uint16) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
	defer cancel()
	if err := c.Release(ctx, port); err != nil && proto.ReasonOf(err) != proto.ReasonNotFound {
		s.log.Debug("relay release", "relay", c.Relay().Name, "port", port, "err", err)
	}
}

// Detours implements detour.Source: grants ready now for server.
func (s *NATSource) Detours(server netip.AddrPort) []detour.Detour {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []detour.Detour
	for i, c := range s.conns {
		e := s.entries[entryKey{i, server}]
		if c == nil || e == nil || !e.detour.IsValid() || !e.expires.After(now) {
			continue
		}
		out = append(out, detour.Detour{Kind: detour.NAT, Relay: c.Relay().Name, Remote: e.detour, Expires: e.expires, Backup: c.Relay().Backup})
	}
	return out
}

// Err returns why the last grant toward server from relay i failed, if so.
func (s *NATSource) Err(relay int, server netip.AddrPort) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[entryKey{relay, server}]; e != nil {
		return e.err
	}
	return nil
}

// Release implements detour.Releaser: the grants toward server are given
// back to every relay.
func (s *NATSource) Release(ctx context.Context, server netip.AddrPort) error {
	type rel struct {
		c    *relayconn.Conn
		port uint16
	}
	var todo []rel
	var done []func()
	s.mu.Lock()
	for i, c := range s.conns {
		k := entryKey{i, server}
		if e := s.entries[k]; e != nil && c != nil {
			delete(s.entries, k)
			if e.detour.IsValid() {
				todo = append(todo, rel{c, e.detour.Port()})
				ch := s.markReleasing(k)
				done = append(done, func() { s.releaseDone(k, ch) })
			}
		}
	}
	s.mu.Unlock()
	var errs []error
	for i, r := range todo {
		if err := r.c.Release(ctx, r.port); err != nil && proto.ReasonOf(err) != proto.ReasonNotFound {
			errs = append(errs, err)
		}
		done[i]()
	}
	return errors.Join(errs...)
}

// markReleasing records a release of k's grant in flight (s.mu held).
func (s *NATSource) markReleasing(k entryKey) chan struct{} {
	ch := make(chan struct{})
	s.releasing[k] = ch
	return ch
}

// releaseDone ends what markReleasing recorded.
func (s *NATSource) releaseDone(k entryKey, ch chan struct{}) {
	s.mu.Lock()
	if s.releasing[k] == ch {
		delete(s.releasing, k)
	}
	s.mu.Unlock()
	close(ch)
}

// Refused implements detour.Refuser: a subflow through d toward server was
// refused. A relay restarted without its state file has closed the granted
// port (its new table does not have the mapping), so the grant is renewed
// at once instead of at half its lease: the relay answers not-found and
// hands a new mapping (renew), and the agent hears of it (Changed). At
// most one per grant per RegrantGap; a refusal of another port than the
// grant's current one (an old subflow) starts nothing.
func (s *NATSource) Refused(server netip.AddrPort, d detour.Detour) {
	if d.Kind != detour.NAT {
		return
	}
	now := time.Now()
	s.eachRelay(server, func(k entryKey, c *relayconn.Conn) {
		e := s.entries[k]
		if c.Relay().Name != d.Relay || e == nil || e.pending || e.detour != d.Remote || now.Sub(e.refusedAt) < RegrantGap {
			return
		}
		e.refusedAt, e.pending = now, true
		s.log.Info("relay detour refused: asking for a new grant", "relay", c.Relay().Name, "server", server, "detour", d.Remote)
		s.wg.Add(1)
		go s.renew(k, e, c)
	})
}

// renewer renews leases at half their length; a relay that lost the mapping
// (restart) gets a fresh grant, and the detour changes port.
func (s *NATSource) renewer() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		for k, e := range s.entries {
			if e.pending || !e.detour.IsValid() || now.Before(e.renewAt) {
				continue
			}
			e.pending = true
			s.wg.Add(1)
			go s.renew(k, e, s.conns[k.relay])
		}
		s.mu.Unlock()
	}
}

// giveBackLocked releases mapping d, granted over session c for entry key
// k whose entry was released meanwhile, unless a newer entry of the same
// session waits for a grant: the relay answers that one with this same
// mapping. When the slot holds another session now (c was closed, its
// slot reused: slotLocked), its entry is another relay's, and the release
// is c's own, not recorded under the slot (a grant of the new session
// would wait for it).
func (s *NATSource) giveBackLocked(k entryKey, c *relayconn.Conn, d netip.AddrPort) {
	same := s.conns[k.relay] == c
	if s.entries[k] != nil && same {
		return
	}
	var done chan struct{}
	if same {
		done = s.markReleasing(k)
	}
	s.wg.Add(1)
	go func() {
		s.release(c, d.Port())
		if done != nil {
			s.releaseDone(k, done)
		}
	}()
}

// renew renews entry e's lease over session c (as grant).
func (s *NATSource) renew(k entryKey, e *entry, c *relayconn.Conn) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	live := c != nil && s.conns[k.relay] == c
	port := e.detour.Port()
	s.mu.Unlock()
	if !live {
		s.mu.Lock()
		e.pending = false
		s.mu.Unlock()
		return // dropped meanwhile (roster)
	}
	lease, err := c.Renew(ctx, port)
	if proto.ReasonOf(err) == proto.ReasonNotFound {
		var d netip.AddrPort
		d, lease, err = c.Grant(ctx, k.server, port)
		if err == nil {
			s.mu.Lock()
			if s.entries[k] != e {
				// Released (or its relay dropped) while the new grant
				// was asked for: nobody would ever release it.
				s.giveBackLocked(k, c, d)
				s.mu.Unlock()
				return
			}
			e.detour = d
			s.mu.Unlock()
			s.notify() // the detour moved: subflows through the old port are dead
		}
	}
	s.observe(c, "renew", k.server, err)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e.pending = false
	if err != nil {
		// Try again soon; the detour stays until its lease runs out.
		e.renewAt = now.Add(time.Second)
		if !e.expires.After(now) && s.entries[k] == e {
			delete(s.entries, k)
		}
		s.log.Info("relay renew failed", "relay", c.Relay().Name, "server", k.server, "err", err)
		return
	}
	e.expires, e.renewAt = now.Add(lease), now.Add(lease/2)
}

// Key is the member key in use (the newest after a Rotate).
func (s *NATSource) Key() proto.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.PrivateKey
}

// SetCertificate replaces the certificate of the key in use (a renewed
// certificate for the same key): new sessions present it.
func (s *NATSource) SetCertificate(cert []byte) {
	s.mu.Lock()
	s.cfg.Options.Certificate = cert
	conns := slices.Clone(s.conns)
	priv := s.cfg.PrivateKey
	s.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			_ = c.Rotate(context.Background(), priv, cert) // same key: only the certificate changes
		}
	}
}

// Rotate switches every relay connection, configured and discovered, to
// the member key priv and its certificate (binary form, nil: none), each
// asking its relay to carry the old key's detours over (Conn.Rotate):
// grants keep their detour ports and renew on the new key's sessions.
// Relays discovered later are dialled with the new key. then, if not nil,
// is called for each connection once its relay answered (nil: carried
// over; else the refusal), also after Rotate returned: the tunnel of that
// relay switches keys then. Rotate waits until every relay answered or ctx
// ends and returns the refusals and the relays that have not answered yet
// (those keep trying), joined.
func (s *NATSource) Rotate(ctx context.Context, priv proto.Key, cert []byte, then func(*relayconn.Conn, error)) error {
	s.mu.Lock()
	s.cfg.PrivateKey, s.cfg.Options.Certificate = priv, cert
	var conns []*relayconn.Conn
	for _, c := range s.conns {
		if c != nil {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	type result struct {
		c   *relayconn.Conn
		err error
	}
	res := make(chan result, len(conns))
	for _, c := range conns {
		go func() {
			err := c.Rotate(s.ctx, priv, cert)
			if then != nil && !errors.Is(err, net.ErrClosed) && s.ctx.Err() == nil {
				then(c, err)
			}
			res <- result{c, err}
		}()
	}
	var errs []error
	answered := map[*relayconn.Conn]bool{}
	for range conns {
		select {
		case r := <-res:
			answered[r.c] = true
			errs = append(errs, r.err)
		case <-ctx.Done():
			for _, c := range conns {
				if !answered[c] {
					errs = append(errs, fmt.Errorf("relay %q: key rotation: no answer yet, still trying: %w", c.Relay().Name, ctx.Err()))
				}
			}
			return errors.Join(errs...)
		}
	}
	return errors.Join(errs...)
}

// Close releases every grant (best effort, bounded) and stops.
func (s *NATSource) Close() error {
	s.mu.Lock()
	var servers []netip.AddrPort
	seen := map[netip.AddrPort]bool{}
	for k := range s.entries {
		if !seen[k.server] {
			seen[k.server] = true
			servers = append(servers, k.server)
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = s.Release(ctx, srv)
	}
	s.cancel()
	s.closeConns()
	s.wg.Wait()
	return nil
}

// String describes the source for logs.
func (s *NATSource) String() string { return fmt.Sprintf("relays(%d)", len(s.static)) }
