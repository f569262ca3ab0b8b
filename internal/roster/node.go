package roster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Config configures a relay's membership in the roster cluster.
type Config struct {
	// Bind is the gossip address (UDP and TCP, memberlist's); Advertise is
	// what other relays are told to reach (default: Bind, which must then
	// not be unspecified).
	Bind      netip.AddrPort
	Advertise netip.AddrPort
	// Join: gossip addresses of relays already in the cluster (any one
	// suffices); retried every RejoinEvery while this relay is alone.
	Join []string
	// Secret: the 32-byte key that authenticates and encrypts all gossip
	// (memberlist's AES-GCM keyring; packets and streams without it are
	// dropped); every relay of the cluster needs the same. Required:
	// without it anyone who reaches the gossip port could declare a live
	// relay dead (docs/security.md).
	Secret []byte
	// Failure detection (defaults 500 ms, 250 ms, 2: a dead relay leaves
	// the roster within about 3 s in small clusters, see docs/collective.md).
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int
	RejoinEvery   time.Duration // default 5 s
	// Tuning (issue 30; 0: the defaults below, chosen by measurement in
	// docs/results/roster): Lifeguard's cap on a suspicion's start
	// (x the suspicion timeout), gossip fan-out and interval, the
	// periodic state sync's interval (memberlist scales it up with
	// log2(N/32)), and how often every relay retransmits a new message
	// (x ceil(log10(N+1))).
	SuspicionMaxTimeoutMult int
	GossipNodes             int
	GossipInterval          time.Duration
	PushPullInterval        time.Duration
	RetransmitMult          int

	Key   proto.Key               // the relay's private control-protocol key
	Cert  *collective.Certificate // its certificate (role relay)
	Trust *collective.Trust       // authority and revocation list

	Log *slog.Logger
	Now func() time.Time
	// OnChange is called (without locks held) after the roster changed;
	// OnRefused when an entry is dropped, with its Reason label.
	OnChange  func()
	OnRefused func(reason string)
	// OnCRL is called (without locks held) after a newer revocation list
	// learned from another relay was installed in Trust; OnCRLRefused when
	// a gossiped list is refused, with its CRLReason label (crl.go).
	OnCRL        func(l *collective.RevocationList)
	OnCRLRefused func(reason string)

	// Transport replaces memberlist's UDP/TCP transport (the simulation's
	// in-process network); Name then names the node's address on it.
	Transport memberlist.NodeAwareTransport
	// Verify replaces Parse+Verify (the simulation shares one cache of
	// verified entries among its relays); nil: Node's own.
	Verify func(meta []byte, now time.Time) (*Entry, error)
	// TimeScale is the simulation's time dilation: every interval and
	// timeout of memberlist (probe, gossip, state sync, TCP, suspicion
	// through the probe interval, reclaim) and of the Node (RejoinEvery,
	// the wait for an update's broadcast) is multiplied by it, so that N
	// relays sharing one machine's CPU do K times less work per second
	// and the protocol runs as on a machine K times faster
	// (docs/results/roster). 0 or 1: real time.
	TimeScale float64
}

// Info is what a relay announces about itself (signed into its entry).
type Info struct {
	Addrs    []netip.AddrPort
	Capacity uint32
	Load     uint32
	Kinds    Kinds
	Region   string
}

// Node is one relay's membership: it announces its own signed entry and
// keeps the verified entries of the others.
type Node struct {
	cfg  Config
	log  *slog.Logger
	list *memberlist.Memberlist

	mu      sync.Mutex
	trust   *collective.Trust
	self    []byte // our signed entry
	info    Info
	entries map[string]*known    // by node name
	refused map[string]uint64    // by Reason
	logged  map[string]time.Time // refusals: last logged, by reason
	muted   map[string]uint64    // refusals not logged since
	changes uint64
	snap    *Snapshot // the last one built (snapshot.go)
	crl     crlState  // the revocation list's gossip (crl.go)
	ml      atomic.Pointer[memberlist.Memberlist]

	stop chan struct{}
	kick chan struct{}
	wg   sync.WaitGroup
}

