package relay

import (
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/fairshare"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
	"github.com/mpdetour/mpdetour/internal/relay/trust"
)

// Fair sharing (docs/collective.md, "Fair sharing"): the ledger
// (internal/relay/fairshare) counts what the relay relays for each member; a member earns
// credit by presenting the usage receipts its own relay signed for serving
// others (OpReceipt); when the relay is at capacity (fair_share.capacity
// NAT mappings at once), a grant from a member with more credit takes the
// newest mapping of the member with the least credit, and a grant that
// would take it from a member with as much credit or more is refused with
// the reason "capacity".

// FairConfig is the validated section.
type FairConfig struct {
	Capacity     int
	LedgerFile   string
	ReceiptsFile string
	ReceiptEvery time.Duration
}

// preemptMargin: a grant takes a mapping only from a member with at least
// this much less credit, so two members of about equal credit do not take
// mappings from each other back and forth.
const preemptMargin = collective.CreditUnit

// refreshEvery bounds how often admission at capacity reads the live
// counters (a netlink read of every mapping's counter).
const refreshEvery = time.Second

// fairState is the server's fair-sharing state (event loop only).
type fairState struct {
	led *fairshare.Ledger
	// relays: keys whose certificate with the role relay verified here
	// (OpCertify): the issuers whose receipts count.
	relays    map[proto.Key]trust.Member
	receipts  *prometheus.CounterVec
	preempted prometheus.Counter
	capacity  prometheus.Counter
	lastLog   time.Time
	quiet     int       // refusals not logged since lastLog
	refreshed time.Time // live counters last read into the ledger
}

func newFairState(set *Reloadable, met *metrics, log *slog.Logger, now time.Time) (*fairState, error) {
	led, err := fairshare.Load(set.Fair.LedgerFile)
	if err != nil {
		return nil, err
	}
	if set.Fair.LedgerFile == "" {
		log.Warn("no ledger file (fair_share.ledger_file or state_file): the ledger and credit do not survive a restart")
	} else {
		led.Dirty = true // a ledger file we cannot write is a start-up error
		if err := led.Save(now); err != nil {
			return nil, err
		}
	}
	led.Receipted = now
	f := &fairState{led: led, relays: map[proto.Key]trust.Member{},
		receipts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mpdetour_relay_receipts_total", Help: "Usage receipts presented (OpReceipt) by result: ok, malformed, forged, self-issued, own, not-relay, expired, future, replay, unsupported.",
		}, []string{"result"}),
		preempted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mpdetour_relay_preempted_total", Help: "Mappings closed at capacity for a grant of a member with more credit.",
		}),
		capacity: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mpdetour_relay_capacity_refusals_total", Help: "Grants refused at capacity (every holder had as much credit or more).",
		}),
	}
	met.reg.MustRegister(f.receipts, f.preempted, f.capacity)
	return f, nil
}

// receiptsOn says whether consumption is tracked for receipts.
func (s *Server) receiptsOn() bool { return s.set.Fair.ReceiptsFile != "" }

// memberName is a key's name: listed, certified, or "" when unknown.
func (s *Server) memberName(k proto.Key) string {
	if n, ok := s.set.Members[k]; ok {
		return n
	}
	if cm, ok := s.trust.Certified[k]; ok {
		return cm.Name
	}
	return ""
}

// flushLedger brings the ledger up to the kernel's counters (live
// mappings, WireGuard peers), issues receipts when due and saves it: run
// every attribution_flush, so a kill -9 loses at most one period.
func (s *Server) flushLedger(now time.Time) {
	s.refreshLedger(now)
	s.ledgerTunnels(now)
	s.issueReceipts(now)
	if err := s.fair.led.Save(now); err != nil {
		s.log.Error("saving the ledger", "err", err)
	}
}

