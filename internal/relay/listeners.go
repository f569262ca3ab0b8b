package relay

import (
	"hash/maphash"
	"net/netip"
	"time"
)

// bucket is a token bucket for per-member and per-address rate limits.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) take(now time.Time, rate float64, burst int) bool {
	if b.last.IsZero() {
		b.tokens = float64(burst)
	} else {
		b.tokens += now.Sub(b.last).Seconds() * rate
		if b.tokens > float64(burst) {
			b.tokens = float64(burst)
		}
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// addrLimiter bounds what unauthenticated packets cost per source address
// without state per address: a fixed table of token buckets indexed by a
// keyed hash of the address. Spoofed sources never grow it (a flood from
// any number of addresses costs the same memory) and spread over all
// buckets; a genuine source shares its bucket with the few that hash
// alike, which an attacker cannot choose (the key is random per start).
type addrLimiter struct {
	seed    maphash.Seed
	buckets []bucket
}

// addrBuckets: 16,384 buckets of 32 bytes (512 KiB). A flood of 20,000
// packets/s from 100,000+ sources puts ~1.2 packets/s on each, far below
// the per-address rate.
const addrBuckets = 1 << 14

func newAddrLimiter() *addrLimiter {
	return &addrLimiter{seed: maphash.MakeSeed(), buckets: make([]bucket, addrBuckets)}
}

func (l *addrLimiter) take(a netip.Addr, now time.Time, rate float64, burst int) bool {
	i := maphash.Comparable(l.seed, a) % uint64(len(l.buckets))
	return l.buckets[i].take(now, rate, burst)
}