type known struct {
	meta  []byte
	entry *Entry
	since time.Time
}

// Defaults of Config.
const (
	DefaultProbeInterval = 500 * time.Millisecond
	DefaultProbeTimeout  = 250 * time.Millisecond
	// Chosen by measurement (docs/results/roster, issue 30): against the
	// earlier 3, 4 and 30 s (memberlist's retransmit and sync) in the same
	// runs, suspicion 2 takes a killed relay out of every roster sooner at
	// 20, 100 and 1,000 relays (Lifeguard waits for no confirmation);
	// retransmit 6 puts a joined relay in every roster within 10 s at
	// 1,000 while the queues still carry a mass join (21.6 s with 4);
	// state syncs every 90 s (x memberlist's 1 + ceil(log2(N/32))) keep
	// them near 1.5 KB/s per relay at 1,000 instead of ~5 KB/s.
	DefaultSuspicionMult    = 2
	DefaultRetransmitMult   = 6
	DefaultPushPullInterval = 90 * time.Second
	// suspicionMaxTimeoutMult: see Start.
	suspicionMaxTimeoutMult = 2
	DefaultPort             = 45675
)

// Start signs the relay's entry, starts memberlist and joins the cluster
// (in the background if no Join address answers yet).
func Start(cfg Config, info Info) (*Node, error) {
	if cfg.Cert == nil || cfg.Trust == nil {
		return nil, errors.New("roster: a relay certificate and the authority are required")
	}
	if len(cfg.Secret) != 32 {
		return nil, fmt.Errorf("roster: a gossip secret of 32 bytes is required (got %d bytes): unauthenticated gossip lets anyone remove relays", len(cfg.Secret))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	if cfg.SuspicionMult <= 0 {
		cfg.SuspicionMult = DefaultSuspicionMult
	}
	if cfg.RetransmitMult <= 0 {
		cfg.RetransmitMult = DefaultRetransmitMult
	}
	if cfg.PushPullInterval <= 0 {
		cfg.PushPullInterval = DefaultPushPullInterval
	}
	if cfg.RejoinEvery <= 0 {
		cfg.RejoinEvery = 5 * time.Second
	}
	if cfg.TimeScale < 0 || math.IsNaN(cfg.TimeScale) || math.IsInf(cfg.TimeScale, 0) {
		return nil, fmt.Errorf("roster: time scale %v: want a positive factor", cfg.TimeScale)
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	cfg.RejoinEvery = scaleDuration(cfg.RejoinEvery, cfg.TimeScale)
	n := &Node{cfg: cfg, trust: cfg.Trust, log: cfg.Log, entries: map[string]*known{}, refused: map[string]uint64{}, logged: map[string]time.Time{}, muted: map[string]uint64{}, stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.crl = crlState{refused: map[string]uint64{}, logged: map[string]time.Time{}, muted: map[string]uint64{},
		queue: &memberlist.TransmitLimitedQueue{RetransmitMult: crlRetransmitMult, NumNodes: func() int {
			if l := n.ml.Load(); l != nil { // memberlist gossips before Create returns
				return l.NumMembers()
			}
			return 1
		}}}
	if err := cfg.Cert.Verify(cfg.Trust.Authority(), cfg.Now(), nil, collective.RoleRelay); err != nil {
		return nil, fmt.Errorf("roster: this relay's certificate: %w", err)
	}
	if cfg.Cert.Member != cfg.Key.Public() {
		return nil, fmt.Errorf("roster: the certificate is for key %s, not this relay's %s", cfg.Cert.Member.ID(), cfg.Key.Public().ID())
	}
	if err := n.sign(info); err != nil {
		return nil, err
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = NodeName(cfg.Key.Public())
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	// Lifeguard starts a suspicion at SuspicionMaxTimeoutMult x the
	// suspicion timeout and shortens it as other relays confirm it. With
	// memberlist's 6, a dead relay that only one relay has probed yet
	// stays in the roster up to 6 x 1.95 s at 20 relays; the roster
	// should lose a dead relay within 5 s (measured in the
	// collective scenario: docs/results/collective). 2 caps it at
	// 2 x 1.95 s: a live relay still has that long to refute.
	mc.SuspicionMaxTimeoutMult = suspicionMaxTimeoutMult
	for _, o := range []struct {
		v   int
		dst *int
	}{{cfg.SuspicionMaxTimeoutMult, &mc.SuspicionMaxTimeoutMult}, {cfg.GossipNodes, &mc.GossipNodes}, {cfg.RetransmitMult, &mc.RetransmitMult}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if cfg.GossipInterval > 0 {
		mc.GossipInterval = cfg.GossipInterval
	}
	if cfg.PushPullInterval > 0 {
		mc.PushPullInterval = cfg.PushPullInterval
	}
	mc.DeadNodeReclaimTime = 5 * time.Second // a restarted relay may come back on another address
	// Entries are mostly keys and signatures: LZW gains little on them and
	// costs CPU on every gossip message.
	mc.EnableCompression = false
	mc.Delegate = (*delegate)(n)
	mc.Alive = (*aliveFilter)(n)
	mc.Events = (*events)(n)
	mc.Logger = log.New(&logWriter{l: n.log, n: n}, "", 0)
	// Authenticated and encrypted both ways (memberlist refuses
	// unencrypted packets and streams with GossipVerifyIncoming).
	mc.SecretKey = cfg.Secret
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	scaleTimes(mc, cfg.TimeScale)
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
	} else {
		mc.BindAddr = cfg.Bind.Addr().String()
		mc.BindPort = int(cfg.Bind.Port())
		adv := cfg.Advertise
		if !adv.IsValid() {
			adv = cfg.Bind
		}
		if adv.Addr().IsUnspecified() {
			return nil, errors.New("roster: gossip bind address is unspecified: set an advertise address other relays can reach")
		}
		mc.AdvertiseAddr = adv.Addr().String()
		mc.AdvertisePort = int(adv.Port())
	}
	list, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("roster: gossip on %v: %w", cfg.Bind, err)
	}
	n.list = list
	n.ml.Store(list)
	if len(cfg.Join) > 0 {
		if _, err := list.Join(cfg.Join); err != nil {
			n.log.Warn("roster: no relay to join answered yet, retrying", "join", cfg.Join, "err", err)
		}
	}
	n.wg.Add(2)
	go n.rejoin()
	go n.updater()
	return n, nil
}

// scaleTimes multiplies every interval and timeout of mc by k (time
// dilation, Config.TimeScale). The suspicion timeout follows from the
// probe interval; counts (multipliers, fan-out) stay.
func scaleTimes(mc *memberlist.Config, k float64) {
	if k == 1 {
		return
	}
	for _, d := range []*time.Duration{&mc.TCPTimeout, &mc.PushPullInterval, &mc.ProbeInterval, &mc.ProbeTimeout,
		&mc.GossipInterval, &mc.GossipToTheDeadTime, &mc.DeadNodeReclaimTime, &mc.QueueCheckInterval} {
		*d = scaleDuration(*d, k)
	}
}

func scaleDuration(d time.Duration, k float64) time.Duration {
	return time.Duration(float64(d) * k)
}

// Size is how many entries the roster holds, expired or revoked ones
// included: O(1) (the simulation's progress check, whose certificates are
// valid for a day and nobody is revoked; Count filters, O(N)).
func (n *Node) Size() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.entries)
}

// ListsAny tells whether the roster holds an entry of any of the named
// relays (memberlist node names; the simulation's checks, without
// sorting Entries).
func (n *Node) ListsAny(names ...string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		if n.entries[name] != nil {
			return true
		}
	}
	return false
}