// refreshLedger counts the live mappings' counters.
func (s *Server) refreshLedger(now time.Time) {
	s.fair.refreshed = now
	if len(s.leases.ByKey) == 0 {
		return
	}
	cnt, err := s.liveCounters()
	if err != nil {
		s.log.Error("reading counters for the ledger", "err", err)
		return
	}
	s.ledgerCounters(cnt, now)
}

// ledgerCounters brings the ledger up to the mappings' counters cnt
// (one reading of the kernel's counters).
func (s *Server) ledgerCounters(cnt map[dataplane.Key]dataplane.Counter, now time.Time) {
	s.fair.refreshed = now
	for k, c := range cnt {
		if m := s.leases.ByKey[k]; m != nil {
			s.fair.led.AddMapping(m, c.Bytes, now, s.receiptsOn())
		}
	}
}

// ledgerTunnels counts the WireGuard peers' bytes.
func (s *Server) ledgerTunnels(now time.Time) {
	if s.tunnels == nil {
		return
	}
	dev, err := s.tunnels.Status()
	if err != nil {
		s.log.Warn("ledger: reading the tunnel device", "err", err)
		return
	}
	for _, p := range dev.Peers {
		k := proto.Key(p.PublicKey)
		s.fair.led.TunnelPeer(k, s.memberName(k), uint64(p.ReceiveBytes+p.TransmitBytes), now, s.receiptsOn())
	}
}

// ledgerClosing counts a closing mapping's counter (reap); gone: its last
// reading, the mapping is forgotten.
func (s *Server) ledgerClosing(m *lease.Mapping, cur uint64, gone bool) {
	s.fair.led.AddMapping(m, cur, s.now(), s.receiptsOn())
	if gone {
		delete(s.fair.led.MapSeen, m)
	}
}

// ledgerConversion counts a finished conversion, charged to the key its
// ticket was issued to (or moved to by a rotation; a conversion that took
// its ticket before the rotation goes to the successor too, while the
// rotation is remembered): while a
// rotated member's old and new keys both carry its name, the name alone
// does not tell the key. A key that is no member any more is not charged.
func (s *Server) ledgerConversion(d convertDone) {
	if d.up+d.down <= 0 {
		return
	}
	k := d.key
	if to, ok := s.ses.rotated[k]; ok {
		k = to
	}
	name := s.memberName(k)
	if k.IsZero() || name == "" {
		return
	}
	s.fair.led.AddConsumed(k, name, uint64(d.up+d.down), d.at, s.receiptsOn())
}

