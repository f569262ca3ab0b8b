// Package lease is the relay's record of NAT mappings: who holds which
// (client address, detour port) -> server, until when, quotas per owner,
// the choice of a free port (never one the namespace listens on), and the
// Closing mappings whose counters are still being read. It is used from
// the relay's event loop only, so it has no locks; the kernel side is
// internal/relay/dataplane.
package lease

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
)

// Mapping is one granted NAT detour.
type Mapping struct {
	Key     dataplane.Key
	Server  netip.AddrPort
	Owner   Owner
	Granted time.Time
	Expires time.Time
	// UsageBytes is the count last written as a "usage" line.
	UsageBytes uint64
}

// DP is what the data plane needs of m.
func (m *Mapping) DP() dataplane.Mapping { return dataplane.Mapping{Key: m.Key, Server: m.Server} }

// Owner is who a mapping is attributed to: a member key, or for legacy v1
// (no identity) the client address.
type Owner struct {
	Key  proto.Key // zero for legacy v1
	Name string
}

type serverKey struct {
	Owner  proto.Key
	Client netip.Addr
	Server netip.AddrPort
}

// Table is the relay's record of mappings. It is used only from the
// server's event loop, so it has no locks.
type Table struct {
	ByKey    map[dataplane.Key]*Mapping
	byServer map[serverKey]*Mapping
	count    map[string]int // per owner quota accounting (member id, or v1 client)
	// Closing holds mappings whose DNAT element is gone but whose counter
	// has not been read yet; their ports stay taken until then.
	Closing map[dataplane.Key]Closed
	// lis: ports the namespace listens on, never handed out.
	lis listeners
}

type Closed struct {
	M         *Mapping
	Reason    string
	At        time.Time
	Seen      bool   // counter read at least once since closing
	LastBytes uint64 // its value then
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{
		ByKey:    map[dataplane.Key]*Mapping{},
		byServer: map[serverKey]*Mapping{},
		count:    map[string]int{},
		Closing:  map[dataplane.Key]Closed{},
	}
}

// LegacyOwner owns legacy v1 mappings (no identity: quotas are per client
// address).
var LegacyOwner = Owner{Name: "legacy-v1"}

// QuotaUsed is how many mappings count against o's quota: all of its
// member's (under any key), or a legacy v1 client address's.
func (t *Table) QuotaUsed(o Owner, client netip.Addr) int { return t.count[quotaKey(o, client)] }

// quotaKey is what a mapping counts against: its member (by name, so
// that all of a member's keys share one quota: a rotation or a second key
// gets no more mappings), or for legacy v1 its client address.
func quotaKey(o Owner, client netip.Addr) string {
	if o.Key.IsZero() {
		return "v1/" + client.String()
	}
	if o.Name == "" {
		return "key/" + o.Key.String()
	}
	return "member/" + o.Name
}

func (t *Table) Active() int { return len(t.ByKey) }

func (t *Table) Find(o Owner, client netip.Addr, server netip.AddrPort) *Mapping {
	return t.byServer[serverKey{o.Key, client, server}]
}

func (t *Table) Taken(k dataplane.Key) bool {
	if _, ok := t.ByKey[k]; ok {
		return true
	}
	_, ok := t.Closing[k]
	return ok
}

// PickPort returns the proposed port if usable, else a free one in
// [lo, hi]; ok=false when none is free. Ports the namespace listens on
// (TCP, read at most once a second) are never usable. With anywhere
// (legacy v1, whose clients expect the port they proposed back), a
// proposed port outside [lo, hi] is usable too if it is not privileged
// (>= 1024).
func (t *Table) PickPort(client netip.Addr, proposed, lo, hi uint16, anywhere bool, now time.Time) (uint16, bool) {
	free := func(p uint16) bool {
		return !t.Taken(dataplane.Key{Client: client, Port: p}) && !t.lis.has(p, now)
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

func (t *Table) Add(m *Mapping) {
	t.ByKey[m.Key] = m
	t.byServer[serverKey{m.Owner.Key, m.Key.Client, m.Server}] = m
	t.count[quotaKey(m.Owner, m.Key.Client)]++
}

// drop forgets a Mapping that never reached the kernel.
func (t *Table) Drop(m *Mapping) {
	delete(t.ByKey, m.Key)
	t.forgetServer(m)
	q := quotaKey(m.Owner, m.Key.Client)
	if t.count[q]--; t.count[q] <= 0 {
		delete(t.count, q)
	}
}

// remove moves a Mapping to Closing.
func (t *Table) Remove(m *Mapping, reason string, now time.Time) {
	delete(t.ByKey, m.Key)
	t.forgetServer(m)
	q := quotaKey(m.Owner, m.Key.Client)
	if t.count[q]--; t.count[q] <= 0 {
		delete(t.count, q)
	}
	t.Closing[m.Key] = Closed{M: m, Reason: reason, At: now}
}

// forgetServer deletes m's lookup entry if it is m's: after a key rotation
// a moved Mapping may share its (key, client, server) with a Mapping the
// new key held already, which keeps the entry (Table.rekey).
func (t *Table) forgetServer(m *Mapping) {
	sk := serverKey{m.Owner.Key, m.Key.Client, m.Server}
	if t.byServer[sk] == m {
		delete(t.byServer, sk)
	}
}

// expired returns mappings whose lease ended at or before now.
func (t *Table) Expired(now time.Time) []*Mapping {
	var out []*Mapping
	for _, m := range t.ByKey {
		if !m.Expires.After(now) {
			out = append(out, m)
		}
	}
	return out
}

// rekey gives old's live and Closing mappings to o; it returns the live ones.
func (t *Table) Rekey(old proto.Key, o Owner) []*Mapping {
	var moved []*Mapping
	for _, m := range t.ByKey {
		if m.Owner.Key != old {
			continue
		}
		sk := serverKey{m.Owner.Key, m.Key.Client, m.Server}
		if t.byServer[sk] == m {
			delete(t.byServer, sk)
		}
		q := quotaKey(m.Owner, m.Key.Client)
		if t.count[q]--; t.count[q] <= 0 {
			delete(t.count, q)
		}
		m.Owner = o
		nk := serverKey{o.Key, m.Key.Client, m.Server}
		if _, held := t.byServer[nk]; !held {
			t.byServer[nk] = m
		}
		t.count[quotaKey(o, m.Key.Client)]++
		moved = append(moved, m)
	}
	for _, c := range t.Closing {
		if c.M.Owner.Key == old {
			c.M.Owner = o // its last bytes are the new key's in the ledger
		}
	}
	return moved
}
