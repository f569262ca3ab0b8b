package breaks

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/roster"
)

const (
	// insiderWatch: how long the rosters are watched after each forgery.
	insiderWatch = 15 * time.Second
	// insiderBack: the case's bound for the live relay to be listed by
	// every relay again (its refutation wins; the roster unit test's
	// TestForgedDeadHighestIncarnation allows 15 s).
	insiderBack = 10 * time.Second
)

// forgedGossipInsider (break 2, the insider half): three relays in a
// gossip cluster with gossip.secret_file; a relay holding the secret (the
// attacker sends from the client node, sealing with the cluster's secret
// as a member relay could) sends one memberlist "dead" message at the
// highest incarnation (2^32-1) naming a live relay to each of the two
// others, and then one at 2^31-1 (the highest that is newer than a
// relay's small incarnation in serial arithmetic). The relays may believe
// it for a moment; the live relay hears of its death and refutes it, and
// the refutation must not be ignored. Target: every relay lists the live
// relay again within insiderBack of the forgery, and keeps it.
func forgedGossipInsider(ctx context.Context, o Options) Result {
	r := Result{Break: 2, Metric: "longest removal of the live relay, s", Target: fmt.Sprintf("back in every roster within %.0f s", insiderBack.Seconds())}
	l, keys, err := begin(ctx, o, "i", len(gossipNodes))
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	secretPath, member, _, err := l.gossipCluster(ctx, o, keys, true)
	if err != nil {
		return r.failed(err)
	}
	b, err := os.ReadFile(secretPath)
	if err != nil {
		return r.failed(err)
	}
	key, err := roster.ParseSecret(string(b))
	if err != nil {
		return r.failed(err)
	}
	victim, observers := gossipNodes[2], gossipNodes[:2]
	// Two forgeries, one after the other: at 2^32-1, the accusation that
	// removed a live relay for good before the fix (the patched memberlist
	// compares incarnations in serial arithmetic, so against a relay at a
	// small incarnation it is older and ignored), and at 2^31-1, the
	// highest incarnation that is newer than a relay's small one: that one
	// is believed until the victim refutes it.
	var parts []string
	r.Pass = true
	for _, inc := range []uint32{math.MaxUint32, 1<<31 - 1} {
		sealed, err := sealGossip(key, deadMessage(inc, member[victim], member[observers[1]]))
		if err != nil {
			return r.failed(err)
		}
		t0 := time.Now()
		if err := l.sendGossip(observers, sealed, 1); err != nil {
			return r.failed(fmt.Errorf("sending the forged message: %w", err))
		}
		v, pass, detail := watchRemoval(ctx, l, o.Binary, victim, observers, t0)
		r.Value, r.Pass = math.Max(r.Value, v), r.Pass && pass
		parts = append(parts, fmt.Sprintf("at incarnation %d: %s", inc, detail))
	}
	// The seals must have been accepted, or the case attacked nothing: a
	// relay logs gossip it cannot open (roster: "not sealed with this
	// cluster's gossip secret").
	for _, n := range observers {
		if b, err := os.ReadFile(filepath.Join(o.Dir, "relay-"+n+".log")); err != nil || bytes.Contains(b, []byte("not sealed with this cluster's gossip secret")) {
			return r.failed(fmt.Errorf("relay %s refused a sealed message as unauthenticated or has no log (%v): the forgery was not delivered", n, err))
		}
	}
	r.Detail = fmt.Sprintf("one dead message sealed with the cluster's gossip secret from the client node to each of %s about live %s, twice; %s", strings.Join(observers, ", "), victim, strings.Join(parts, "; "))
	return r
}

// watchRemoval samples the observers' rosters for insiderWatch after t0:
// per observer, the samples lacking victim and when it was listed again
// after the last one; then whether every relay of gossipNodes lists all
// three. It returns the longest removal (t0 to the sample that listed the
// victim again, s; 0 when none lacked it), whether it is within
// insiderBack with every roster full at the end, and what it saw.
func watchRemoval(ctx context.Context, l *caseLab, bin, victim string, observers []string, t0 time.Time) (float64, bool, string) {
	type seen struct {
		lacked     int
		lastLack   time.Duration
		back       time.Duration // first sample listing it after lastLack
		unanswered int
	}
	by := map[string]*seen{}
	for _, n := range observers {
		by[n] = &seen{back: -1}
	}
	samples := 0
	for time.Since(t0) < insiderWatch {
		samples++
		for _, n := range observers {
			names := rosterNames(ctx, l, bin, n)
			at := time.Since(t0)
			s := by[n]
			switch {
			case names == nil:
				s.unanswered++
			case !names[victim]:
				s.lacked++
				s.lastLack, s.back = at, -1
			case s.lacked > 0 && s.back < 0:
				s.back = at
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	full, counts := rostersFull(ctx, l, bin, gossipNodes)
	longest, removed, ok := 0.0, 0, full
	var parts []string
	for _, n := range observers {
		s := by[n]
		switch {
		case s.lacked == 0:
			parts = append(parts, fmt.Sprintf("%s kept it in every sample", n))
		case s.back < 0:
			removed++
			ok = false
			longest = math.Max(longest, insiderWatch.Seconds())
			parts = append(parts, fmt.Sprintf("%s lacked it in %d samples, last at %.2f s, not listed again by the end of the watch", n, s.lacked, s.lastLack.Seconds()))
		default:
			removed++
			longest = math.Max(longest, s.back.Seconds())
			ok = ok && s.back <= insiderBack
			parts = append(parts, fmt.Sprintf("%s lacked it in %d samples (last at %.2f s), listed it again at %.2f s", n, s.lacked, s.lastLack.Seconds(), s.back.Seconds()))
		}
		if s.unanswered > 0 {
			parts[len(parts)-1] += fmt.Sprintf(" (%d samples unanswered)", s.unanswered)
		}
	}
	detail := fmt.Sprintf("watched %s (%d samples): %d of %d relays removed it; %s; at the end every roster full: %v %v",
		insiderWatch, samples, removed, len(observers), strings.Join(parts, "; "), full, counts)
	return math.Round(longest*1000) / 1000, ok, detail
}

// sealGossip encrypts a memberlist packet as memberlist does with a
// secret key (encryption version 1: the version byte, a 12-byte nonce,
// AES-GCM, no label): what a relay holding the cluster's secret can send.
func sealGossip(key, msg []byte) ([]byte, error) {
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+12, 1+12+len(msg)+gcm.Overhead())
	out[0] = 1
	if _, err := rand.Read(out[1:13]); err != nil {
		return nil, err
	}
	return gcm.Seal(out, out[1:13], msg, nil), nil
}