// issueReceipts signs a receipt for every member served since the last
// ones (not this relay's own key: a relay cannot earn by serving itself),
// appends them to fair_share.receipts_file (fsync) and only then takes
// them off the ledger.
func (s *Server) issueReceipts(now time.Time) {
	led := s.fair.led
	if !s.receiptsOn() || now.Sub(led.Receipted) < s.set.Fair.ReceiptEvery {
		return
	}
	led.Receipted = now
	own := s.set.PrivateKey.Public()
	keys := make([]proto.Key, 0, len(led.Members))
	for k, e := range led.Members {
		if e.Unreceipted == 0 {
			continue
		}
		if k == own {
			e.Unreceipted, e.UnreceiptedSince = 0, time.Time{}
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	var out []byte
	seq := led.Seq
	for _, k := range keys {
		e := led.Members[k]
		seq++
		r := &collective.Receipt{Served: k, Seq: seq, Start: e.UnreceiptedSince, End: now, Relayed: e.Unreceipted}
		if r.Start.IsZero() || r.Start.After(now) {
			r.Start = now
		}
		if err := collective.SignReceipt(r, s.set.PrivateKey); err != nil {
			s.log.Error("signing a receipt", "member", e.Name, "err", err)
			return
		}
		out = append(out, r.String()+"\n"...)
	}
	if err := appendSync(s.set.Fair.ReceiptsFile, out); err != nil {
		s.log.Error("writing receipts; they are issued again next time", "file", s.set.Fair.ReceiptsFile, "err", err)
		return
	}
	led.Seq = seq
	for _, k := range keys {
		e := led.Members[k]
		e.Unreceipted, e.UnreceiptedSince = 0, time.Time{}
	}
	led.Dirty = true
	s.log.Info("receipts issued", "receipts", len(keys), "last_seq", seq, "file", s.set.Fair.ReceiptsFile)
}

func appendSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// noteRelayCert records a presented certificate that holds the role relay
// (called for every OpCertify): its key's receipts count here.
func (s *Server) noteRelayCert(key proto.Key, cert []byte) {
	if s.trust.Live == nil {
		return
	}
	c, err := s.trust.Live.CheckBytes(cert, key, collective.RoleRelay, s.now())
	if err != nil {
		return
	}
	s.fair.relays[key] = trust.Member{Name: c.Name, Serial: c.Serial, NotAfter: c.NotAfter}
}

// Receipt refusals: the metric label and the reason on the wire.
var receiptRefusals = []struct {
	err    error
	label  string
	reason proto.Reason
}{
	{collective.ErrReceiptForged, "forged", proto.ReasonUnauthorized},
	{collective.ErrReceiptSelfIssued, "self-issued", proto.ReasonUnauthorized},
	{collective.ErrReceiptExpired, "expired", proto.ReasonExpired},
	{collective.ErrReceiptFuture, "future", proto.ReasonExpired},
	{collective.ErrReceiptReplay, "replay", proto.ReasonReplay},
	{errOwnReceipt, "own", proto.ReasonUnauthorized},
	{errNotRelay, "not-relay", proto.ReasonUnauthorized},
}

var (
	errOwnReceipt = errors.New("receipt issued by this relay (it knows what it served)")
	errNotRelay   = errors.New("issuer holds no valid certificate with the role relay here (present it with OpCertify)")
)

// acceptReceipt verifies a presented receipt and credits its issuer.
func (s *Server) acceptReceipt(b []byte, now time.Time) (*collective.Receipt, error) {
	r, err := collective.ParseReceiptBytes(b)
	if err != nil {
		return nil, err
	}
	if r.Issuer == s.set.PrivateKey.Public() {
		return r, errOwnReceipt
	}
	cm, ok := s.fair.relays[r.Issuer]
	if !ok || !now.Before(cm.NotAfter) || s.trust.Live.Revoked(cm.Serial) {
		return r, errNotRelay
	}
	if err := r.Check(now); err != nil {
		return r, err
	}
	w := s.fair.led.Windows[r.Issuer]
	if w == nil {
		w = &collective.ReplayWindow{}
	}
	if !w.Accept(r.Seq) {
		return r, collective.ErrReceiptReplay
	}
	s.fair.led.Windows[r.Issuer] = w
	e := s.fair.led.Entry(r.Issuer, s.memberName(r.Issuer))
	e.Earned += r.Relayed
	e.Receipts++
	e.Updated = now.UTC()
	s.fair.led.Dirty = true
	return r, nil
}

// serveReceipt handles OpReceipt; the reply carries the issuer's credit.
func (s *Server) serveReceipt(ses *session, req *proto.ReceiptRequest) answer {
	if s.trust.Live == nil {
		s.fair.receipts.WithLabelValues("unsupported").Inc()
		return refused(proto.ReasonUnsupported)
	}
	now := s.now()
	r, err := s.acceptReceipt(req.Receipt, now)
	if err == nil {
		s.fair.receipts.WithLabelValues("ok").Inc()
		s.log.Debug("receipt accepted", "issuer", s.memberName(r.Issuer), "served", r.Served.ID(), "seq", r.Seq, "bytes", r.Relayed, "by", ses.name)
		return success(&proto.ReceiptReply{Credit: s.fair.led.Members[r.Issuer].Credit()})
	}
	label, reason := "malformed", proto.ReasonMalformed
	for _, x := range receiptRefusals {
		if errors.Is(err, x.err) {
			label, reason = x.label, x.reason
			break
		}
	}
	s.fair.receipts.WithLabelValues(label).Inc()
	// One line per second at most: a member may present many.
	if now.Sub(s.fair.lastLog) < time.Second {
		s.fair.quiet++
		return refused(reason)
	}
	args := []any{"reason", label, "member", ses.name, "key", ses.peer.ID(), "detail", err.Error()}
	if r != nil {
		args = append(args, "issuer", r.Issuer.ID(), "seq", r.Seq)
	}
	if s.fair.quiet > 0 {
		args = append(args, "not_logged_since_last", s.fair.quiet)
	}
	s.log.Info("receipt refused", args...)
	s.fair.lastLog, s.fair.quiet = now, 0
	return refused(reason)
}

// holder is a member holding mappings, as admission sees it.
type holder struct {
	key    proto.Key
	credit int64
	newest *lease.Mapping // the member's most recently granted mapping
}

// pickVictim says whose newest mapping gives way to a grant of a member
// with credit req: the holder with the least credit, at least
// preemptMargin below req (ties: the most recent grant goes first); -1
// when none qualifies.
func pickVictim(req int64, hs []holder) int {
	best := -1
	for i, h := range hs {
		if float64(req)-float64(h.credit) < preemptMargin {
			continue
		}
		if best < 0 || h.credit < hs[best].credit ||
			h.credit == hs[best].credit && h.newest.Granted.After(hs[best].newest.Granted) {
			best = i
		}
	}
	return best
}

// admit decides a new grant when fair_share.capacity is set: below
// capacity anyone is served; at capacity the grant takes the newest
// mapping of the member with the least credit if that is at least
// preemptMargin below the requester's, else it is refused "capacity".
// A repeated grant of a mapping the member holds is always answered.
func (s *Server) admit(o lease.Owner, client netip.Addr, server netip.AddrPort) proto.Reason {
	capacity := s.set.Fair.Capacity
	if capacity == 0 || s.leases.Find(o, client, server) != nil || s.leases.Active() < capacity {
		return proto.OK
	}
	// Credit from the current counters, not the last flush's (at most one
	// read of the live counters a second).
	if now := s.now(); now.Sub(s.fair.refreshed) >= refreshEvery {
		s.refreshLedger(now)
	}
	req := s.fair.led.Members[o.Key].Credit()
	byKey := map[proto.Key]*holder{}
	var legacy *holder // legacy v1 mappings have no member and no credit: they go first
	for _, m := range s.leases.ByKey {
		if m.Owner.Key == o.Key && !m.Owner.Key.IsZero() {
			continue
		}
		h := byKey[m.Owner.Key]
		if m.Owner.Key.IsZero() {
			if legacy == nil {
				legacy = &holder{credit: -1 << 63}
			}
			h = legacy
		} else if h == nil {
			h = &holder{key: m.Owner.Key, credit: s.fair.led.Members[m.Owner.Key].Credit()}
			byKey[m.Owner.Key] = h
		}
		if h.newest == nil || m.Granted.After(h.newest.Granted) {
			h.newest = m
		}
	}
	hs := make([]holder, 0, len(byKey)+1)
	for _, h := range byKey {
		hs = append(hs, *h)
	}
	if legacy != nil {
		hs = append(hs, *legacy)
	}
	v := pickVictim(req, hs)
	if v < 0 {
		s.fair.capacity.Inc()
		s.log.Debug("grant refused at capacity", "member", o.Name, "credit", req, "capacity", capacity)
		return proto.ReasonCapacity
	}
	victim := hs[v].newest
	s.fair.preempted.Inc()
	s.log.Info("capacity: mapping given to a member with more credit", "member", o.Name, "credit", req,
		"from", victim.Owner.Name, "from_credit", hs[v].credit, "detour_port", victim.Key.Port)
	if err := s.close([]*lease.Mapping{victim}, "preempted"); err != nil {
		return proto.ReasonInternal
	}
	return proto.OK
}

// reloadFair applies a reloaded fair_share section (called by applyReload
// after the trust part took the file's trust): capacity and receipts
// change at once; the ledger file only on restart (the ledger keeps its
// path).
func (s *Server) reloadFair(set *Reloadable, authorityChanged bool) {
	if set.Fair.LedgerFile != s.fair.led.Path {
		s.log.Warn("reload: fair_share.ledger_file changes only on restart", "ledger_file", s.fair.led.Path)
	}
	if authorityChanged {
		// Another authority (or none): relay certificates verified under
		// the old one count no more.
		clear(s.fair.relays)
	}
}

// LedgerStatus is one member's account in `relay status`.
type LedgerStatus struct {
	Consumed uint64 `json:"consumed_bytes"` // relayed here for the member
	Earned   uint64 `json:"earned_bytes"`   // in receipts of its relay accepted here
	Receipts uint64 `json:"receipts"`
	Credit   int64  `json:"credit_bytes"` // StartCredit + earned - consumed
	// CreditUnits is Credit in units of collective.CreditUnit (MiB).
	CreditUnits float64 `json:"credit_units"`
}

// FairStatus is the relay's fair-sharing state in `relay status`.
type FairStatus struct {
	Capacity    int       `json:"capacity"` // NAT mappings at once (0: no limit)
	Active      int       `json:"active"`
	UnitBytes   int64     `json:"credit_unit_bytes"`
	StartCredit int64     `json:"start_credit_bytes"`
	LedgerFile  string    `json:"ledger_file,omitempty"`
	LedgerSaved time.Time `json:"ledger_saved,omitzero"`
	IssuedSeq   uint64    `json:"receipts_issued_seq"`
	// Others: members in the ledger that are not members now (their
	// certificate expired, or they left the list).
	Others []OtherLedger `json:"others,omitempty"`
}

// OtherLedger is a ledger entry of a key that is not a member now.
type OtherLedger struct {
	Name   string       `json:"name"`
	Key    string       `json:"key"`
	Ledger LedgerStatus `json:"ledger"`
}

func ledgerStatus(e *fairshare.Entry) *LedgerStatus {
	ls := &LedgerStatus{Credit: e.Credit()}
	if e != nil {
		ls.Consumed, ls.Earned, ls.Receipts = e.Consumed, e.Earned, e.Receipts
	}
	ls.CreditUnits = float64(ls.Credit) / collective.CreditUnit
	return ls
}

// fairStatus adds the ledger to a status snapshot (event loop only); the
// counters are brought up to date first, so status shows the kernel's
// current count.
func (s *Server) fairStatus(st *Status, cnt map[dataplane.Key]dataplane.Counter, cntErr error) {
	led := s.fair.led
	if cntErr == nil {
		// The reading the members' bytes in st come from: the ledger
		// and the mappings show the same count (a second reading would
		// include packets that passed in between, such as a FIN).
		s.ledgerCounters(cnt, st.Now)
	} else {
		s.refreshLedger(st.Now)
	}
	s.ledgerTunnels(st.Now)
	shown := map[string]bool{}
	for i := range st.Members {
		m := &st.Members[i]
		k, err := proto.ParseKey(m.Key)
		if err != nil {
			continue
		}
		m.Ledger = ledgerStatus(led.Members[k])
		shown[m.Key] = true
	}
	fs := &FairStatus{Capacity: s.set.Fair.Capacity, Active: s.leases.Active(), UnitBytes: collective.CreditUnit,
		StartCredit: collective.StartCredit, LedgerFile: led.Path, LedgerSaved: led.Saved, IssuedSeq: led.Seq}
	for k, e := range led.Members {
		if !shown[k.String()] {
			fs.Others = append(fs.Others, OtherLedger{Name: e.Name, Key: k.String(), Ledger: *ledgerStatus(e)})
		}
	}
	sort.Slice(fs.Others, func(i, j int) bool { return fs.Others[i].Key < fs.Others[j].Key })
	st.Fair = fs
}
