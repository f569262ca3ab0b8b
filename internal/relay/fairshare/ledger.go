// Package fairshare is the relay's fair-sharing ledger: the relay's
// per-member account (docs/collective.md, "Fair sharing"). The relay core
// (internal/relay, fair.go) owns the admission hook and receipts around it.
//
// The ledger is the relay's per-member account for fair sharing
// (docs/collective.md, "Fair sharing"): the bytes it relayed for each member
// (Consumed: the kernel's counters of the member's NAT mappings, its
// WireGuard peer's bytes and its converted connections, counted as deltas
// so nothing is counted twice), and the bytes the member's own relay
// relayed for others according to the receipts it presented (Earned). A
// member's credit here is StartCredit + Earned - Consumed.
//
// It is written to its file (temporary file, fsync, rename, like the
// state file) every attribution_flush and on shutdown, so a kill -9 loses
// at most one flush period of counting. The file also holds what must not
// go back after a restart: the sequence number of the last receipt this
// relay signed and, per issuer, the receipt sequence numbers accepted.
package fairshare

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/lease"
)

// Entry is one member's account.
type Entry struct {
	Name     string `json:"name"`
	Consumed uint64 `json:"consumed"` // bytes relayed here for the member
	Earned   uint64 `json:"earned"`   // bytes in receipts accepted from the member's relay
	Receipts uint64 `json:"receipts"` // receipts accepted
	// Unreceipted: consumed bytes not in a receipt of this relay yet
	// (fair_share.receipts_file), counted since UnreceiptedSince.
	Unreceipted      uint64    `json:"unreceipted,omitempty"`
	UnreceiptedSince time.Time `json:"unreceipted_since,omitzero"`
	Updated          time.Time `json:"updated"`
}

// Credit is StartCredit + Earned - Consumed (each capped at 2 EiB, far
// beyond any real count, so that the sum cannot overflow).
func (e *Entry) Credit() int64 {
	if e == nil {
		return collective.StartCredit
	}
	const capBytes = math.MaxInt64 / 4
	return collective.StartCredit + int64(min(e.Earned, capBytes)) - int64(min(e.Consumed, capBytes))
}

// File is the on-disk form.
type File struct {
	Version int               `json:"version"`
	Saved   time.Time         `json:"saved"`
	Members map[string]*Entry `json:"members"` // member public key (base64)
	// IssuedSeq is the sequence number of the last receipt this relay signed.
	IssuedSeq uint64 `json:"issued_seq"`
	// Windows: per issuer (relay key), the receipt sequence numbers accepted.
	Windows map[string]*collective.ReplayWindow `json:"windows,omitempty"`
	// Tunnel: per WireGuard peer, the rx+tx bytes already counted (the
	// device and its counters can outlive a relay restart).
	Tunnel map[string]uint64 `json:"tunnel,omitempty"`
}

// Version is the ledger file's format.
const Version = 1

// Ledger is the per-member account (event loop only).
type Ledger struct {
	Path    string // "" = memory only
	Members map[proto.Key]*Entry
	Seq     uint64
	Windows map[proto.Key]*collective.ReplayWindow
	Tunnel  map[proto.Key]uint64
	// MapSeen: bytes of each live or closing mapping already counted.
	MapSeen   map[*lease.Mapping]uint64
	Dirty     bool
	Saved     time.Time
	Receipted time.Time // when receipts were last issued
}

// NewLedger is an empty ledger kept in path ("": memory only).
func NewLedger(path string) *Ledger {
	return &Ledger{Path: path, Members: map[proto.Key]*Entry{}, Windows: map[proto.Key]*collective.ReplayWindow{},
		Tunnel: map[proto.Key]uint64{}, MapSeen: map[*lease.Mapping]uint64{}}
}

// Load reads path; a missing file is a first start, one that does not
// parse is an error naming it (the relay refuses to start rather than
// forget credit and accepted receipts).
func Load(path string) (*Ledger, error) {
	l := NewLedger(path)
	if path == "" {
		return l, nil
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger file: %w", err)
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("ledger file %s: %v (move it away to start with an empty ledger)", path, err)
	}
	if f.Version != Version {
		return nil, fmt.Errorf("ledger file %s: version %d, this relay reads %d", path, f.Version, Version)
	}
	parse := func(what, s string) (proto.Key, error) {
		k, err := proto.ParseKey(s)
		if err != nil {
			return k, fmt.Errorf("ledger file %s: %s %q: %v", path, what, s, err)
		}
		return k, nil
	}
	for s, e := range f.Members {
		k, err := parse("member", s)
		if err != nil {
			return nil, err
		}
		if e == nil {
			return nil, fmt.Errorf("ledger file %s: member %s: null entry", path, s)
		}
		l.Members[k] = e
	}
	for s, w := range f.Windows {
		k, err := parse("issuer", s)
		if err != nil {
			return nil, err
		}
		if w == nil {
			return nil, fmt.Errorf("ledger file %s: issuer %s: null window", path, s)
		}
		l.Windows[k] = w
	}
	for s, n := range f.Tunnel {
		k, err := parse("tunnel peer", s)
		if err != nil {
			return nil, err
		}
		l.Tunnel[k] = n
	}
	l.Seq, l.Saved = f.IssuedSeq, f.Saved
	return l, nil
}

