// Package trust is the relay's trust part: the keys it answers for (and
// their cookie jars), the newest handshake timestamp of every member
// (replay protection, kept in state_file), the keys that presented a valid
// collective certificate, and the live collective trust (authority and the
// newest revocation list seen, from crl_file or gossip). It owns the live
// trust: a reload hands it the trust read from the file and it decides
// what stays (Reload). Used from the relay's event loop, except Keys,
// which the relay's reader calls concurrently.
package trust

import (
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Member is a key that presented a valid certificate.
type Member struct {
	Name      string
	Serial    uint64
	NotBefore time.Time // zero: issued at the beginning of time (revoked with any certificate of its name)
	NotAfter  time.Time
}

// State is the trust part's state.
type State struct {
	keys   atomic.Pointer[Keyring]
	LastTS map[proto.Key]proto.Timestamp
	replay *replayState // nil: LastTS lives in memory only
	// Certified: keys that presented a valid collective certificate.
	Certified map[proto.Key]Member
	CRLMod    time.Time         // modification time of the CRL file last read
	Live      *collective.Trust // nil: static members only
	// revokedNames: member name -> the latest not_before of a revoked
	// certificate of that name seen here. Revocation follows the member:
	// a certificate of the same name issued no later than a revoked one is
	// revoked too (the member's other keys); one issued later (a rotation
	// or re-issue after the revocation) is not.
	revokedNames map[string]time.Time
	crlSeen      *collective.RevocationList // the list revokedNames was last built from
}

// New is the trust part of a relay answering for cur (and prev, zero:
// none), with the collective trust live (nil: static members only).
func New(cur, prev proto.Key, live *collective.Trust) *State {
	t := &State{LastTS: map[proto.Key]proto.Timestamp{}, Certified: map[proto.Key]Member{}, Live: live}
	t.keys.Store(NewKeyring(cur, prev, nil))
	return t
}

// Keys is the current keyring (safe from any goroutine).
func (t *State) Keys() *Keyring { return t.keys.Load() }

// SetKeys answers for cur (and prev) from now on; a key kept keeps its
// cookie jar.
func (t *State) SetKeys(cur, prev proto.Key) {
	t.keys.Store(NewKeyring(cur, prev, t.keys.Load()))
}

// OpenReplay loads the replay state from path and writes it back at once:
// a state file that does not parse, or that cannot be written, is a
// start-up error, not a surprise at the first handshake.
func (t *State) OpenReplay(path string) error {
	if err := loadReplayState(path, t.LastTS); err != nil {
		return err
	}
	t.replay = &replayState{path: path, dirty: true}
	return t.replay.save(t.LastTS)
}

// SaveReplay writes the timestamps noted since the last save (no state
// file: nothing).
func (t *State) SaveReplay() error { return t.replay.save(t.LastTS) }

// NoteTimestamp records a member's accepted handshake timestamp (saved
// with the next SaveReplay).
func (t *State) NoteTimestamp(k proto.Key, ts proto.Timestamp) {
	t.LastTS[k] = ts
	if t.replay != nil {
		t.replay.dirty = true
	}
}

// CertifiedOK says whether key holds a certificate that is still valid.
func (t *State) CertifiedOK(key proto.Key, now time.Time) bool {
	cm, ok := t.Certified[key]
	if !ok || t.Live == nil {
		return false
	}
	if !now.Before(cm.NotAfter) || t.Live.Revoked(cm.Serial) {
		return false
	}
	t.noteRevokedNames()
	nb, revoked := t.revokedNames[cm.Name]
	return !revoked || cm.NotBefore.After(nb)
}

// noteRevokedNames records, once per new revocation list, the names of the
// certified keys whose certificate the list revokes. A revoked certificate
// this relay never saw has no name here: its serial alone is refused.
func (t *State) noteRevokedNames() {
	l := t.Live.CRL()
	if l == nil || l == t.crlSeen {
		return
	}
	t.crlSeen = l
	if t.revokedNames == nil {
		t.revokedNames = map[string]time.Time{}
	}
	for _, cm := range t.Certified {
		if !l.Revoked(cm.Serial) {
			continue
		}
		if nb, ok := t.revokedNames[cm.Name]; !ok || cm.NotBefore.After(nb) {
			t.revokedNames[cm.Name] = cm.NotBefore
		}
	}
}

// Reload takes the trust of a reloaded file (file, with its crl_file
// crlFile; oldCRLFile is the running one's). The same authority keeps the
// live trust, and with it the newest revocation list seen; another
// crl_file of the same authority starts from the new file's list unless the
// running one is newer; another authority (or none) replaces the live trust
// and forgets every certified key. It says whether the authority changed.
func (t *State) Reload(file *collective.Trust, crlFile, oldCRLFile string) (authorityChanged bool) {
	switch {
	case file == nil && t.Live == nil:
		return false
	case file != nil && t.Live != nil && file.Authority() == t.Live.Authority():
		if crlFile == oldCRLFile {
			return false // keeps the newest revocation list seen
		}
		// Another crl_file of the same authority: the newest list seen
		// (from the old file or gossip) stays if the new file's is older.
		if l := t.Live.CRL(); l != nil {
			_, _ = file.Install(l)
		}
		t.Live, t.CRLMod = file, time.Time{}
		return false
	default:
		// Another authority (or none): nobody is certified any more.
		t.Live, t.CRLMod = file, time.Time{}
		clear(t.Certified)
		t.revokedNames, t.crlSeen = nil, nil
		return true
	}
}
