package relay

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/mpdetour/mpdetour/internal/destination"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
	"github.com/mpdetour/mpdetour/internal/relay/trust"
)

// Pre-authentication limits per source address: handshakes cost two X25519
// operations each and refusals are answered, so both are bounded.
const (
	addrRate  = 20.0
	addrBurst = 40
	// A global cap on initiations bounds the X25519 work a flood from many
	// (spoofed) addresses can cause: an initiation costs the relay about
	// 0.1-1 ms of CPU (BenchmarkRelayHandshake; the high end on this loaded
	// host), so at most ~0.2 core; 200/s still lets 24,000 members rekey
	// every two minutes.
	initRate  = 200.0
	initBurst = 400
	// A global cap on clear-text refusals (no session, bad packet) bounds
	// what junk from many (spoofed) addresses costs beyond reading it: each
	// refusal is a send (~8 us of the relay's CPU here, most of its time
	// under a 20,000/s junk flood: docs/results/attacks/spoofed-junk) and a
	// packet toward an address that may never have sent anything. Genuine
	// refusals are rare (a member whose session the relay lost, after a
	// restart, which re-handshakes on it); 2,000/s answers all of them
	// outside floods. The cost: during a flood of N junk packets/s a
	// member's request on a lost session is answered with probability
	// about 2,000/N per retransmission (else it waits for its next try or
	// its rekey).
	refuseRate      = 2000.0
	refuseBurst     = 4000
	maxSessionsPer  = 4 // per member: older sessions are dropped
	unconfirmedLife = 10 * time.Second
	sweepEvery      = 500 * time.Millisecond
	closeEvery      = 2 * time.Second
	maxBatch        = 256
	// maxLinger bounds how long a closed mapping's counter is kept for
	// connections still running through conntrack.
	maxLinger = 10 * time.Minute
)

// packet is a datagram handed from a reader to the event loop.
type packet struct {
	data   []byte
	from   netip.AddrPort
	dst    netip.Addr // local address it arrived at (zero if unknown)
	legacy bool
	// proven: an initiation whose mac2 shows its sender received our
	// cookie at this source address while we were under load.
	proven bool
	// id: the relay key an initiation is addressed to (its mac1).
	id *trust.Identity
	at time.Time // when the reader got it
}

type session struct {
	s         *proto.Session
	peer      proto.Key
	name      string
	addr      netip.AddrPort
	local     netip.Addr
	confirmed bool
	created   time.Time
	// pending: a collective relay's session of a key that has not
	// presented a valid certificate yet (only ping and certify allowed).
	pending bool
	ts      proto.Timestamp // of the initiation (recorded when pending ends)
}

// Server is the relay daemon's core: one event loop owns every table, so
// there are no locks on the request path.
type Server struct {
	static  Static      // fixed at New
	set     *Reloadable // the running configuration, replaced by a reload
	log     *slog.Logger
	now     func() time.Time
	io      sockets
	dp      dataplane.DataPlane
	leases  *lease.Table
	pol     *destination.Policy
	ses     sessionTable
	lim     limits
	trust   *trust.State // keys, replay state, certified members, the live trust
	gossip  gossipState
	conv    *converter // nil: no convert role
	tunnels Tunnels    // nil: no tunnel section
	fair    *fairState // ledger, receipts, capacity (fair.go)
	attr    *attrLog
	met     *metrics
	out     outbox
	ev      events
	started time.Time
}

// sockets are the relay's sockets (Deps).
type sockets struct {
	pc     *ipv4.PacketConn
	conn   *net.UDPConn
	pc6    *ipv6.PacketConn // nil: no IPv6 control socket
	conn6  *net.UDPConn
	legacy *net.UDPConn  // nil: no legacy v1
	status *StatusSocket // the namespace lock; answers relay status (nil: none)
}

// sessionTable holds the control sessions by receiver index and by member key.
type sessionTable struct {
	all      map[uint32]*session
	byMember map[proto.Key][]uint32
	// rotated: old member key -> the key its state moved to (rotate.go),
	// while the old key still has sessions.
	rotated map[proto.Key]proto.Key
}

// limits are the request rate limits: per member key, per source address
// (pre-authentication: unproven, and proven by a cookie) and the global
// initiation budget.
type limits struct {
	member map[proto.Key]*bucket
	addr   *addrLimiter
	// proven: initiations whose mac2 proves their source address; spoofed
	// packets cannot use (or drain) these buckets.
	proven *addrLimiter
	inits  bucket
	// refused: the global budget of clear-text refusals (refuseRate).
	refused bucket
	// refusals summarises refused handshakes in the log (bounded lines).
	refusals refusalLog
}

// outbox is what one event-loop batch holds back until flush: mappings
// not yet in the kernel and the replies that announce them, handshake
// responses until their timestamps are saved.
type outbox struct {
	batch     []*lease.Mapping // new mappings not yet in the kernel
	replies   []deferred       // replies held until batch is installed
	responses []rawReply       // handshake responses held until lastTS is saved
}

// events are the event loop's inputs besides its tickers.
type events struct {
	in       chan packet
	reload   chan *Config
	status   chan statusRequest
	convDone chan convertDone
}

// Deps are the parts a relay runs on, opened by its caller
// (internal/relayd for the daemon; tests pass fakes). From a successful
// New on, the Server owns them and Serve closes them; when New fails the
// caller still owns them.
type Deps struct {
	// PacketConn is the control socket (UDP, IPv4), bound to the listen
	// address.
	PacketConn *net.UDPConn
	// PacketConn6 is the IPv6 control socket (UDP, IPv6 only), bound to
	// listen6 (nil: no control over IPv6, and so no IPv6 NAT detours: a
	// grant's client is the session's source address).
	PacketConn6 *net.UDPConn
	// Legacy is the legacy v1 socket (nil: legacy_v1 off).
	Legacy *net.UDPConn
	// Status is the network namespace's relay lock (Lock), which also
	// answers `relay status` (nil: no status socket).
	Status *StatusSocket
	// DataPlane installs mappings (dataplane.NewNFT; dataplane.Fake in
	// tests).
	DataPlane dataplane.DataPlane
	// Tunnels serves tunnel detours (nil: none; NewTunnels).
	Tunnels Tunnels
	// Clock is the relay's clock (nil: time.Now).
	Clock func() time.Time
	// Log is where the relay logs (nil: discard).
	Log *slog.Logger
}

