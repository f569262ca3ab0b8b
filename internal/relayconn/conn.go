// Package relayconn is the client's session of the relay control
// protocol (internal/proto): Conn talks to one relay (the Noise handshake,
// retransmission, re-handshakes, member key rotation) and has one method
// per control operation (Grant, Renew, Release, Tunnel, Encap, Convert,
// Quota, Ping, Roster, PresentReceipt). The detour kinds build on it:
// relayclient (NAT grants), tunnelctl (WireGuard and VXLAN tunnels),
// convclient (converter tickets).
package relayconn

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Relay names a relay and how to reach and authenticate it.
type Relay struct {
	Name string
	// Entry is the configuration entry's name: Name, or for an entry with
	// one address per family (relayclient.FileRelay.Addresses) the name
	// both sessions share (Name is then Entry/v4 or Entry/v6).
	Entry string
	// NoTunnel: tunnels are not asked over this session (the second
	// address of such an entry: the relay gives a member one tunnel).
	NoTunnel  bool
	Addr      netip.AddrPort // control address (UDP)
	PublicKey proto.Key
	// Backup: detours granted by this relay are backups (subflows with
	// MPTCP's B flag, used only when no other subflow can send).
	Backup bool
}

// Options tune a Conn; the zero value is usable.
type Options struct {
	// ListenPacket creates the UDP socket (tests create it inside a network
	// namespace). Default: an unbound udp4 socket.
	ListenPacket func() (net.PacketConn, error)
	Logger       *slog.Logger
	// Retransmit is the first retransmission interval (default 250 ms,
	// doubled up to 2 s).
	Retransmit time.Duration
	// RekeyAfter is how often the session is renewed by a fresh handshake
	// (default proto.RekeyAfter; must stay below proto.SessionLifetime).
	RekeyAfter time.Duration
	// Certificate, when set, is the member's collective certificate
	// (binary form, collective.Certificate.Bytes): every new session
	// presents it (OpCertify) before it is used, so relays that accept
	// certificates instead of listing the key serve this member.
	Certificate []byte
}

