package roster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/collective"
)

// Revocation lists over gossip (docs/collective.md, "The revocation list
// over gossip"). Relays share the newest signed revocation list of their
// authority through memberlist's own mechanisms, nothing of the project's:
//
//   - a relay that installs a newer list (from its crl_file or from a peer)
//     queues it as a user broadcast (memberlist's TransmitLimitedQueue: each
//     relay passes it on crlRetransmitMult × ceil(log10(n+1)) times on its
//     gossip rounds, every 200 ms, to 3 random relays), if it fits one UDP
//     packet (MaxCRLBroadcast);
//   - every push/pull state exchange (on join, and every 30 s with a random
//     relay; TCP) carries the list as the delegate's LocalState, so a relay
//     that joins, or missed the broadcasts, gets it there;
//   - a list too large for a broadcast (more than about 135 serials) is sent
//     once over TCP (memberlist's SendReliable) by the relay that read it
//     from its file to every relay alive; the others get it by push/pull.
//
// The message is the authority's key and the list's binary form; the list
// is verified against the receiver's own authority before anything is
// done with it, so whoever can reach the gossip port can send one, but
// only the authority can make a relay apply one.

// CRL message: kind:u8 (msgCRL) authority[32] list (collective's binary
// form: version, seq, issued, count, serials, signature).
const (
	msgCRL = 1
	// MaxCRLGossip bounds the message (8,000 serials or so); a longer list
	// is applied from the file but not gossiped (logged).
	MaxCRLGossip = 64 << 10
	// MaxCRLBroadcast is the longest message sent as a UDP broadcast; it
	// leaves room in memberlist's 1,400-byte packets for its headers,
	// encryption and its own messages (longer ones go over TCP).
	MaxCRLBroadcast = 1200
	crlMinLen       = 1 + 32 + 21 + 64
	// crlRetransmitMult: memberlist's default (4) lets a relay miss a
	// broadcast that every relay passes on with a probability of about
	// e^-4 (2 %), leaving it to the next state exchange (30 s); at 12 it is
	// e^-12 (6 per million), for a few more packets of about 130 bytes per
	// new list.
	crlRetransmitMult = 12
)

// EncodeCRL is the gossip message carrying l, a list of auth.
func EncodeCRL(auth collective.AuthorityKey, l *collective.RevocationList) []byte {
	b := make([]byte, 0, 1+len(auth)+21+8*len(l.Serials)+64)
	b = append(b, msgCRL)
	b = append(b, auth[:]...)
	return append(b, l.Bytes()...)
}

// Refusal reasons of a gossiped revocation list (metrics labels).
const (
	CRLMalformed      = "malformed"       // does not decode
	CRLWrongAuthority = "wrong-authority" // signed (it says) by another authority
	CRLForged         = "forged"          // signature does not verify under ours
	CRLStale          = "stale"           // not newer than the list held
)

var errCRLWrongAuthority = errors.New("revocation list of another authority")

// DecodeCRL checks a gossip message against the authority auth and returns
// the list it carries. Errors: CRLReason gives their label.
func DecodeCRL(b []byte, auth collective.AuthorityKey) (*collective.RevocationList, error) {
	if len(b) < crlMinLen || len(b) > MaxCRLGossip {
		return nil, fmt.Errorf("revocation list message: %d bytes, want %d..%d", len(b), crlMinLen, MaxCRLGossip)
	}
	if b[0] != msgCRL {
		return nil, fmt.Errorf("revocation list message: kind %d, want %d", b[0], msgCRL)
	}
	var a collective.AuthorityKey
	copy(a[:], b[1:33])
	if a != auth {
		return nil, fmt.Errorf("%w (%s)", errCRLWrongAuthority, a)
	}
	return collective.ParseRevocationListBytes(b[33:], auth)
}

// CRLReason is the label of a DecodeCRL or Install error.
func CRLReason(err error) string {
	switch {
	case errors.Is(err, errCRLWrongAuthority):
		return CRLWrongAuthority
	case errors.Is(err, collective.ErrCRLForged):
		return CRLForged
	case errors.Is(err, collective.ErrCRLStale):
		return CRLStale
	}
	return CRLMalformed
}

// crlBroadcast is a queued list; a newer one replaces it in the queue.
type crlBroadcast struct{ msg []byte }

func (b *crlBroadcast) Invalidates(o memberlist.Broadcast) bool {
	_, ok := o.(*crlBroadcast)
	return ok
}
func (b *crlBroadcast) Message() []byte { return b.msg }
func (b *crlBroadcast) Finished()       {}