// rejoin retries the join addresses while this relay knows no other.
func (n *Node) rejoin() {
	defer n.wg.Done()
	if len(n.cfg.Join) == 0 {
		return
	}
	t := time.NewTicker(n.cfg.RejoinEvery)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		if n.list.NumMembers() > 1 {
			continue
		}
		if k, err := n.list.Join(n.cfg.Join); err == nil {
			n.log.Info("roster: joined", "via", k)
		}
	}
}

func (n *Node) sign(info Info) error {
	e := &Entry{Issued: n.cfg.Now(), Capacity: info.Capacity, Load: info.Load, Kinds: info.Kinds, Region: info.Region, Addrs: info.Addrs, Cert: n.cfg.Cert}
	if err := e.Sign(n.cfg.Key); err != nil {
		return err
	}
	b, err := e.Bytes()
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.self, n.info = b, info
	n.mu.Unlock()
	return nil
}

// Update re-signs the entry when info changed and spreads it.
func (n *Node) Update(info Info) error {
	n.mu.Lock()
	same := slices.Equal(info.Addrs, n.info.Addrs) && info.Capacity == n.info.Capacity && info.Load == n.info.Load &&
		info.Kinds == n.info.Kinds && info.Region == n.info.Region
	n.mu.Unlock()
	if same {
		return nil
	}
	if err := n.sign(info); err != nil {
		return err
	}
	select { // the updater spreads it (memberlist's UpdateNode waits for the broadcast)
	case n.kick <- struct{}{}:
	default: // one is pending already: it reads the newest entry
	}
	return nil
}