// Conn is a control-protocol association with one relay. It hand shakes in
// the background at Dial and again every proto.RekeyAfter, so a request
// normally costs one round trip. Safe for concurrent use.
type Conn struct {
	relay Relay
	priv  proto.Key
	cert  []byte
	pc    net.PacketConn
	log   *slog.Logger
	rtx   time.Duration
	rekey time.Duration

	mu  sync.Mutex
	ses *proto.Session
	// sesPub: the member key ses was made with; a Rotate makes it stale.
	sesPub proto.Key
	// rotateFrom: the member keys Rotates replaced whose state may still
	// be the relay's, until a session of the newest key has carried it
	// over (OpRotate, one per key: after two Rotates in a row the relay
	// may hold the state under the first key or, when it applied the
	// first rotation but its answer was lost, under the second);
	// rotateDone takes the result.
	rotateFrom []proto.Key
	rotateDone chan error
	// confirmed: the member key the relay holds our state (mappings, the
	// tunnel's WireGuard peer) under: the first session's key, then the
	// new key of each rotation the relay answered ok. A refused or
	// unsupported rotation leaves it (the relay did not move anything).
	confirmed proto.Key
	prev      *proto.Session // replaced by a rekey; replies may still arrive on it
	// certifying are new sessions presenting the certificate (by local
	// index), not yet in use; their replies are accepted like ses's.
	certifying map[uint32]*proto.Session
	// suspect is the session an (unauthenticated) error packet said the
	// relay lost: a new handshake starts, the session stays until it
	// completes (make-before-break), so a forged error cannot cut us off.
	suspect     *proto.Session
	suspectSent time.Time
	sesReady    chan struct{} // closed when ses is set; replaced when dropped
	inits       map[uint32]*pendingInit
	pending     map[uint32]chan proto.Reply
	nextID      uint32
	hsErr       error // last handshake refusal, reported to waiters
	kick        chan struct{}
	// cookie is the relay's proof-of-address cookie for our socket, given
	// when it is under load; initiations carry it (mac2) while it is fresh.
	cookie   proto.Cookie
	cookieAt time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type pendingInit struct {
	in    *proto.Initiation
	priv  proto.Key // the member key it was made with
	relay proto.Key // the relay's public key it was made for
	sent  time.Time
}

// Dial creates the socket and starts the handshake; it does not wait for it.
func Dial(relay Relay, priv proto.Key, opt Options) (*Conn, error) {
	if !relay.Addr.IsValid() || relay.PublicKey.IsZero() {
		return nil, fmt.Errorf("relay %q: address and public key are required", relay.Name)
	}
	listen := opt.ListenPacket
	if listen == nil {
		listen = func() (net.PacketConn, error) { return net.ListenUDP(udpFor(relay.Addr.Addr()), nil) }
	}
	pc, err := listen()
	if err != nil {
		return nil, fmt.Errorf("relay %q: %w", relay.Name, err)
	}
	c := &Conn{
		relay:    relay,
		priv:     priv,
		cert:     opt.Certificate,
		pc:       pc,
		log:      opt.Logger,
		rtx:      opt.Retransmit,
		sesReady: make(chan struct{}),
		inits:    map[uint32]*pendingInit{},
		pending:  map[uint32]chan proto.Reply{},
		kick:     make(chan struct{}, 1),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.rtx <= 0 {
		c.rtx = 250 * time.Millisecond
	}
	c.rekey = opt.RekeyAfter
	if c.rekey <= 0 || c.rekey >= proto.SessionLifetime {
		c.rekey = proto.RekeyAfter
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	c.nextID = binary.BigEndian.Uint32(b[:])
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(2)
	go c.reader()
	go c.handshaker()
	return c, nil
}

// Close stops the Conn. Outstanding requests fail.
func (c *Conn) Close() error {
	c.cancel()
	err := c.pc.Close()
	c.wg.Wait()
	return err
}

// Relay returns the relay this Conn talks to.
func (c *Conn) Relay() Relay {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.relay
}

// SetRelayKey makes pub the relay's public key (the relay rotated its key,
// the agent's configuration says so and the agent reloaded it on SIGHUP):
// the current session is dropped and a handshake with pub follows at once;
// requests wait for it (a relay whose previous_private_key is the old key
// answers both meanwhile). It says whether the key changed.
func (c *Conn) SetRelayKey(pub proto.Key) bool {
	c.mu.Lock()
	if pub.IsZero() || c.relay.PublicKey == pub {
		c.mu.Unlock()
		return false
	}
	c.relay.PublicKey = pub
	clear(c.inits) // initiations to the old key
	if c.ses != nil {
		c.prev, c.ses = c.ses, nil // replies may still arrive on it
		c.sesReady = make(chan struct{})
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return true
}

func randIndex() uint32 {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:])
		if i := binary.BigEndian.Uint32(b[:]); i != 0 {
			return i
		}
	}
}

// handshaker keeps a fresh session: at start, every RekeyAfter, and when the
// relay says it lost ours. Initiations are resent with fresh timestamps
// (a resent copy would be refused as a replay).
func (c *Conn) handshaker() {
	defer c.wg.Done()
	wait := c.rtx
	for {
		c.mu.Lock()
		ses := c.ses
		stale := c.sesPub != c.priv.Public() // a Rotate: the new key hand shakes now
		c.mu.Unlock()
		need := ses == nil || time.Since(ses.Created) > c.rekey || stale
		if !need && c.suspected(ses) {
			// At most one extra handshake per second however many error
			// packets arrive (they are unauthenticated).
			need = true
			c.mu.Lock()
			if time.Since(c.suspectSent) < time.Second {
				need = false
			} else {
				c.suspectSent = time.Now()
			}
			c.mu.Unlock()
		}
		if need {
			if err := c.sendInit(); err != nil {
				c.log.Debug("handshake send", "relay", c.relay.Name, "err", err)
			}
		} else {
			wait = c.rtx
		}
		var timer <-chan time.Time
		if need {
			timer = time.After(wait)
			if wait < 4*time.Second {
				wait *= 2
			}
		} else {
			timer = time.After(time.Until(ses.Created.Add(c.rekey)) + 10*time.Millisecond)
		}
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		case <-timer:
		}
	}
}