// New builds a relay from its validated configuration and its parts. It
// opens what belongs to its own parts: the replay state and ledger files,
// the attribution log, the converter's listener and the gossip node. The
// caller runs Serve and then nothing else: Serve cleans up.
func New(static Static, set *Reloadable, d Deps) (*Server, error) {
	if d.PacketConn == nil || d.DataPlane == nil {
		return nil, errors.New("relay: a control socket and a data plane are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Clock == nil {
		d.Clock = time.Now
	}
	log := d.Log
	s := &Server{
		static:  static,
		set:     set,
		log:     log,
		now:     d.Clock,
		io:      sockets{conn: d.PacketConn, pc: ipv4.NewPacketConn(d.PacketConn), legacy: d.Legacy, status: d.Status},
		dp:      d.DataPlane,
		tunnels: d.Tunnels,
		leases:  lease.NewTable(),
		ses:     sessionTable{all: map[uint32]*session{}, byMember: map[proto.Key][]uint32{}},
		lim:     limits{member: map[proto.Key]*bucket{}, addr: newAddrLimiter(), proven: newAddrLimiter()},
		trust:   trust.New(set.PrivateKey, set.PreviousKey, set.Trust),
		gossip:  gossipState{done: make(chan rosterRestart, 1), crlKick: make(chan struct{}, 1)},
		ev: events{in: make(chan packet, 4096), reload: make(chan *Config, 1),
			status: make(chan statusRequest), convDone: make(chan convertDone, 1024)},
		met: newMetrics(),
	}
	if err := s.io.pc.SetControlMessage(ipv4.FlagDst, true); err != nil {
		return nil, fmt.Errorf("IP_PKTINFO: %w", err)
	}
	if d.PacketConn6 != nil {
		s.io.conn6, s.io.pc6 = d.PacketConn6, ipv6.NewPacketConn(d.PacketConn6)
		if err := s.io.pc6.SetControlMessage(ipv6.FlagDst, true); err != nil {
			return nil, fmt.Errorf("IPV6_RECVPKTINFO: %w", err)
		}
	}
	if static.StateFile != "" {
		if err := s.trust.OpenReplay(static.StateFile); err != nil {
			return nil, err
		}
	} else {
		log.Warn("no state_file: replay protection of handshakes does not survive a restart (see docs/relay.md)")
	}
	s.applyPolicy(set)
	if err := s.pol.RefreshOwn(); err != nil {
		return nil, err
	}
	var err error
	if s.attr, err = openAttrLog(set.AttributionLog); err != nil {
		return nil, err
	}
	if s.fair, err = newFairState(set, s.met, log, s.now()); err != nil {
		s.attr.Close()
		return nil, err
	}
	if static.StateFile != "" {
		s.adoptHandover(s.now())
	}
	if s.tunnels != nil {
		n, err := s.tunnels.Readmit(func(k proto.Key) bool { _, ok := set.Members[k]; return ok })
		if err != nil {
			log.Warn("tunnel: re-admitting saved peers", "err", err)
		} else if n > 0 {
			log.Info("tunnel: re-admitted the saved peers of current members", "peers", n)
		}
	}
	if s.io.legacy != nil {
		log.Warn("legacy v1 protocol enabled: unauthenticated, spoofable, see docs/relay.md", "listen", s.io.legacy.LocalAddr())
	}
	if static.Convert.Enabled {
		if err := s.startConverter(context.Background()); err != nil {
			s.attr.Close()
			return nil, err
		}
	}
	if err := s.startRoster(s.set); err != nil {
		if s.conv != nil {
			s.conv.ln.Close()
		}
		s.attr.Close()
		return nil, err
	}
	return s, nil
}

// Addr is the control socket's address (useful with port 0).
func (s *Server) Addr() netip.AddrPort { return s.io.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// Addr6 is the IPv6 control socket's address (invalid: none).
func (s *Server) Addr6() netip.AddrPort {
	if s.io.conn6 == nil {
		return netip.AddrPort{}
	}
	return s.io.conn6.LocalAddr().(*net.UDPAddr).AddrPort()
}

func (s *Server) closeAll() {
	if s.io.conn != nil {
		s.io.conn.Close()
	}
	if s.io.conn6 != nil {
		s.io.conn6.Close()
	}
	if s.conv != nil {
		s.conv.ln.Close() // Serve closes it too; closing twice is harmless
	}
	if s.io.legacy != nil {
		s.io.legacy.Close()
	}
	if s.tunnels != nil {
		_ = s.tunnels.Close()
	}
	if s.attr != nil {
		_ = s.attr.Close()
	}
	if s.io.status != nil {
		_ = s.io.status.Close() // last: the table is gone by now
	}
}

func (s *Server) applyPolicy(set *Reloadable) {
	p := &destination.Policy{Allow: set.Allow, Deny: set.Deny, DenyPorts: set.DenyPorts}
	if s.pol != nil {
		p.SetOwn(s.pol.Own())
	}
	s.pol = p
	s.syncConverterPolicy()
}

// Reload hands new settings to the event loop (SIGHUP). Mappings survive;
// mappings and sessions of members no longer listed are revoked.
func (s *Server) Reload(set *Config) {
	select {
	case s.ev.reload <- set:
	default:
		s.log.Warn("reload already pending; ignoring")
	}
}

// Serve runs until ctx ends, then removes every mapping and the table.
func (s *Server) Serve(ctx context.Context) error {
	if s.static.MetricsListen != "" {
		if err := s.met.serve(ctx, s.static.MetricsListen, s.static.MetricsToken, s.log); err != nil {
			s.shutdown()
			return fmt.Errorf("metrics: %w", err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var convWG sync.WaitGroup
	if s.conv != nil {
		convWG.Go(func() {
			if err := s.conv.srv.Serve(rctx, s.conv.ln); err != nil {
				s.log.Error("converter stopped", "err", err)
			}
		})
	}
	go s.readV2(rctx, s.io.reader(false))
	if s.io.pc6 != nil {
		go s.readV2(rctx, s.io.reader(true))
	}
	s.started = s.now()
	if s.io.status != nil {
		go s.serveStatus(rctx)
	}
	if s.io.legacy != nil {
		go s.readLegacy(rctx)
	}
	s.log.Info("relay serving", "listen", s.Addr(), "members", len(s.set.Members),
		"ports", fmt.Sprintf("%d-%d", s.set.PortLo, s.set.PortHi), "lease", s.set.Lease)
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	lastClose := s.now()
	usage := time.NewTicker(s.set.AttributionFlush)
	defer usage.Stop()
	for {
		select {
		case <-ctx.Done():
			// Conversions end first, so that their lines reach the
			// attribution log before shutdown closes it.
			cancel()
			convWG.Wait()
			for drained := false; !drained; {
				select {
				case d := <-s.ev.convDone:
					s.logConversion(d)
				default:
					drained = true
				}
			}
			s.shutdown()
			return nil
		case p := <-s.ev.in:
			s.dispatch(p)
			// Group commit: take what else is queued, then install all new
			// mappings in one nftables transaction before any reply leaves.
		drain:
			for i := 0; i < maxBatch; i++ {
				select {
				case p := <-s.ev.in:
					s.dispatch(p)
				default:
					break drain
				}
			}
			s.flush()
		case set := <-s.ev.reload:
			s.applyReload(set)
		case <-s.gossip.crlKick:
			s.crlFromGossip(s.now())
		case r := <-s.gossip.done:
			s.rosterRestarted(r, false)
		case req := <-s.ev.status:
			req <- s.status()
		case d := <-s.ev.convDone:
			s.logConversion(d)
		case <-usage.C:
			s.logUsage(s.now())
			s.flushLedger(s.now())
		case <-sweep.C:
			now := s.now()
			s.met.sessions.Set(float64(len(s.ses.all)))
			s.expire(now)
			s.lim.refusals.flush(s.log, now)
			if now.Sub(lastClose) >= closeEvery {
				s.checkCollective(now)
				s.tickRoster(now)
				s.ensureTable()
				s.reap(now, false)
				s.prune(now)
				lastClose = now
			}
		}
	}
}

func (s *Server) dispatch(p packet) {
	if p.legacy {
		s.handleLegacy(p)
	} else {
		s.handle(p)
	}
}

// rawReply is a handshake response held until the timestamp it accepted is
// on disk (state_file), so a kill -9 cannot lose it.
type rawReply struct {
	b   []byte
	to  netip.AddrPort
	src netip.Addr
}

// deferred is a reply held until the batch's mappings are installed.
type deferred struct {
	ses    *session // nil for legacy v1
	rep    proto.Reply
	legacy proto.LegacyMsg
	to     netip.AddrPort
	src    netip.Addr
	m      *lease.Mapping // the new mapping the reply announces, if any
	at     time.Time      // when the request arrived
}

// flush installs the batch's new mappings and sends the held replies. If
// the kernel refuses the transaction, none of its mappings exist and every
// grant in it is answered "internal".
func (s *Server) flush() {
	s.install()
	s.sendReplies()
}

// install saves the replay state and sends the handshake responses it
// held, then installs the batch in the data plane, turning the held
// replies of a refused batch's grants into "internal".
func (s *Server) install() {
	if len(s.out.responses) > 0 {
		if err := s.trust.SaveReplay(); err != nil {
			// Answer anyway: refusing every handshake would be worse than
			// a replay window that does not survive this restart.
			s.log.Error("saving replay state", "err", err)
		}
		for _, r := range s.out.responses {
			s.send(r.b, r.to, r.src)
		}
		clear(s.out.responses)
		s.out.responses = s.out.responses[:0]
	}
	if len(s.out.batch) > 0 {
		ms := make([]dataplane.Mapping, len(s.out.batch))
		for i, m := range s.out.batch {
			ms[i] = m.DP()
		}
		now := s.now()
		err := s.dp.Map(ms)
		if err != nil && s.ensureTable() {
			err = s.dp.Map(ms) // the table was gone: once more on the new one
		}
		if err != nil {
			s.log.Error("installing mappings", "n", len(ms), "err", err)
			failed := map[*lease.Mapping]bool{}
			for _, m := range s.out.batch {
				s.leases.Drop(m)
				failed[m] = true
			}
			for i := range s.out.replies {
				if d := &s.out.replies[i]; d.m != nil && failed[d.m] {
					d.rep = proto.Reply{Op: d.rep.Op, ID: d.rep.ID, Reason: proto.ReasonInternal}
					d.legacy.Port = 0
					s.count(d.rep.Op.String(), proto.ReasonInternal)
				}
			}
		} else {
			for _, m := range s.out.batch {
				s.logAttr(mappingEvent("grant", m, now))
			}
		}
		s.met.active.Set(float64(s.leases.Active()))
		s.out.batch = s.out.batch[:0]
	}
}

// sendReplies sends the held replies (after install).
func (s *Server) sendReplies() {
	for _, d := range s.out.replies {
		if d.ses == nil {
			b, err := proto.MarshalLegacy(d.legacy)
			if err == nil {
				if _, err := s.io.legacy.WriteToUDPAddrPort(b, d.to); err != nil {
					s.log.Debug("legacy send", "err", err)
				} else if !d.at.IsZero() {
					s.met.grantTime.Observe(time.Since(d.at).Seconds())
				}
			}
			continue
		}
		b, err := proto.MarshalReply(d.rep)
		if err != nil {
			s.log.Error("marshal reply", "err", err)
			continue
		}
		out, err := d.ses.s.Seal(b)
		if err != nil {
			continue
		}
		s.send(out, d.to, d.src)
		if d.rep.Op == proto.OpGrant && !d.at.IsZero() {
			s.met.grantTime.Observe(time.Since(d.at).Seconds())
		}
	}
	clear(s.out.replies)
	s.out.replies = s.out.replies[:0]
}

// Load detection for initiations (read by readV2 only): the relay is under
// load while more than loadInits initiations arrived in the last second or
// its queue is an eighth full, and for a second after.
const (
	loadInits  = initRate / 2
	loadLinger = time.Second
)

// screenInit runs on the reader for every initiation, before it is queued:
// it drops those whose mac1 shows the sender does not know our public key,
// and under load answers those without a valid mac2 with a cookie instead of
// queuing them, so a spoofed flood costs one MAC and one small reply per
// datagram and never reaches the handshake budget. It returns false when
// the packet must not be queued.
func (s *Server) screenInit(p *packet, ld *loadState) bool {
	now := time.Now()
	id := s.trust.Keys().Match(p.data)
	if id == nil {
		s.count("handshake", proto.ReasonUnauthorized)
		return false
	}
	p.id = id
	if now.Sub(ld.windowStart) >= time.Second {
		ld.windowStart, ld.n = now, 0
	}
	ld.n++
	if ld.n > loadInits || len(s.ev.in) > cap(s.ev.in)/8 {
		ld.until = now.Add(loadLinger)
	}
	if now.After(ld.until) {
		return true
	}
	if id.Jar.CheckMAC2(p.data, p.from, now) {
		p.proven = true
		return true
	}
	reply, err := id.Jar.Reply(p.data, p.from, now)
	if err != nil {
		return false
	}
	s.met.cookies.Inc()
	s.send(reply, p.from, p.dst)
	return false
}

// loadState is the reader's view of initiation load.
type loadState struct {
	windowStart time.Time
	n           int
	until       time.Time
}

// readBatch is how many control datagrams the reader takes from its socket
// in one system call (recvmmsg): under a flood of small datagrams the
// per-datagram system call was the reader's main cost.
const readBatch = 64

// batchReader reads control datagrams in batches from one control socket
// (sockets.reader).
type batchReader struct {
	// read fills ms (buffers, OOB) with up to len(ms) datagrams, waiting for
	// at least one (ipv4/ipv6 PacketConn.ReadBatch).
	read func(ms []ipv4.Message) (int, error)
	// dst parses a datagram's control message: the local address it
	// arrived at.
	dst func(oob []byte) (net.IP, error)
	// oob is the size of the control message buffer.
	oob int
}

// reader returns the batchReader of the IPv4 (v6 false) or IPv6 control
// socket. (ipv4.Message and ipv6.Message are the same type.)
func (io *sockets) reader(v6 bool) batchReader {
	if v6 {
		return batchReader{
			read: func(ms []ipv4.Message) (int, error) { return io.pc6.ReadBatch(ms, 0) },
			dst:  func(b []byte) (net.IP, error) { var cm ipv6.ControlMessage; err := cm.Parse(b); return cm.Dst, err },
			oob:  len(ipv6.NewControlMessage(ipv6.FlagDst)),
		}
	}
	return batchReader{
		read: func(ms []ipv4.Message) (int, error) { return io.pc.ReadBatch(ms, 0) },
		dst:  func(b []byte) (net.IP, error) { var cm ipv4.ControlMessage; err := cm.Parse(b); return cm.Dst, err },
		oob:  len(ipv4.NewControlMessage(ipv4.FlagDst)),
	}
}

// readV2 reads control datagrams from one control socket, readBatch at a
// time into buffers it reuses, and queues each (copied to its own size)
// for the event loop.
func (s *Server) readV2(ctx context.Context, r batchReader) {
	var ld loadState
	ms := make([]ipv4.Message, readBatch)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 2048)}
		ms[i].OOB = make([]byte, r.oob)
	}
	for {
		n, err := r.read(ms)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("control socket read", "err", err)
			continue
		}
		at := time.Now()
		for i := range ms[:n] {
			m := &ms[i]
			ua, ok := m.Addr.(*net.UDPAddr)
			if !ok {
				continue
			}
			data := make([]byte, m.N)
			copy(data, m.Buffers[0][:m.N])
			p := packet{data: data, from: ua.AddrPort(), at: at}
			if ip, err := r.dst(m.OOB[:m.NN]); err == nil {
				a, _ := netip.AddrFromSlice(ip) // invalid (unknown) without one
				p.dst = a.Unmap()
			}
			p.from = netip.AddrPortFrom(p.from.Addr().Unmap(), p.from.Port())
			// Another version's initiation goes on to handle, which answers
			// bad-version (mac1 would only say "wrong length").
			if len(data) > 1 && data[0] == proto.TypeInit && data[1] == proto.Version && !s.screenInit(&p, &ld) {
				continue
			}
			select {
			case s.ev.in <- p:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (s *Server) readLegacy(ctx context.Context) {
	for {
		buf := make([]byte, 64)
		n, from, err := s.io.legacy.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p := packet{data: buf[:n], from: netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), legacy: true, at: time.Now()}
		select {
		case s.ev.in <- p:
		case <-ctx.Done():
			return
		}
	}
}

// send sends b to to from the control socket of to's family, with source
// address src when that socket listens on the wildcard address.
func (s *Server) send(b []byte, to netip.AddrPort, src netip.Addr) {
	if to.Addr().Is4() {
		sendFrom(s.io.pc, s.static.Listen, b, to, src, s.log)
		return
	}
	if s.io.pc6 == nil {
		return // unreachable: IPv6 peers come only through the IPv6 socket
	}
	var cm *ipv6.ControlMessage
	if l := s.static.Listen6.Addr(); src.IsValid() && (!l.IsValid() || l.IsUnspecified()) {
		cm = &ipv6.ControlMessage{Src: src.AsSlice()}
	}
	if _, err := s.io.pc6.WriteTo(b, cm, net.UDPAddrFromAddrPort(to)); err != nil {
		s.log.Debug("send", "to", to, "err", err)
	}
}

// sendFrom sends b to to; when the relay listens on the wildcard address
// it answers from src, the address the request arrived at.
func sendFrom(pc *ipv4.PacketConn, listen netip.AddrPort, b []byte, to netip.AddrPort, src netip.Addr, log *slog.Logger) {
	var cm *ipv4.ControlMessage
	if src.IsValid() && (!listen.Addr().IsValid() || listen.Addr().IsUnspecified()) {
		cm = &ipv4.ControlMessage{Src: src.AsSlice()}
	}
	if _, err := pc.WriteTo(b, cm, net.UDPAddrFromAddrPort(to)); err != nil {
		log.Debug("send", "to", to, "err", err)
	}
}

func (s *Server) count(op string, r proto.Reason) {
	s.met.requests.WithLabelValues(metricLabels(op, r)).Inc()
}

// metricOps bounds the op label of the requests counter: the protocol's
// operations and the packet-level events; an operation
// read from the wire that is not one of these (or a reason code the relay
// does not know) is counted as "other", so a client cannot create series
// at will.
var metricOps = func() map[string]bool {
	m := map[string]bool{"packet": true, "handshake": true, "transport": true, "legacy": true}
	for _, op := range proto.Ops() {
		m[op.String()] = true
	}
	return m
}()

func metricLabels(op string, r proto.Reason) (string, string) {
	if !metricOps[op] {
		op = "other"
	}
	if !r.Known() { // a code this relay does not know
		return op, "other"
	}
	return op, r.String()
}

// refuse answers a pre-session failure in clear text, smaller than any
// request, at a bounded rate per source address and in total (refuseRate).
func (s *Server) refuse(p packet, r proto.Reason, index uint32, counter uint64) {
	if !s.addrAllowed(p.from.Addr()) || !s.lim.refused.take(s.now(), refuseRate, refuseBurst) {
		return
	}
	s.send(proto.MarshalError(proto.ErrorPacket{Reason: r, Index: index, Counter: counter}), p.from, p.dst)
}

// addrAllowed takes a token of a's (hashed, bounded) per-address budget
// for unauthenticated work: refusals, legacy v1 requests, unproven
// initiations. It creates no state per address.
func (s *Server) addrAllowed(a netip.Addr) bool {
	return s.lim.addr.take(a, s.now(), addrRate, addrBurst)
}

func (s *Server) handle(p packet) {
	typ, err := proto.PacketType(p.data)
	if err != nil {
		s.count("packet", proto.ReasonOf(err))
		if r := proto.ReasonOf(err); r != proto.OK && len(p.data) >= proto.ErrorLen {
			s.refuse(p, r, 0, 0)
		}
		return
	}
	switch typ {
	case proto.TypeInit:
		s.handleInit(p)
	case proto.TypeTransport:
		s.handleTransport(p)
	default:
		// Responses and errors are for clients; never answer them.
	}
}

func (s *Server) handleInit(p packet) {
	in, err := proto.ParseInit(p.data)
	if err != nil {
		s.count("handshake", proto.ReasonOf(err))
		return // too short to answer without amplifying
	}
	// A proven initiation (valid mac2 under load) skips the global budget,
	// which is what a spoofed flood exhausts, and takes its per-address
	// token from the proven buckets, which spoofed packets cannot drain.
	if p.proven && !s.lim.proven.take(p.from.Addr(), s.now(), addrRate, addrBurst) ||
		!p.proven && (!s.addrAllowed(p.from.Addr()) || !s.lim.inits.take(s.now(), initRate, initBurst)) {
		s.count("handshake", proto.ReasonRateLimited)
		s.lim.refusals.note(s.log, s.now(), proto.ReasonRateLimited, p.from, "")
		return
	}
	priv := s.set.PrivateKey
	if p.id != nil {
		// The reader matched the key before the packet was queued; a
		// reload since may have dropped it (a compromised key): queued
		// initiations for it must not complete.
		if s.trust.Keys().Find(p.id.Priv) == nil {
			s.count("handshake", proto.ReasonUnauthorized) // as the reader counts it now
			return
		}
		priv = p.id.Priv
	}
	acc, err := proto.ConsumeInitiation(priv, in)
	if err != nil {
		r := proto.ReasonOf(err)
		s.count("handshake", r)
		s.lim.refusals.note(s.log, s.now(), r, p.from, "")
		s.send(proto.MarshalError(proto.ErrorPacket{Reason: r, Index: in.Sender}), p.from, p.dst)
		return
	}
	name, member := s.set.Members[acc.Peer]
	provisional := false
	if !member {
		if cm, ok := s.trust.Certified[acc.Peer]; ok && s.certifiedOK(acc.Peer, s.now()) {
			name, member = cm.Name, true
		} else if s.trust.Live != nil {
			// A collective relay: any key may hand shake; its session
			// can only present a certificate (OpCertify) or ping until
			// one verifies.
			member, provisional = true, true
		}
	}
	if !member {
		s.count("handshake", proto.ReasonUnauthorized)
		s.lim.refusals.note(s.log, s.now(), proto.ReasonUnauthorized, p.from, "unknown key "+acc.Peer.ID())
		s.send(proto.MarshalError(proto.ErrorPacket{Reason: proto.ReasonUnauthorized, Index: in.Sender}), p.from, p.dst)
		return
	}
	if last, ok := s.trust.LastTS[acc.Peer]; ok && !acc.Timestamp.After(last) {
		s.count("handshake", proto.ReasonReplay)
		s.lim.refusals.note(s.log, s.now(), proto.ReasonReplay, p.from, "member "+name)
		s.send(proto.MarshalError(proto.ErrorPacket{Reason: proto.ReasonReplay, Index: in.Sender}), p.from, p.dst)
		return
	}
	if !provisional {
		// A provisional key (no certificate shown yet) is remembered only
		// once it certifies: anyone can make fresh keys, and the table and
		// the state file must not grow with them. Its sessions can do
		// nothing but certify, which a replay cannot use (no session keys).
		s.trust.NoteTimestamp(acc.Peer, acc.Timestamp)
	}
	idx := s.newIndex()
	resp, ss, err := acc.Respond(idx)
	if err != nil {
		s.count("handshake", proto.ReasonInternal)
		s.log.Error("handshake response", "err", err)
		return
	}
	s.ses.all[idx] = &session{s: ss, peer: acc.Peer, name: name, addr: p.from, local: p.dst, created: s.now(), pending: provisional, ts: acc.Timestamp}
	ids := append(s.ses.byMember[acc.Peer], idx)
	for len(ids) > maxSessionsPer {
		delete(s.ses.all, ids[0])
		ids = ids[1:]
	}
	s.ses.byMember[acc.Peer] = ids
	s.count("handshake", proto.OK)
	s.log.Debug("session established", "member", name, "from", p.from, "index", idx)
	s.out.responses = append(s.out.responses, rawReply{b: resp, to: p.from, src: p.dst})
}

func (s *Server) newIndex() uint32 {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:])
		i := binary.BigEndian.Uint32(b[:])
		if _, taken := s.ses.all[i]; !taken && i != 0 {
			return i
		}
	}
}

func (s *Server) handleTransport(p packet) {
	t, err := proto.ParseTransport(p.data)
	if err != nil {
		s.count("transport", proto.ReasonOf(err))
		return
	}
	ses := s.ses.all[t.Receiver]
	if ses == nil || s.now().Sub(ses.created) > proto.SessionLifetime {
		s.count("transport", proto.ReasonNoSession)
		s.refuse(p, proto.ReasonNoSession, t.Receiver, t.Counter)
		return
	}
	// Checked before decrypting so a copy sent from elsewhere cannot burn
	// the genuine packet's counter.
	if p.from != ses.addr {
		s.count("transport", proto.ReasonAddressChanged)
		s.log.Info("transport packet from another address", "member", ses.name, "session_addr", ses.addr, "from", p.from)
		s.refuse(p, proto.ReasonAddressChanged, t.Receiver, t.Counter)
		return
	}
	msg, err := ses.s.Open(t)
	if err != nil {
		r := proto.ReasonOf(err)
		s.count("transport", r)
		s.refuse(p, r, t.Receiver, t.Counter)
		return
	}
	ses.confirmed = true // only a receiver of our response can get here
	req, err := proto.ParseRequest(msg)
	var rep proto.Reply
	var m *lease.Mapping
	if err != nil {
		rep = proto.Reply{Op: req.Op, ID: req.ID, Reason: proto.ReasonOf(err)}
	} else {
		rep, m = s.serveRequest(ses, req)
	}
	s.count(req.Op.String(), rep.Reason)
	s.out.replies = append(s.out.replies, deferred{ses: ses, rep: rep, to: p.from, src: p.dst, m: m, at: p.at})
}

// serveRequest answers an authenticated request after the member's rate
// limit, through the operation's handler (handlers.go); granted is the
// mapping a grant's reply announces (nil otherwise): if it is still in the
// batch and the kernel refuses the batch, flush turns the reply into
// "internal".
func (s *Server) serveRequest(ses *session, req proto.Request) (rep proto.Reply, granted *lease.Mapping) {
	rep = proto.Reply{Op: req.Op, ID: req.ID}
	b := s.lim.member[ses.peer]
	if b == nil {
		b = &bucket{}
		s.lim.member[ses.peer] = b
	}
	if !b.take(s.now(), s.set.Rate, s.set.Burst) {
		rep.Reason = proto.ReasonRateLimited
		return rep, nil
	}
	h, ok := handlers[req.Op]
	if !ok || req.Body == nil {
		rep.Reason = proto.ReasonUnsupported
		return rep, nil
	}
	if ses.pending && !h.beforeCertificate {
		rep.Reason = proto.ReasonUnauthorized
		return rep, nil
	}
	a := h.serve(s, ses, req.Body)
	rep.Reason = a.reason
	if a.reason == proto.OK {
		rep.Body = a.body
	}
	return rep, a.granted
}

// detourAddr is the address clients connect to for this session: the
// configured one of the session's family (detour_address,
// detour_address6), else the address its requests arrive at.
func (s *Server) detourAddr(ses *session) netip.Addr {
	conf, listen := s.set.DetourAddress, s.static.Listen.Addr()
	if ses.addr.Addr().Is6() {
		conf, listen = s.set.DetourAddress6, s.static.Listen6.Addr()
	}
	if conf.IsValid() {
		return conf
	}
	if ses.local.IsValid() {
		return ses.local
	}
	return listen
}

// grant applies policy, quotas and port choice, then installs the mapping.
func (s *Server) grant(o lease.Owner, client netip.Addr, server netip.AddrPort, proposed uint16, life time.Duration, quota int) (*lease.Mapping, proto.Reason) {
	legacy := o == lease.LegacyOwner
	now := s.now()
	if !client.IsValid() || client.Is4In6() || client.Zone() != "" {
		return nil, proto.ReasonPolicyDenied
	}
	if client.Is4() != server.Addr().Is4() {
		// Conntrack NAT cannot translate between families: an IPv6 server
		// needs a session over IPv6 (listen6), an IPv4 one a session over
		// IPv4. Policy-denied is what older relays answered, and agents
		// take it per server.
		s.log.Info("destination refused", "member", o.Name, "client", client, "server", server,
			"why", "the session's address family differs from the server's (NAT cannot translate IPv4 to IPv6): open the session over the server's family")
		return nil, proto.ReasonPolicyDenied
	}
	if err := s.pol.Check(server); err != nil {
		s.log.Info("destination refused", "member", o.Name, "client", client, "server", server, "why", err)
		return nil, proto.ReasonPolicyDenied
	}
	if m := s.leases.Find(o, client, server); m != nil {
		// Idempotent: a retransmitted or repeated grant gets the same port.
		m.Expires = now.Add(life)
		s.logAttr(mappingEvent("renew", m, now))
		return m, proto.OK
	}
	if s.leases.QuotaUsed(o, client) >= quota || s.leases.Active() >= s.set.QuotaGlobal {
		return nil, proto.ReasonQuota
	}
	port, ok := s.leases.PickPort(client, proposed, s.set.PortLo, s.set.PortHi, legacy, now)
	if !ok {
		return nil, proto.ReasonNoPorts
	}
	m := &lease.Mapping{Key: dataplane.Key{Client: client, Port: port}, Server: server, Owner: o, Granted: now, Expires: now.Add(life)}
	// Recorded now so that quotas and port choice see it within the batch;
	// flush installs it (or drops it again).
	s.leases.Add(m)
	s.out.batch = append(s.out.batch, m)
	return m, proto.OK
}

// close unmaps mappings; their counters are read and logged by reap.
func (s *Server) close(ms []*lease.Mapping, reason string) error {
	if len(ms) == 0 {
		return nil
	}
	if len(s.out.batch) > 0 {
		// A mapping granted earlier in this batch is not in the kernel yet.
		s.flush()
	}
	keys := make([]dataplane.Key, len(ms))
	for i, m := range ms {
		keys[i] = m.Key
	}
	err := s.dp.Unmap(keys)
	if err != nil {
		s.log.Error("removing mappings", "n", len(keys), "err", err)
	}
	now := s.now()
	for _, m := range ms {
		s.leases.Remove(m, reason, now)
	}
	s.met.active.Set(float64(s.leases.Active()))
	return err
}

func (s *Server) expire(now time.Time) {
	if ex := s.leases.Expired(now); len(ex) > 0 {
		_ = s.close(ex, "expiry")
	}
}

// reap reads the counters of closed mappings and, once a mapping's counter
// has stood still for a reap interval (its connections have finished) or
// maxLinger has passed, logs its final count and forgets it. Connections
// that outlive their mapping (conntrack keeps them going) are counted until
// then. final logs and forgets everything (shutdown).
func (s *Server) reap(now time.Time, final bool) {
	if len(s.leases.Closing) == 0 {
		return
	}
	keys := make([]dataplane.Key, 0, len(s.leases.Closing))
	for k := range s.leases.Closing {
		keys = append(keys, k)
	}
	cnt, err := s.dp.CountersOf(keys)
	if err != nil {
		// Should not happen (every closing mapping has its element); the
		// full dump is slow but tolerates surprises.
		s.log.Warn("reading counters of closed mappings; falling back to a dump", "err", err)
		if cnt, err = s.dp.Counters(); err != nil {
			s.log.Error("reading counters", "err", err)
			if !final {
				return
			}
		}
	}
	keys = keys[:0]
	for k, c := range s.leases.Closing {
		cur := cnt[k]
		if !final && (!c.Seen || cur.Bytes != c.LastBytes) && now.Sub(c.At) < maxLinger {
			c.Seen, c.LastBytes = true, cur.Bytes
			s.leases.Closing[k] = c
			s.ledgerClosing(c.M, cur.Bytes, false)
			continue
		}
		s.ledgerClosing(c.M, cur.Bytes, true)
		s.logAttr(withCounter(mappingEvent(c.Reason, c.M, c.At), cur))
		s.met.closedBytes.Add(cur.Bytes)
		s.met.memberBytes.WithLabelValues(c.M.Owner.Name).Add(float64(cur.Bytes))
		keys = append(keys, k)
		delete(s.leases.Closing, k)
	}
	if err := s.dp.Forget(keys); err != nil {
		s.log.Error("removing counters", "err", err)
	}
}

func (s *Server) prune(now time.Time) {
	for idx, ses := range s.ses.all {
		if now.Sub(ses.created) > proto.SessionLifetime || !ses.confirmed && now.Sub(ses.created) > unconfirmedLife {
			delete(s.ses.all, idx)
			ids := s.ses.byMember[ses.peer]
			for i, v := range ids {
				if v == idx {
					s.ses.byMember[ses.peer] = append(ids[:i:i], ids[i+1:]...)
					break
				}
			}
			if len(s.ses.byMember[ses.peer]) == 0 {
				delete(s.ses.byMember, ses.peer)
				delete(s.ses.rotated, ses.peer)
			}
		}
	}
	for k, b := range s.lim.member {
		if now.Sub(b.last) > time.Minute {
			delete(s.lim.member, k)
		}
	}
	_ = s.pol.RefreshOwn()
	s.syncConverterPolicy()
}

// ensureTable recreates the relay's nftables table, with every active
// mapping, when someone removed it (nft flush ruleset, another tool); it
// says whether it did.
func (s *Server) ensureTable() bool {
	ok, err := s.dp.Exists()
	if err != nil || ok {
		return false
	}
	ms := make([]dataplane.Mapping, 0, len(s.leases.ByKey))
	for _, m := range s.leases.ByKey {
		ms = append(ms, m.DP())
	}
	if err := s.dp.Recreate(ms); err != nil {
		s.log.Error("the relay's nftables table was removed and could not be recreated", "table", dataplane.TableName, "err", err)
		return false
	}
	s.log.Warn("the relay's nftables table was removed by someone else: recreated it", "table", dataplane.TableName, "mappings", len(ms))
	return true
}

// logUsage writes a "usage" line with the running byte and packet counts
// of every active mapping that moved since its last line, so that a relay
// killed with SIGKILL loses at most one attribution_flush period of
// attribution (the closing line is written only on release, expiry or a
// clean shutdown). Counts are cumulative per mapping: the last line of a
// mapping is its total so far.
// liveCounters reads the kernel's counters of every granted mapping
// (installing the pending batch first: its mappings are not in the kernel
// yet). Used by the attribution flush and relay status.
func (s *Server) liveCounters() (map[dataplane.Key]dataplane.Counter, error) {
	if len(s.out.batch) > 0 {
		s.flush()
	}
	keys := make([]dataplane.Key, 0, len(s.leases.ByKey))
	for k := range s.leases.ByKey {
		keys = append(keys, k)
	}
	return s.dp.CountersOf(keys)
}

func (s *Server) logUsage(now time.Time) {
	if s.attr == nil || s.attr.path == "" || len(s.leases.ByKey) == 0 {
		return
	}
	cnt, err := s.liveCounters()
	if err != nil {
		s.log.Error("reading counters for the attribution log", "err", err)
		return
	}
	for k, c := range cnt {
		m := s.leases.ByKey[k]
		if m == nil || c.Bytes == m.UsageBytes {
			continue
		}
		m.UsageBytes = c.Bytes
		s.logAttr(withCounter(mappingEvent("usage", m, now), c))
	}
}

func (s *Server) logAttr(ev attrEvent) {
	if err := s.attr.write(ev); err != nil {
		s.log.Error("attribution log", "err", err)
	}
}

// applyReload applies a reloaded configuration. The static part stays
// as it was at start (warnRestartOnly says what differs); each part takes
// its share of the reloadable part: keys and the live trust (trust part),
// gossip, fair share, the attribution log, policy and members.
func (s *Server) applyReload(c *Config) {
	s.warnRestartOnly(&c.Static)
	set := &c.Reloadable
	s.reloadKeys(set)
	authorityChanged := s.trust.Reload(set.Trust, set.CRLFile, s.set.CRLFile)
	s.reloadRoster(set) // after: the roster shares the live trust
	keep := func(k proto.Key) bool {
		_, ok := set.Members[k]
		return ok || s.certifiedOK(k, s.now())
	}
	revoked := s.revokeKeys(keep, "revoked")
	for k := range s.set.Members {
		if !keep(k) && s.tunnels != nil {
			s.tunnels.Release(k) // also when no session of it is left
		}
	}
	if set.AttributionLog != s.attr.path || set.AttributionLog != "" && set.AttributionLog != "-" {
		// Reopening also follows a rotated file.
		if l, err := openAttrLog(set.AttributionLog); err != nil {
			s.log.Error("reload: attribution log: keeping the one open", "file", s.attr.path, "err", err)
		} else {
			_ = s.attr.Close()
			s.attr = l
		}
	}
	s.reloadFair(set, authorityChanged)
	s.set = set
	s.applyPolicy(set)
	s.log.Info("configuration reloaded", "members", len(set.Members), "revoked_mappings", revoked, "active", s.leases.Active())
}

// warnRestartOnly logs what a reload asked for that applies only at the
// next start.
func (s *Server) warnRestartOnly(st *Static) {
	if st.Listen != s.static.Listen || st.Listen6 != s.static.Listen6 || st.Legacy != s.static.Legacy || st.LegacyListen != s.static.LegacyListen || st.FastPath != s.static.FastPath ||
		st.ReceiveBuffer != s.static.ReceiveBuffer {
		s.log.Warn("reload: listen address, receive_buffer, legacy_v1 and fast_path change only on restart")
	}
	if st.StateFile != s.static.StateFile || st.MetricsListen != s.static.MetricsListen {
		s.log.Warn("reload: state_file and metrics change only on restart")
	}
	if !st.Tunnel.Same(s.static.Tunnel) {
		// The WireGuard device, its subnet, port and destination policy are
		// set up once; re-creating them would drop every tunnel.
		s.log.Warn("reload: the tunnel section changed but is applied only at start: restart the relay to apply it (tunnels in use would be re-established)")
	}
	if st.Convert != s.static.Convert {
		s.log.Warn("reload: the convert section changed but is applied only at start: restart the relay to apply it")
	}
}

// finishAccounts is the stop's last accounting (shutdown and handover):
// counters of closing mappings, the tunnels' usage, the ledger on disk.
func (s *Server) finishAccounts(now time.Time) {
	s.reap(now, true)
	s.ledgerTunnels(now)
	if err := s.fair.led.Save(now); err != nil {
		s.log.Error("saving the ledger", "err", err)
	}
}

// shutdown logs every mapping's final counters and removes the table.
func (s *Server) shutdown() {
	if s.gossip.restarting {
		s.rosterRestarted(<-s.gossip.done, true) // the node must not outlive the relay
	}
	if s.gossip.node != nil {
		_ = s.gossip.node.Close() // leave first: the others drop this relay at once
	}
	now := s.now()
	var all []*lease.Mapping
	for _, m := range s.leases.ByKey {
		all = append(all, m)
	}
	if s.static.StateFile != "" && s.handOver(all, now) {
		return
	}
	for _, m := range all {
		s.leases.Remove(m, "shutdown", now)
	}
	s.finishAccounts(now)
	if err := s.dp.Close(); err != nil {
		s.log.Error("removing nftables table", "err", err)
	}
	s.closeAll()
	s.log.Info("relay stopped", "mappings_removed", len(all))
}
