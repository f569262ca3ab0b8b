package roster

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// Snapshot is the roster as members read it: the verified entries in
// roster order, each in its binary form, and the roster's digest, computed
// once when the roster changed and then shared by every read (instead of
// sorting, re-encoding and re-hashing every entry for each page request,
// O(N) per request). A Snapshot is immutable.
type Snapshot struct {
	Entries []*Entry
	Bytes   [][]byte // Entries[i]'s binary form (what it was learned as)
	Digest  uint64   // RosterDigest(Entries)

	// What it was built from: it is rebuilt when any of these moved.
	changes uint64
	crlSeq  uint64
	trust   any
	expires time.Time // the earliest certificate expiry among the entries
}

// Snapshot returns the current roster snapshot, building it only if the
// roster changed (an entry learned, updated or dropped), a newer
// revocation list or another authority applies, or an entry's
// certificate expired since the last one.
func (n *Node) Snapshot() *Snapshot {
	now := n.cfg.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var seq uint64
	if l := n.trust.CRL(); l != nil {
		seq = l.Seq
	}
	if s := n.snap; s != nil && s.changes == n.changes && s.crlSeq == seq && s.trust == any(n.trust) && now.Before(s.expires) {
		return s
	}
	s := &Snapshot{changes: n.changes, crlSeq: seq, trust: n.trust, expires: now.Add(24 * time.Hour)}
	type kv struct {
		e *Entry
		b []byte
	}
	all := make([]kv, 0, len(n.entries))
	for _, k := range n.entries {
		c := k.entry.Cert
		if now.Before(c.NotAfter) && !n.trust.Revoked(c.Serial) {
			all = append(all, kv{k.entry, k.meta})
			if c.NotAfter.Before(s.expires) {
				s.expires = c.NotAfter
			}
		}
	}
	slices.SortFunc(all, func(a, b kv) int { return compareEntries(a.e, b.e) })
	s.Entries, s.Bytes = make([]*Entry, len(all)), make([][]byte, len(all))
	for i, x := range all {
		s.Entries[i], s.Bytes[i] = x.e, x.b
	}
	s.Digest = RosterDigest(s.Entries)
	n.snap = s
	return s
}

// compareEntries is the roster order: by relay name, then key.
func compareEntries(a, b *Entry) int {
	if a.Name() != b.Name() {
		if a.Name() < b.Name() {
			return -1
		}
		return 1
	}
	return bytes.Compare(a.Cert.Member[:], b.Cert.Member[:])
}

// Page is the OpRoster reply for a request from start: at most
// proto.MaxRosterPage entries that fit proto.MaxReplyLen, in roster order;
// with hasDigest the digest too, and no entries when have equals it (the
// member's roster is current: ~60 bytes each way).
func (s *Snapshot) Page(start uint16, hasDigest bool, have uint64) proto.RosterPage {
	n := min(len(s.Bytes), 1<<16-1)
	p := proto.RosterPage{Total: uint16(n), Start: min(start, uint16(n))}
	size := 5 + 8
	if hasDigest {
		p.Digest = s.Digest
		if have == p.Digest {
			return p
		}
		size += 8
	}
	for _, b := range s.Bytes[p.Start:n] {
		if len(p.Entries) == proto.MaxRosterPage || size+2+len(b) > proto.MaxReplyLen {
			break
		}
		size += 2 + len(b)
		p.Entries = append(p.Entries, b)
	}
	return p
}

// RosterDigest fingerprints a roster: the first 8 bytes of SHA-256 over
// the entries' signatures in order (a signature covers everything an
// entry says, so equal digests mean equal rosters), never 0 (0 means "no
// digest" on the wire).
func RosterDigest(all []*Entry) uint64 {
	h := sha256.New()
	for _, e := range all {
		h.Write(e.Signature[:])
	}
	var sum [sha256.Size]byte
	d := binary.BigEndian.Uint64(h.Sum(sum[:0]))
	if d == 0 {
		d = 1
	}
	return d
}