func (c *Conn) sendInit() error {
	idx := randIndex()
	c.mu.Lock()
	priv, relayPub := c.priv, c.relay.PublicKey
	c.mu.Unlock()
	in, err := proto.NewInitiation(priv, relayPub, idx, time.Now())
	if err != nil {
		return err
	}
	c.mu.Lock()
	// Keep only recent initiations: a late response to an old one is fine.
	for k, v := range c.inits {
		if time.Since(v.sent) > 10*time.Second {
			delete(c.inits, k)
		}
	}
	c.inits[idx] = &pendingInit{in: in, priv: priv, relay: relayPub, sent: time.Now()}
	pkt := in.Packet
	if !c.cookieAt.IsZero() && time.Since(c.cookieAt) < proto.CookieLifetime-10*time.Second {
		pkt = in.WithCookie(c.cookie)
	}
	c.mu.Unlock()
	_, err = c.pc.WriteTo(pkt, net.UDPAddrFromAddrPort(c.relay.Addr))
	return err
}

// suspected says whether ses is the session an error packet put in doubt.
func (c *Conn) suspected(ses *proto.Session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.suspect != nil && c.suspect == ses
}

func (c *Conn) dropSession(s *proto.Session) {
	c.mu.Lock()
	if c.ses == s && s != nil {
		c.ses = nil
		c.sesReady = make(chan struct{})
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Conn) reader() {
	defer c.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, from, err := c.pc.ReadFrom(buf)
		if err != nil {
			if c.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok || ua.AddrPort().Addr().Unmap() != c.relay.Addr.Addr().Unmap() || ua.AddrPort().Port() != c.relay.Addr.Port() {
			continue
		}
		c.dispatch(buf[:n])
	}
}

func (c *Conn) dispatch(b []byte) {
	typ, err := proto.PacketType(b)
	if err != nil {
		return
	}
	switch typ {
	case proto.TypeResponse:
		r, err := proto.ParseResponse(b)
		if err != nil {
			return
		}
		c.mu.Lock()
		pi := c.inits[r.Receiver]
		delete(c.inits, r.Receiver)
		c.mu.Unlock()
		if pi == nil {
			return
		}
		s, err := pi.in.Finish(r)
		if err != nil {
			c.log.Warn("handshake response rejected", "relay", c.relay.Name, "err", err)
			return
		}
		c.mu.Lock()
		priv, cert, from := c.priv, c.cert, c.rotateFrom
		c.mu.Unlock()
		if pi.priv != priv {
			return // made with a key a Rotate has replaced since
		}
		if cert != nil || len(from) > 0 {
			// The session is used only once the relay accepted the
			// certificate and, after a Rotate, carried the old key's
			// state over (the requests also prove our address).
			c.mu.Lock()
			if c.certifying == nil {
				c.certifying = map[uint32]*proto.Session{}
			}
			c.certifying[s.Local] = s
			c.mu.Unlock()
			go c.prepare(s, priv, cert, from)
			return
		}
		c.install(s, priv.Public())
		// Prove our address at once, so the first real request is not
		// the one that pays for it (and errors show up early).
		go func() {
			ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			defer cancel()
			_ = c.Ping(ctx)
		}()
	case proto.TypeCookieReply:
		// The relay is under load and wants proof that we receive at our
		// address: answer at once with a fresh initiation carrying mac2.
		r, err := proto.ParseCookieReply(b)
		if err != nil {
			return
		}
		c.mu.Lock()
		pi := c.inits[r.Receiver]
		c.mu.Unlock()
		if pi == nil {
			return
		}
		cookie, err := pi.in.OpenCookieReply(pi.relay, r)
		if err != nil {
			return // forged: the initiation stays pending for the real answer
		}
		c.mu.Lock()
		_, still := c.inits[r.Receiver]
		delete(c.inits, r.Receiver) // one retry per initiation, not a loop
		c.cookie, c.cookieAt = cookie, time.Now()
		c.mu.Unlock()
		if !still {
			return // a copy of the reply: already retried
		}
		c.log.Debug("relay under load: retrying the handshake with its cookie", "relay", c.relay.Name)
		if err := c.sendInit(); err != nil {
			c.log.Debug("handshake send", "relay", c.relay.Name, "err", err)
		}
	case proto.TypeError:
		e, err := proto.ParseError(b)
		if err != nil {
			return
		}
		c.mu.Lock()
		_, forInit := c.inits[e.Index]
		ses := c.ses
		if forInit && e.Reason != proto.ReasonRateLimited {
			// Unauthenticated, so only a hint: remembered for callers
			// waiting on the handshake, which keeps being retried.
			c.hsErr = &proto.Error{Reason: e.Reason}
		}
		c.mu.Unlock()
		if forInit {
			c.log.Debug("handshake refused", "relay", c.relay.Name, "reason", e.Reason)
		}
		if ses != nil && e.Index == ses.Remote && (e.Reason == proto.ReasonNoSession || e.Reason == proto.ReasonAddressChanged) {
			// Error packets are not authenticated: hand shake again but
			// keep the session until the new one is up (make-before-break).
			c.log.Debug("relay says it lost our session; handshaking again", "relay", c.relay.Name, "reason", e.Reason)
			c.mu.Lock()
			c.suspect = ses
			c.mu.Unlock()
			select {
			case c.kick <- struct{}{}:
			default:
			}
		}
	case proto.TypeTransport:
		t, err := proto.ParseTransport(b)
		if err != nil {
			return
		}
		c.mu.Lock()
		ses := c.ses
		if prev := c.prev; ses == nil || t.Receiver != ses.Local {
			ses = prev
		}
		if cs := c.certifying[t.Receiver]; cs != nil {
			ses = cs
		}
		c.mu.Unlock()
		if ses == nil || t.Receiver != ses.Local {
			return
		}
		msg, err := ses.Open(t)
		if err != nil {
			return
		}
		rep, err := proto.ParseReply(msg)
		if err != nil {
			c.log.Warn("bad reply from relay", "relay", c.relay.Name, "err", err)
			return
		}
		c.mu.Lock()
		ch := c.pending[rep.ID]
		delete(c.pending, rep.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- rep
		}
	}
}

// session waits for a usable session.
func (c *Conn) session(ctx context.Context) (*proto.Session, error) {
	for {
		c.mu.Lock()
		s, ready := c.ses, c.sesReady
		c.mu.Unlock()
		if s != nil {
			return s, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			c.mu.Lock()
			hsErr := c.hsErr
			c.mu.Unlock()
			if hsErr != nil {
				return nil, fmt.Errorf("relay %q: no session: %w", c.relay.Name, hsErr)
			}
			return nil, fmt.Errorf("relay %q: no handshake response: %w", c.relay.Name, ctx.Err())
		case <-c.ctx.Done():
			return nil, net.ErrClosed
		}
	}
}

// prepare readies a new session before it is used: it presents the
// certificate (cert != nil) and, after a Rotate (from != nil), asks the
// relay to carry the old key's state over to this session's key.
func (c *Conn) prepare(s *proto.Session, priv proto.Key, cert []byte, from []proto.Key) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	on := func(context.Context) (*proto.Session, error) { return s, nil }
	done := func() (newer bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.certifying, s.Local)
		// A newer session of this key is in use, or a Rotate has
		// replaced the key this session was made with.
		return c.ses != nil && c.ses.Created.After(s.Created) && c.sesPub == priv.Public() || c.priv != priv
	}
	if cert != nil {
		// A relay that does not take certificates answers unsupported: the
		// session is used as is (the relay may list our key).
		_, err := callOn[*proto.CertifyReply](ctx, c, &proto.CertifyRequest{Cert: cert}, on)
		if err != nil && proto.ReasonOf(err) != proto.ReasonUnsupported {
			if !done() {
				c.log.Warn("relay did not accept our certificate", "relay", c.relay.Name, "err", err)
				c.mu.Lock()
				c.hsErr = err
				ch := c.rotateDone
				c.mu.Unlock()
				if len(from) > 0 && ch != nil {
					select { // the waiting Rotate learns why (the old key's session stays in use)
					case ch <- fmt.Errorf("relay %q: new certificate refused: %w", c.relay.Name, err):
					default:
					}
				}
			}
			return
		}
	}
	if len(from) > 0 {
		var err error
		carried := false
		for _, f := range from {
			if f == priv {
				continue
			}
			st, ferr := collective.SignRotation(f, priv.Public(), time.Now())
			if ferr != nil {
				err = ferr // not a relay's answer: never worth a retry
				continue
			}
			_, ferr = callOn[*proto.RotateReply](ctx, c, &proto.RotateRequest{Rotate: st}, on)
			if ferr != nil && temporary(ferr) && c.ctx.Err() == nil {
				// No answer, or a refusal that says "later" (rate
				// limited, the relay's own failure): the handshaker
				// tries again with a new session (the old key's session
				// stays in use meanwhile).
				done()
				c.log.Info("key rotation: not done by the relay yet, trying again", "relay", c.relay.Name, "err", ferr)
				return
			}
			// One key's refusal (say, revoked since) does not keep the
			// others' state from moving.
			if ferr == nil {
				carried = true
			} else {
				err = ferr
			}
		}
		if carried {
			err = nil
		}
		c.mu.Lock()
		var ch chan error
		if slices.Equal(c.rotateFrom, from) {
			c.rotateFrom, ch = nil, c.rotateDone
		}
		c.mu.Unlock()
		switch {
		case err == nil:
			c.log.Info("key rotation: the relay carried our detours over to the new key", "relay", c.relay.Name,
				"old_key", from[len(from)-1].Public().ID(), "new_key", priv.Public().ID())
		case proto.ReasonOf(err) == proto.ReasonUnsupported:
			c.log.Warn("key rotation: the relay does not support it; detours of the old key stay until their leases end", "relay", c.relay.Name)
		default:
			c.log.Warn("key rotation refused by the relay; detours of the old key stay until their leases end", "relay", c.relay.Name, "err", err)
		}
		// The new session is in use before the waiting Rotate hears of
		// it: what it does next (a tunnel rekey, a request) goes out on
		// the new key's session.
		if !done() {
			if err == nil {
				c.mu.Lock()
				c.confirmed = priv.Public()
				c.mu.Unlock()
			}
			c.install(s, priv.Public())
		}
		if ch != nil {
			select {
			case ch <- err:
			default:
			}
		}
		return
	}
	if !done() {
		c.install(s, priv.Public())
	}
}

