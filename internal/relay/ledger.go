package relay

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

// ledgerEntry is one member's account.
type ledgerEntry struct {
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

// credit is StartCredit + Earned - Consumed (each capped at 2 EiB, far
// beyond any real count, so that the sum cannot overflow).
func (e *ledgerEntry) credit() int64 {
	if e == nil {
		return collective.StartCredit
	}
	const capBytes = math.MaxInt64 / 4
	return collective.StartCredit + int64(min(e.Earned, capBytes)) - int64(min(e.Consumed, capBytes))
}

// ledgerFile is the on-disk form.
type ledgerFile struct {
	Version int                     `json:"version"`
	Saved   time.Time               `json:"saved"`
	Members map[string]*ledgerEntry `json:"members"` // member public key (base64)
	// IssuedSeq is the sequence number of the last receipt this relay signed.
	IssuedSeq uint64 `json:"issued_seq"`
	// Windows: per issuer (relay key), the receipt sequence numbers accepted.
	Windows map[string]*collective.ReplayWindow `json:"windows,omitempty"`
	// Tunnel: per WireGuard peer, the rx+tx bytes already counted (the
	// device and its counters can outlive a relay restart).
	Tunnel map[string]uint64 `json:"tunnel,omitempty"`
}

const ledgerVersion = 1

type ledger struct {
	path    string // "" = memory only
	members map[proto.Key]*ledgerEntry
	seq     uint64
	windows map[proto.Key]*collective.ReplayWindow
	tunnel  map[proto.Key]uint64
	// mapSeen: bytes of each live or closing mapping already counted.
	mapSeen   map[*lease.Mapping]uint64
	dirty     bool
	saved     time.Time
	receipted time.Time // when receipts were last issued
}

func newLedger(path string) *ledger {
	return &ledger{path: path, members: map[proto.Key]*ledgerEntry{}, windows: map[proto.Key]*collective.ReplayWindow{},
		tunnel: map[proto.Key]uint64{}, mapSeen: map[*lease.Mapping]uint64{}}
}

// loadLedger reads path; a missing file is a first start, one that does not
// parse is an error naming it (the relay refuses to start rather than
// forget credit and accepted receipts).
func loadLedger(path string) (*ledger, error) {
	l := newLedger(path)
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
	var f ledgerFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("ledger file %s: %v (move it away to start with an empty ledger)", path, err)
	}
	if f.Version != ledgerVersion {
		return nil, fmt.Errorf("ledger file %s: version %d, this relay reads %d", path, f.Version, ledgerVersion)
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
		l.members[k] = e
	}
	for s, w := range f.Windows {
		k, err := parse("issuer", s)
		if err != nil {
			return nil, err
		}
		if w == nil {
			return nil, fmt.Errorf("ledger file %s: issuer %s: null window", path, s)
		}
		l.windows[k] = w
	}
	for s, n := range f.Tunnel {
		k, err := parse("tunnel peer", s)
		if err != nil {
			return nil, err
		}
		l.tunnel[k] = n
	}
	l.seq, l.saved = f.IssuedSeq, f.Saved
	return l, nil
}

// save writes the ledger if it changed since the last save.
func (l *ledger) save(now time.Time) error {
	if l.path == "" || !l.dirty {
		return nil
	}
	f := ledgerFile{Version: ledgerVersion, Saved: now.UTC(), Members: map[string]*ledgerEntry{}, IssuedSeq: l.seq,
		Windows: map[string]*collective.ReplayWindow{}, Tunnel: map[string]uint64{}}
	for k, e := range l.members {
		f.Members[k.String()] = e
	}
	for k, w := range l.windows {
		f.Windows[k.String()] = w
	}
	for k, n := range l.tunnel {
		f.Tunnel[k.String()] = n
	}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	if _, err := writeFileAtomic(l.path, append(b, '\n')); err != nil {
		return fmt.Errorf("ledger file: %w", err)
	}
	l.dirty, l.saved = false, now
	return nil
}

// writeFileAtomic replaces path with b: temporary file, fsync, rename,
// fsync of the directory (what replayState.save does).
// writeFileAtomic writes b to path atomically and returns the new file's
// modification time, taken before the rename (after it, a writer racing
// in could be the one stat'ed).
func writeFileAtomic(path string, b []byte) (time.Time, error) {
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

func (l *ledger) entry(k proto.Key, name string) *ledgerEntry {
	e := l.members[k]
	if e == nil {
		e = &ledgerEntry{Name: name}
		l.members[k] = e
	}
	if name != "" {
		e.Name = name
	}
	return e
}

// consumed adds n bytes relayed for member k.
func (l *ledger) consumed(k proto.Key, name string, n uint64, now time.Time, receipts bool) {
	if n == 0 || k.IsZero() {
		return
	}
	e := l.entry(k, name)
	e.Consumed += n
	if receipts {
		if e.Unreceipted == 0 {
			e.UnreceiptedSince = now.UTC()
		}
		e.Unreceipted += n
	}
	e.Updated = now.UTC()
	l.dirty = true
}

// mapping counts what a mapping's counter moved since it was last seen.
// A counter below the last value was reset (the table was recreated): all
// of it is new.
func (l *ledger) mapping(m *lease.Mapping, cur uint64, now time.Time, receipts bool) {
	if m.Owner.Key.IsZero() {
		return // legacy v1: no member to account to
	}
	seen := l.mapSeen[m]
	if cur == 0 && seen > 0 {
		return // no reading (the element was missing), not a reset: keep what was seen
	}
	delta := cur - seen
	if cur < seen {
		delta = cur
	}
	l.mapSeen[m] = cur
	l.consumed(m.Owner.Key, m.Owner.Name, delta, now, receipts)
}

// tunnelPeer counts a WireGuard peer's rx+tx since it was last seen.
func (l *ledger) tunnelPeer(k proto.Key, name string, cur uint64, now time.Time, receipts bool) {
	seen, ok := l.tunnel[k]
	delta := cur - seen
	if cur < seen {
		delta = cur // the peer was re-added: its counters restarted
	}
	if !ok || cur != seen {
		l.tunnel[k] = cur
		l.dirty = true
	}
	l.consumed(k, name, delta, now, receipts)
}