// updater runs memberlist's UpdateNode, which blocks until the new
// metadata has been broadcast, away from the caller (the relay's loop).
func (n *Node) updater() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.kick:
		}
		if err := n.list.UpdateNode(scaleDuration(5*time.Second, n.cfg.TimeScale)); err != nil {
			n.log.Debug("roster: spreading this relay's entry", "err", err)
		}
	}
}

// SetTrust replaces the authority and revocation list entries are checked
// against (a relay's configuration reload); entries already held are
// checked again.
func (n *Node) SetTrust(t *collective.Trust) {
	n.mu.Lock()
	if n.trust == t {
		n.mu.Unlock()
		return
	}
	authChanged := n.trust.Authority() != t.Authority()
	n.trust = t
	n.cfg.Trust = t
	var nodes []*memberlist.Node
	for name, k := range n.entries {
		nodes = append(nodes, &memberlist.Node{Name: name, Meta: k.meta})
	}
	clear(n.entries)
	n.mu.Unlock()
	for _, nd := range nodes {
		n.learn(nd)
	}
	if authChanged {
		n.crl.mu.Lock()
		n.crl.sent = 0
		n.crl.mu.Unlock()
		n.crl.queue.Reset()
	}
	n.spreadCRL(true)
	n.changed()
}

// Entries returns the verified entries of the relays alive now (this one
// included), sorted by name; expired or since revoked certificates are
// left out.
func (n *Node) Entries() []*Entry {
	return slices.Clone(n.Snapshot().Entries)
}

// Count is len(Entries()) without building the list.
func (n *Node) Count() int {
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, k := range n.entries {
		if now.Before(k.entry.Cert.NotAfter) && !n.trust.Revoked(k.entry.Cert.Serial) {
			c++
		}
	}
	return c
}

// Refused counts dropped entries by reason (Reason's labels).
func (n *Node) Refused() map[string]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := make(map[string]uint64, len(n.refused))
	for k, v := range n.refused {
		m[k] = v
	}
	return m
}

// Members is how many nodes memberlist sees alive (verified or not).
func (n *Node) Members() int { return n.list.NumMembers() }

// Name is this node's memberlist name.
func (n *Node) Name() string { return n.list.LocalNode().Name }