// Save writes the ledger if it changed since the last save.
func (l *Ledger) Save(now time.Time) error {
	if l.Path == "" || !l.Dirty {
		return nil
	}
	f := File{Version: Version, Saved: now.UTC(), Members: map[string]*Entry{}, IssuedSeq: l.Seq,
		Windows: map[string]*collective.ReplayWindow{}, Tunnel: map[string]uint64{}}
	for k, e := range l.Members {
		f.Members[k.String()] = e
	}
	for k, w := range l.Windows {
		f.Windows[k.String()] = w
	}
	for k, n := range l.Tunnel {
		f.Tunnel[k.String()] = n
	}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	if _, err := WriteFileAtomic(l.Path, append(b, '\n')); err != nil {
		return fmt.Errorf("ledger file: %w", err)
	}
	l.Dirty, l.Saved = false, now
	return nil
}

// WriteFileAtomic replaces path with b: temporary file, fsync, rename,
// fsync of the directory (as the replay state file is written). It
// returns the new file's modification time, taken before the rename
// (after it, a writer racing in could be the one stat'ed). The relay also
// writes crl_file with it.
func WriteFileAtomic(path string, b []byte) (time.Time, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return time.Time{}, err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return time.Time{}, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return time.Time{}, err
	}
	if err := tmp.Close(); err != nil {
		return time.Time{}, err
	}
	fi, err := os.Stat(tmp.Name())
	if err != nil {
		return time.Time{}, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return time.Time{}, err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return fi.ModTime(), nil
}

// Entry is k's account, created (named name) if it has none.
func (l *Ledger) Entry(k proto.Key, name string) *Entry {
	e := l.Members[k]
	if e == nil {
		e = &Entry{Name: name}
		l.Members[k] = e
	}
	if name != "" {
		e.Name = name
	}
	return e
}

// AddConsumed adds n bytes relayed for member k.
func (l *Ledger) AddConsumed(k proto.Key, name string, n uint64, now time.Time, receipts bool) {
	if n == 0 || k.IsZero() {
		return
	}
	e := l.Entry(k, name)
	e.Consumed += n
	if receipts {
		if e.Unreceipted == 0 {
			e.UnreceiptedSince = now.UTC()
		}
		e.Unreceipted += n
	}
	e.Updated = now.UTC()
	l.Dirty = true
}

// AddMapping counts what a mapping's counter moved since it was last seen.
// A counter below the last value was reset (the table was recreated): all
// of it is new.
func (l *Ledger) AddMapping(m *lease.Mapping, cur uint64, now time.Time, receipts bool) {
	if m.Owner.Key.IsZero() {
		return // legacy v1: no member to account to
	}
	seen := l.MapSeen[m]
	if cur == 0 && seen > 0 {
		return // no reading (the element was missing), not a reset: keep what was seen
	}
	delta := cur - seen
	if cur < seen {
		delta = cur
	}
	l.MapSeen[m] = cur
	l.AddConsumed(m.Owner.Key, m.Owner.Name, delta, now, receipts)
}

// TunnelPeer counts a WireGuard peer's rx+tx since it was last seen.
func (l *Ledger) TunnelPeer(k proto.Key, name string, cur uint64, now time.Time, receipts bool) {
	seen, ok := l.Tunnel[k]
	delta := cur - seen
	if cur < seen {
		delta = cur // the peer was re-added: its counters restarted
	}
	if !ok || cur != seen {
		l.Tunnel[k] = cur
		l.Dirty = true
	}
	l.AddConsumed(k, name, delta, now, receipts)
}

// Merge adds old's account to successor's and forgets old's.
func (l *Ledger) Merge(old, successor proto.Key, name string) {
	e := l.Members[old]
	if e == nil {
		return
	}
	n := l.Entry(successor, name)
	n.Consumed += e.Consumed
	n.Earned += e.Earned
	n.Receipts += e.Receipts
	if e.Unreceipted > 0 && (n.Unreceipted == 0 || e.UnreceiptedSince.Before(n.UnreceiptedSince)) {
		n.UnreceiptedSince = e.UnreceiptedSince
	}
	n.Unreceipted += e.Unreceipted
	if e.Updated.After(n.Updated) {
		n.Updated = e.Updated
	}
	delete(l.Members, old)
	l.Dirty = true
}

// TunnelMoved: the WireGuard peer of old is now successor's, a new peer
// whose counters start at zero.
func (l *Ledger) TunnelMoved(old, successor proto.Key) {
	delete(l.Tunnel, old)
	l.Tunnel[successor] = 0
	l.Dirty = true
}