// temporary reports whether a rotation's error is worth trying again: no
// answer (no refusal code) or a refusal that is about now, not about the
// request.
func temporary(err error) bool {
	switch proto.ReasonOf(err) {
	case proto.OK, proto.ReasonRateLimited, proto.ReasonInternal, proto.ReasonNoSession:
		return true
	}
	return false
}

// Rotate switches the Conn to the member key priv (and its certificate,
// binary form; nil: none) without dropping what the relay holds for the
// old key: a session of the new key is made, certified, and asks the relay
// to carry the old key's mappings, tunnel, tickets and credit over
// (OpRotate, with a statement signed by the old key); requests keep using
// the old key's session until then. It returns the relay's answer (nil:
// carried over; a *proto.Error: refused or unsupported, the new key is
// used anyway) or ctx's error while no answer came (the Conn keeps trying).
func (c *Conn) Rotate(ctx context.Context, priv proto.Key, cert []byte) error {
	c.mu.Lock()
	if priv == c.priv {
		c.cert = cert
		c.mu.Unlock()
		return nil
	}
	// A previous Rotate not confirmed yet: the relay's state is under
	// one of its keys or under the key it replaced (a lost answer), so
	// each carries over to priv.
	from := append(slices.Clone(c.rotateFrom), c.priv)
	carry := !c.sesPub.IsZero() // no session yet: nothing to carry over
	c.rotateFrom = nil
	if carry {
		c.rotateFrom = from
	}
	done := make(chan error, 1)
	c.priv, c.cert, c.rotateDone = priv, cert, done
	clear(c.inits) // initiations of the old key
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	if !carry {
		return nil
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("relay %q: key rotation: %w", c.relay.Name, ctx.Err())
	case <-c.ctx.Done():
		return net.ErrClosed
	}
}