// Close leaves the cluster (others drop this relay at once) and stops.
func (n *Node) Close() error {
	close(n.stop)
	n.wg.Wait()
	err := n.list.Leave(time.Second)
	if serr := n.list.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// Kill stops without leaving (as a crash would; tests and the simulation).
func (n *Node) Kill() error {
	close(n.stop)
	n.wg.Wait()
	return n.list.Shutdown()
}

func (n *Node) verify(meta []byte, now time.Time) (*Entry, error) {
	if n.cfg.Verify != nil {
		return n.cfg.Verify(meta, now)
	}
	e, err := Parse(meta)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	t := n.trust
	n.mu.Unlock()
	if err := e.Verify(t, now); err != nil {
		return nil, err
	}
	return e, nil
}

// learn verifies a node's metadata and stores or drops its entry.
func (n *Node) learn(node *memberlist.Node) {
	n.mu.Lock()
	if k := n.entries[node.Name]; k != nil && bytes.Equal(k.meta, node.Meta) {
		n.mu.Unlock()
		return
	}
	n.mu.Unlock()
	now := n.cfg.Now()
	e, err := n.verify(node.Meta, now)
	if err == nil && NodeName(e.Key()) != node.Name {
		err = fmt.Errorf("%w: %s carries the entry of %s", errNameMismatch, node.Name, e.Name())
	}
	if err != nil {
		// A previous valid entry of the node stays: a forged update must
		// not remove a relay (the relay refutes it). Its certificate's
		// expiry and revocation still apply (Entries).
		n.refuse(node, Reason(err), err)
		return
	}
	n.mu.Lock()
	if k := n.entries[node.Name]; k != nil && !e.Issued.After(k.entry.Issued) {
		n.mu.Unlock()
		return // an older entry of the same relay (replayed or reordered)
	}
	_, had := n.entries[node.Name]
	// node.Meta is not modified by memberlist (an update brings a new
	// slice), so it is kept without a copy.
	n.entries[node.Name] = &known{meta: node.Meta, entry: e, since: now}
	n.mu.Unlock()
	if !had && n.log.Enabled(context.Background(), slog.LevelInfo) { // the key's ID is a hash
		n.log.Info("roster: relay joined", "relay", e.Name(), "key", e.Key().ID(), "addrs", e.Addrs, "region", e.Region)
	}
	n.changed()
}

// refuse counts a refused entry (or gossip) by reason and logs it, at
// most once every 10 s per reason with the count not logged since: a
// hostile peer can send many.
func (n *Node) refuse(node *memberlist.Node, reason string, err error) {
	now := time.Now()
	n.mu.Lock()
	n.refused[reason]++
	log := now.Sub(n.logged[reason]) >= refuseLogEvery
	muted := n.muted[reason]
	if log {
		n.logged[reason], n.muted[reason] = now, 0
	} else {
		n.muted[reason]++
	}
	n.mu.Unlock()
	if log {
		var name, addr string
		if node != nil {
			name, addr = node.Name, node.Address()
		}
		lvl := n.log.Warn
		if reason == ReasonStale {
			lvl = n.log.Info // routine for a moment while gossip reorders
		}
		lvl("roster: entry refused", "node", name, "addr", addr, "reason", reason, "err", err, "not_logged_since", muted)
	}
	if n.cfg.OnRefused != nil {
		n.cfg.OnRefused(reason)
	}
}

const refuseLogEvery = 10 * time.Second

// aliveFilter is memberlist's AliveDelegate: an alive message (gossip or
// state sync) whose metadata is not a valid entry of the node it names is
// ignored before memberlist stores anything of it, so a hostile peer that
// holds the gossip secret cannot grow every relay's node table with
// invented relays, nor replace a relay's entry with an older or foreign
// one. An unchanged entry costs one comparison.
type aliveFilter Node

func (a *aliveFilter) NotifyAlive(node *memberlist.Node) error {
	n := (*Node)(a)
	n.mu.Lock()
	k := n.entries[node.Name]
	self := n.self
	n.mu.Unlock()
	if k != nil && bytes.Equal(k.meta, node.Meta) || bytes.Equal(self, node.Meta) && node.Name == NodeName(n.cfg.Key.Public()) {
		return nil
	}
	if len(node.Meta) > MaxEntryLen {
		err := fmt.Errorf("entry of %d bytes exceeds %d", len(node.Meta), MaxEntryLen)
		n.refuse(node, ReasonOversized, err)
		return err
	}
	e, err := n.verify(node.Meta, n.cfg.Now())
	if err == nil && NodeName(e.Key()) != node.Name {
		err = fmt.Errorf("%w: %s carries the entry of %s", errNameMismatch, node.Name, e.Name())
	}
	if err == nil && k != nil && !e.Issued.After(k.entry.Issued) {
		err = fmt.Errorf("entry issued %v, not newer than the one held (%v)", e.Issued, k.entry.Issued)
		n.refuse(node, ReasonStale, err)
		return err
	}
	if err != nil {
		n.refuse(node, Reason(err), err)
		return err
	}
	return nil
}

func (n *Node) forget(node *memberlist.Node) {
	n.mu.Lock()
	k, had := n.entries[node.Name]
	delete(n.entries, node.Name)
	n.mu.Unlock()
	if had {
		if n.log.Enabled(context.Background(), slog.LevelInfo) {
			n.log.Info("roster: relay left", "relay", k.entry.Name(), "key", k.entry.Key().ID())
		}
		n.changed()
	}
}

func (n *Node) changed() {
	n.mu.Lock()
	n.changes++
	n.mu.Unlock()
	if n.cfg.OnChange != nil {
		n.cfg.OnChange()
	}
}

// delegate carries the signed entry as node metadata (it travels with
// memberlist's own alive messages and state exchanges) and the revocation
// list as user broadcasts, user messages and push/pull state (crl.go).
type delegate Node

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.self) > limit {
		return nil // cannot happen: MaxEntryLen <= memberlist.MetaMaxSize
	}
	return slices.Clone(d.self)
}
func (d *delegate) NotifyMsg(b []byte) { (*Node)(d).receiveCRL(b, "message") }
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.crl.queue.GetBroadcasts(overhead, limit)
}
func (d *delegate) LocalState(join bool) []byte { return (*Node)(d).localCRL() }
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) > 0 { // a relay without a list sends none
		(*Node)(d).receiveCRL(buf, "state-sync")
	}
}

