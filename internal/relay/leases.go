package relay

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
)

// mapping is one granted NAT detour.
type mapping struct {
	Key     dataplane.Key
	Server  netip.AddrPort
	Owner   owner
	Granted time.Time
	Expires time.Time
	// usageBytes is the count last written as a "usage" line.
	usageBytes uint64
}

// dp is what the data plane needs of m.
func (m *mapping) dp() dataplane.Mapping { return dataplane.Mapping{Key: m.Key, Server: m.Server} }

// owner is who a mapping is attributed to: a member key, or for legacy v1
// (no identity) the client address.
type owner struct {
	Key  proto.Key // zero for legacy v1
	Name string
}

type serverKey struct {
	Owner  proto.Key
	Client netip.Addr
	Server netip.AddrPort
}

// leaseTable is the relay's record of mappings. It is used only from the
// server's event loop, so it has no locks.
type leaseTable struct {
	byKey    map[dataplane.Key]*mapping
	byServer map[serverKey]*mapping
	count    map[string]int // per owner quota accounting (member id, or v1 client)
	// closing holds mappings whose DNAT element is gone but whose counter
	// has not been read yet; their ports stay taken until then.
	closing map[dataplane.Key]closed
	// lis: ports the namespace listens on, never handed out.
	lis listeners
}

type closed struct {
	m         *mapping
	reason    string
	at        time.Time
	seen      bool   // counter read at least once since closing
	lastBytes uint64 // its value then
}

func newLeaseTable() *leaseTable {
	return &leaseTable{
		byKey:    map[dataplane.Key]*mapping{},
		byServer: map[serverKey]*mapping{},
		count:    map[string]int{},
		closing:  map[dataplane.Key]closed{},
	}
}

func quotaKey(o owner, client netip.Addr) string {
	if o.Key.IsZero() {
		return "v1/" + client.String()
	}
	return o.Key.String()
}

func (t *leaseTable) active() int { return len(t.byKey) }

func (t *leaseTable) find(o owner, client netip.Addr, server netip.AddrPort) *mapping {
	return t.byServer[serverKey{o.Key, client, server}]
}

func (t *leaseTable) taken(k dataplane.Key) bool {
	if _, ok := t.byKey[k]; ok {
		return true
	}
	_, ok := t.closing[k]
	return ok
}

// pickPort returns the proposed port if usable, else a free one in
// [lo, hi]; ok=false when none is free. usable excludes ports the relay
// listens on. With anywhere (legacy v1, whose clients expect the port they
// proposed back), a proposed port outside [lo, hi] is usable too if it is
// not privileged (>= 1024).
func (t *leaseTable) pickPort(client netip.Addr, proposed, lo, hi uint16, anywhere bool, reserved func(uint16) bool) (uint16, bool) {
	free := func(p uint16) bool {
		return !t.taken(dataplane.Key{Client: client, Port: p}) && !reserved(p)
	}
	inRange := proposed >= lo && proposed <= hi || anywhere && proposed >= 1024
	if inRange && free(proposed) {
		return proposed, true
	}
	n := int(hi) - int(lo) + 1
	start := rand.IntN(n)
	for i := 0; i < n; i++ {
		p := uint16(int(lo) + (start+i)%n)
		if free(p) {
			return p, true
		}
	}
	return 0, false
}

func (t *leaseTable) add(m *mapping) {
	t.byKey[m.Key] = m
	t.byServer[serverKey{m.Owner.Key, m.Key.Client, m.Server}] = m
	t.count[quotaKey(m.Owner, m.Key.Client)]++
}

// drop forgets a mapping that never reached the kernel.
func (t *leaseTable) drop(m *mapping) {
	delete(t.byKey, m.Key)
	t.forgetServer(m)
	q := quotaKey(m.Owner, m.Key.Client)
	if t.count[q]--; t.count[q] <= 0 {
		delete(t.count, q)
	}
}

// remove moves a mapping to closing.
func (t *leaseTable) remove(m *mapping, reason string, now time.Time) {
	delete(t.byKey, m.Key)
	t.forgetServer(m)
	q := quotaKey(m.Owner, m.Key.Client)
	if t.count[q]--; t.count[q] <= 0 {
		delete(t.count, q)
	}
	t.closing[m.Key] = closed{m: m, reason: reason, at: now}
}

// forgetServer deletes m's lookup entry if it is m's: after a key rotation
// a moved mapping may share its (key, client, server) with a mapping the
// new key held already, which keeps the entry (leaseTable.rekey).
func (t *leaseTable) forgetServer(m *mapping) {
	sk := serverKey{m.Owner.Key, m.Key.Client, m.Server}
	if t.byServer[sk] == m {
		delete(t.byServer, sk)
	}
}

// expired returns mappings whose lease ended at or before now.
func (t *leaseTable) expired(now time.Time) []*mapping {
	var out []*mapping
	for _, m := range t.byKey {
		if !m.Expires.After(now) {
			out = append(out, m)
		}
	}
	return out
}
