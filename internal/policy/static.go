package policy

import (
	"fmt"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// static keeps N detour subflows per connection in the sources' order
// (fewest recent failures first), every one active; the engine replaces
// refused ones with backoff. From the measurements it only closes a detour
// subflow whose path went silent (StallRetransmits consecutive
// retransmission timeouts) and replaces it.
type static struct{ e *Engine }

func (*static) name() string                                     { return Static.String() }
func (*static) prefer(*kconn, detour.Detour, detour.Detour) bool { return false }
func (*static) joinAsBackup(*kconn, detour.Detour) bool          { return false }
func (*static) gone(*kconn, subKey)                              {}

func (st *static) measured(k *kconn, now time.Time) []Intent {
	var out []Intent
	for _, s := range k.subs {
		if s.d == nil || !s.up || s.stale || s.probedAt != now || int(s.m.Retransmits) < st.e.cfg.StallRetransmits {
			continue
		}
		out = append(out, st.e.stalled(k, s, s.m, fmt.Sprintf("subflow stalled: %d retransmission timeouts", s.m.Retransmits))...)
	}
	return append(out, st.e.sharedMeasured(k, now)...)
}

// destroyFailed: the kernel refused to destroy a detour subflow the
// shared rule took out (the engine undid the eviction): the rule judges
// the pair again.
func (st *static) destroyFailed(k *kconn, s *ksub, _ error, _ time.Time) []Intent {
	if k.sbd != nil && k.sbd.benched == nil && st.e.sharedRefused(k) {
		s.decision += ", judged again"
	}
	return nil
}