type events Node

func (e *events) NotifyJoin(node *memberlist.Node)   { (*Node)(e).learn(node) }
func (e *events) NotifyUpdate(node *memberlist.Node) { (*Node)(e).learn(node) }
func (e *events) NotifyLeave(node *memberlist.Node)  { (*Node)(e).forget(node) }

// logWriter turns memberlist's log lines ("[DEBUG] memberlist: ...") into
// slog records at the matching level. Gossip that does not authenticate
// (no or another secret: memberlist drops it and logs the failure) is
// counted as refused "unauthenticated" and logged at most once every 10 s,
// with the count of the lines not logged: anybody can send such packets.
type logWriter struct {
	l *slog.Logger
	n *Node
}

func (w *logWriter) Write(p []byte) (int, error) {
	if w.n != nil && (bytes.Contains(p, []byte("Decrypt packet failed")) || bytes.Contains(p, []byte("decrypt")) || bytes.Contains(p, []byte("Decrypt"))) {
		w.n.refuse(nil, ReasonUnauthenticated, fmt.Errorf("not sealed with this cluster's gossip secret: %s", bytes.TrimSpace(p)))
		return len(p), nil
	}
	s := string(bytes.TrimSpace(p))
	lvl := slog.LevelDebug
	switch {
	case bytes.Contains(p, []byte("[ERR]")):
		lvl = slog.LevelWarn // memberlist's errors are about peers, not us
	case bytes.Contains(p, []byte("[WARN]")):
		lvl = slog.LevelInfo
	}
	w.l.Log(context.Background(), lvl, "memberlist", "msg", s)
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)

// ParseJoin checks a join address (host:port; host may be a name).
func ParseJoin(s string) error {
	h, p, err := net.SplitHostPort(s)
	if err != nil || h == "" {
		return fmt.Errorf("%q is not host:port", s)
	}
	if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not 1-65535", s, p)
	}
	return nil
}
