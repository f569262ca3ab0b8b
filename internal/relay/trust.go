package relay

import (
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// trustState is the relay's trust part: the keys it answers for, the
// newest handshake timestamp of every member (replay protection, kept in
// state_file), the keys that presented a valid collective certificate, and
// the live collective trust (authority and the newest revocation list
// seen, from crl_file or gossip). It owns the live trust: a reload hands it
// the trust read from the file and it decides what stays (reload).
type trustState struct {
	keys   atomic.Pointer[keyring] // current and previous key (keys.go); read by the reader too
	lastTS map[proto.Key]proto.Timestamp
	state  *replayState // nil: lastTS lives in memory only
	// certified: keys that presented a valid collective certificate.
	certified map[proto.Key]certMember
	crlMod    time.Time         // modification time of the CRL file last read
	live      *collective.Trust // nil: static members only
}

func newTrustState(set *Reloadable) *trustState {
	t := &trustState{lastTS: map[proto.Key]proto.Timestamp{}, certified: map[proto.Key]certMember{}, live: set.Trust}
	t.keys.Store(newKeyring(set.PrivateKey, set.PreviousKey, nil))
	return t
}

// reload takes the trust of a reloaded file (file, with its crl_file
// crlFile; oldCRLFile is the running one's). The same authority keeps the
// live trust, and with it the newest revocation list seen; another
// crl_file of the same authority starts from the new file's list unless the
// running one is newer; another authority (or none) replaces the live trust
// and forgets every certified key. It says whether the authority changed.
func (t *trustState) reload(file *collective.Trust, crlFile, oldCRLFile string) (authorityChanged bool) {
	switch {
	case file == nil && t.live == nil:
		return false
	case file != nil && t.live != nil && file.Authority() == t.live.Authority():
		if crlFile == oldCRLFile {
			return false // keeps the newest revocation list seen
		}
		// Another crl_file of the same authority: the newest list seen
		// (from the old file or gossip) stays if the new file's is older.
		if l := t.live.CRL(); l != nil {
			_, _ = file.Install(l)
		}
		t.live, t.crlMod = file, time.Time{}
		return false
	default:
		// Another authority (or none): nobody is certified any more.
		t.live, t.crlMod = file, time.Time{}
		clear(t.certified)
		return true
	}
}

// noteTimestamp records a member's accepted handshake timestamp (saved
// with the batch when there is a state file).
func (t *trustState) noteTimestamp(k proto.Key, ts proto.Timestamp) {
	t.lastTS[k] = ts
	if t.state != nil {
		t.state.dirty = true
	}
}