// SessionKey is the public member key of the session requests use now
// (zero before the first): after a Rotate, the new key's once the relay
// answered the rotation, the old key's while a refused certificate keeps
// the old session in use.
func (c *Conn) SessionKey() proto.Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sesPub
}

// ConfirmedKey is the public member key the relay holds this member's
// state under: the first session's, then the new key of every rotation
// the relay answered ok. A refused or unsupported rotation leaves it: the
// relay's WireGuard peer of a tunnel still has that key, so a tunnel must
// not rekey before ConfirmedKey is the new key.
func (c *Conn) ConfirmedKey() proto.Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.confirmed
}

// Key is the member key the Conn uses (the newest after a Rotate).
func (c *Conn) Key() proto.Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.priv
}

// install makes s, made with the member key pub, the session requests use.
func (c *Conn) install(s *proto.Session, pub proto.Key) {
	c.mu.Lock()
	old := c.ses
	c.ses, c.prev, c.hsErr, c.sesPub = s, old, nil, pub
	if c.confirmed.IsZero() {
		c.confirmed = pub // the first session: nothing to carry over
	}
	if old == nil {
		close(c.sesReady)
	}
	c.mu.Unlock()
}

// Do sends a request and waits for its reply, retransmitting until ctx
// ends. A refusal returns the reply and a *proto.Error with its reason.
func (c *Conn) Do(ctx context.Context, req proto.Request) (proto.Reply, error) {
	return c.doOn(ctx, req, c.session)
}