// crlState is the Node's part for revocation lists.
type crlState struct {
	queue *memberlist.TransmitLimitedQueue
	mu    sync.Mutex
	sent  uint64 // sequence number last queued or sent
	// refused by reason; logged at most once per crlLogEvery and reason.
	refused map[string]uint64
	logged  map[string]time.Time
	muted   map[string]uint64
}

const crlLogEvery = 10 * time.Second

// PublishCRL spreads the list the Trust holds now (a relay calls it after
// applying a newer list from its file). The relay that read it from its
// file also sends a list too large for a broadcast to every relay alive.
func (n *Node) PublishCRL() {
	n.spreadCRL(true)
}

func (n *Node) spreadCRL(origin bool) {
	n.mu.Lock()
	t := n.trust
	n.mu.Unlock()
	l := t.CRL()
	if l == nil {
		return
	}
	n.crl.mu.Lock()
	if l.Seq <= n.crl.sent {
		n.crl.mu.Unlock()
		return
	}
	n.crl.sent = l.Seq
	n.crl.mu.Unlock()
	msg := EncodeCRL(t.Authority(), l)
	switch {
	case len(msg) > MaxCRLGossip:
		n.log.Warn("roster: revocation list too large for gossip: copy it to every relay's crl_file", "seq", l.Seq, "serials", len(l.Serials), "bytes", len(msg), "max", MaxCRLGossip)
	case len(msg) <= MaxCRLBroadcast:
		n.crl.queue.QueueBroadcast(&crlBroadcast{msg: msg})
	case origin:
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			for _, m := range n.list.Members() {
				if m.Name == n.list.LocalNode().Name {
					continue
				}
				if err := n.list.SendReliable(m, msg); err != nil {
					n.log.Info("roster: sending the revocation list", "to", m.Name, "err", err)
				}
			}
		}()
	}
}

// receiveCRL handles a list from a peer (broadcast, TCP message or state
// exchange): a newer one of our authority is installed, passed on and
// reported (OnCRL); anything else is refused, logged and counted.
func (n *Node) receiveCRL(b []byte, via string) {
	n.mu.Lock()
	t := n.trust
	n.mu.Unlock()
	l, err := DecodeCRL(b, t.Authority())
	installed := false
	if err == nil {
		installed, err = t.Install(l)
	}
	if err != nil {
		n.refuseCRL(CRLReason(err), via, err)
		return
	}
	if !installed {
		return // the list held already
	}
	n.log.Info("roster: revocation list learned from gossip", "seq", l.Seq, "serials", len(l.Serials), "issued", l.Issued.Format(time.RFC3339), "via", via)
	n.spreadCRL(false)
	n.changed() // revoked relays leave Entries
	if n.cfg.OnCRL != nil {
		n.cfg.OnCRL(l)
	}
}

func (n *Node) refuseCRL(reason, via string, err error) {
	now := time.Now()
	n.crl.mu.Lock()
	n.crl.refused[reason]++
	log := now.Sub(n.crl.logged[reason]) >= crlLogEvery
	muted := n.crl.muted[reason]
	if log {
		n.crl.logged[reason] = now
		n.crl.muted[reason] = 0
	} else {
		n.crl.muted[reason]++
	}
	n.crl.mu.Unlock()
	if log {
		// A stale list is routine while a new one spreads (a state
		// exchange with a relay that has not got it yet): Info.
		lvl := n.log.Warn
		if reason == CRLStale {
			lvl = n.log.Info
		}
		lvl("roster: revocation list refused", "reason", reason, "via", via, "err", err, "not_logged_since", muted)
	}
	if n.cfg.OnCRLRefused != nil {
		n.cfg.OnCRLRefused(reason)
	}
}

// CRLRefused counts refused revocation lists by reason.
func (n *Node) CRLRefused() map[string]uint64 {
	n.crl.mu.Lock()
	defer n.crl.mu.Unlock()
	m := make(map[string]uint64, len(n.crl.refused))
	for k, v := range n.crl.refused {
		m[k] = v
	}
	return m
}

// localCRL is the push/pull state: the current list's message (nil: none,
// or too large).
func (n *Node) localCRL() []byte {
	n.mu.Lock()
	t := n.trust
	n.mu.Unlock()
	l := t.CRL()
	if l == nil {
		return nil
	}
	msg := EncodeCRL(t.Authority(), l)
	if len(msg) > MaxCRLGossip {
		return nil
	}
	return msg
}