// call sends the request body req and returns its reply body: Rep is the
// operation's reply type (the codec makes the reply's body that type).
// Each client method is one call.
func call[Rep proto.ReplyBody](ctx context.Context, c *Conn, req proto.RequestBody) (Rep, error) {
	return callOn[Rep](ctx, c, req, c.session)
}

// callOn is call on the sessions session returns.
func callOn[Rep proto.ReplyBody](ctx context.Context, c *Conn, req proto.RequestBody, session func(context.Context) (*proto.Session, error)) (Rep, error) {
	var zero Rep
	rep, err := c.doOn(ctx, proto.NewRequest(0, req), session)
	if err != nil {
		return zero, err
	}
	r, ok := rep.Body.(Rep)
	if !ok {
		return zero, fmt.Errorf("relay %q: %s reply without its body", c.relay.Name, rep.Op)
	}
	return r, nil
}

// doOn is Do on the sessions session returns.
func (c *Conn) doOn(ctx context.Context, req proto.Request, session func(context.Context) (*proto.Session, error)) (proto.Reply, error) {
	if req.Body != nil {
		req.Op = req.Body.Op()
	}
	c.mu.Lock()
	c.nextID++
	req.ID = c.nextID
	ch := make(chan proto.Reply, 1)
	c.pending[req.ID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
	}()
	msg, err := proto.MarshalRequest(req)
	if err != nil {
		return proto.Reply{}, err
	}
	wait := c.rtx
	for {
		s, err := session(ctx)
		if err != nil {
			return proto.Reply{}, err
		}
		pkt, err := s.Seal(msg)
		if err != nil {
			c.dropSession(s)
			continue
		}
		if _, err := c.pc.WriteTo(pkt, net.UDPAddrFromAddrPort(c.relay.Addr)); err != nil && c.ctx.Err() != nil {
			return proto.Reply{}, err
		}
		t := time.NewTimer(wait)
		select {
		case rep := <-ch:
			t.Stop()
			if rep.Op != req.Op {
				return rep, fmt.Errorf("relay %q answered %s to %s", c.relay.Name, rep.Op, req.Op)
			}
			if rep.Reason != proto.OK {
				return rep, fmt.Errorf("relay %q: %w", c.relay.Name, &proto.Error{Op: req.Op, Reason: rep.Reason})
			}
			return rep, nil
		case <-ctx.Done():
			t.Stop()
			c.mu.Lock()
			hsErr := c.hsErr
			c.mu.Unlock()
			if hsErr != nil {
				// The session was dropped and the relay refuses the new
				// handshake (say, the member was removed): that, not the
				// timeout, is what the caller needs to know.
				return proto.Reply{}, fmt.Errorf("relay %q: %s: no reply (%w), and the relay refuses a new handshake: %w", c.relay.Name, req.Op, ctx.Err(), hsErr)
			}
			return proto.Reply{}, fmt.Errorf("relay %q: %s: %w", c.relay.Name, req.Op, ctx.Err())
		case <-c.ctx.Done():
			t.Stop()
			return proto.Reply{}, net.ErrClosed
		case <-t.C:
			if wait < 2*time.Second {
				wait *= 2
			}
		}
	}
}

// Ping checks that the relay answers on this connection's session.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := call[*proto.PingReply](ctx, c, &proto.PingRequest{})
	return err
}

// Grant asks for a NAT mapping toward server; proposed 0 lets the relay pick.
func (c *Conn) Grant(ctx context.Context, server netip.AddrPort, proposed uint16) (netip.AddrPort, time.Duration, error) {
	r, err := call[*proto.GrantReply](ctx, c, &proto.GrantRequest{Server: server, Port: proposed})
	if err != nil {
		return netip.AddrPort{}, 0, err
	}
	return r.Detour, r.Lease, nil
}

// Quota returns how many NAT mappings this member holds at the relay and
// may hold at once.
func (c *Conn) Quota(ctx context.Context) (used, quota int, err error) {
	r, err := call[*proto.QuotaReply](ctx, c, &proto.QuotaRequest{})
	if err != nil {
		return 0, 0, err
	}
	return int(r.Used), int(r.Quota), nil
}

// Renew extends the lease of a granted port.
func (c *Conn) Renew(ctx context.Context, port uint16) (time.Duration, error) {
	r, err := call[*proto.RenewReply](ctx, c, &proto.RenewRequest{Port: port})
	if err != nil {
		return 0, err
	}
	return r.Lease, nil
}

// Release gives a granted port back.
func (c *Conn) Release(ctx context.Context, port uint16) error {
	_, err := call[*proto.ReleaseReply](ctx, c, &proto.ReleaseRequest{Port: port})
	return err
}

// Tunnel asks for a tunnel address (tunnel detours).
func (c *Conn) Tunnel(ctx context.Context) (proto.TunnelGrant, time.Duration, error) {
	r, err := call[*proto.TunnelReply](ctx, c, &proto.TunnelRequest{})
	if err != nil {
		return proto.TunnelGrant{}, 0, err
	}
	return r.Tunnel, r.Lease, nil
}

// TunnelIPv6 is Tunnel asking for an IPv6 tunnel address as well
// (TunnelGrant.ClientPrefix6; invalid when the relay has no IPv6 tunnel
// subnet). A relay older than the request's flag answers malformed: ask
// with Tunnel then.
func (c *Conn) TunnelIPv6(ctx context.Context) (proto.TunnelGrant, time.Duration, error) {
	r, err := call[*proto.TunnelReply](ctx, c, &proto.TunnelRequest{IPv6: true})
	if err != nil {
		return proto.TunnelGrant{}, 0, err
	}
	return r.Tunnel, r.Lease, nil
}

// Encap asks the relay for an unencrypted VXLAN tunnel (or renews it: the
// lease restarts). The grant names the member address the relay accepts
// encapsulated packets from; see docs/tunnel.md.
func (c *Conn) Encap(ctx context.Context) (proto.EncapGrant, time.Duration, error) {
	r, err := call[*proto.EncapReply](ctx, c, &proto.EncapRequest{Action: proto.EncapOpen})
	if err != nil {
		return proto.EncapGrant{}, 0, err
	}
	return r.Encap, r.Lease, nil
}

// EncapIPv6 is Encap asking for an IPv6 inside as well
// (EncapGrant.ClientPrefix6 and Gateway6; invalid when the relay has no
// vxlan subnet6). A relay older than the request's flag answers
// malformed: ask with Encap then.
func (c *Conn) EncapIPv6(ctx context.Context) (proto.EncapGrant, time.Duration, error) {
	r, err := call[*proto.EncapReply](ctx, c, &proto.EncapRequest{Action: proto.EncapOpen, IPv6: true})
	if err != nil {
		return proto.EncapGrant{}, 0, err
	}
	return r.Encap, r.Lease, nil
}

// EncapRelease tells the relay to remove this member's VXLAN tunnel now.
func (c *Conn) EncapRelease(ctx context.Context) error {
	_, err := call[*proto.EncapReply](ctx, c, &proto.EncapRequest{Action: proto.EncapRelease})
	return err
}

// Convert asks the relay for n (1..proto.MaxTickets) single-use converter
// tickets: the converter's address and the tickets, valid for the lease
// from this connection's address (see internal/convert.Dial). The relay
// may hand out fewer than n (what is left of the member's outstanding
// ticket quota); a relay older than 32-ticket batches refuses n > 8 as
// malformed.
func (c *Conn) Convert(ctx context.Context, n int) (netip.AddrPort, [][proto.TicketLen]byte, time.Duration, error) {
	if n < 1 || n > proto.MaxTickets {
		return netip.AddrPort{}, nil, 0, fmt.Errorf("convert: ask for 1..%d tickets, not %d", proto.MaxTickets, n)
	}
	r, err := call[*proto.ConvertReply](ctx, c, &proto.ConvertRequest{Count: uint8(n)})
	if err != nil {
		return netip.AddrPort{}, nil, 0, err
	}
	return r.Converter, r.Tickets, r.Lease, nil
}
