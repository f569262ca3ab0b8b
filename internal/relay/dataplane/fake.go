package dataplane

import (
	"net/netip"
	"sync"
)

// Fake is a DataPlane in memory, for tests of the relay without root:
// Map records mappings, counters are whatever the test sets (SetCounter),
// and FailMap makes the next Map fail as a kernel refusal would (nothing of
// the batch installed). Removed makes Exists report the table gone once (as
// after `nft flush ruleset`), until Recreate.
type Fake struct {
	mu       sync.Mutex
	mapped   map[Key]netip.AddrPort
	counters map[Key]Counter
	failMap  error
	gone     bool
	closed   bool
	// Recreated counts Recreate calls.
	Recreated int
	// Left: Leave was called (the table was left for the next start).
	Left bool
}

// NewFake returns an empty fake data plane.
func NewFake() *Fake {
	return &Fake{mapped: map[Key]netip.AddrPort{}, counters: map[Key]Counter{}}
}

// Mapped says whether k is mapped, and to which server.
func (f *Fake) Mapped(k Key) (netip.AddrPort, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.mapped[k]
	return s, ok
}

// Len is the number of mappings installed.
func (f *Fake) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mapped)
}

// SetCounter sets what the kernel "counted" on k.
func (f *Fake) SetCounter(k Key, c Counter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counters[k] = c
}

// FailMap makes the next Map return err.
func (f *Fake) FailMap(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failMap = err
}

// Remove simulates someone deleting the table: mappings are gone and
// Exists says false until Recreate.
func (f *Fake) Remove() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gone = true
	clear(f.mapped)
}

// Closed says whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Map implements DataPlane: all or nothing.
func (f *Fake) Map(ms []Mapping) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failMap; err != nil {
		f.failMap = nil
		return err
	}
	if f.gone {
		return errNoTable
	}
	// What the kernel tables refuse, the fake refuses too: all or none.
	for _, m := range ms {
		if err := checkMapping(m); err != nil {
			return err
		}
	}
	for _, m := range ms {
		f.mapped[m.Key] = m.Server
	}
	return nil
}

// Unmap implements DataPlane.
func (f *Fake) Unmap(keys []Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		delete(f.mapped, k)
	}
	return nil
}

// Counters implements DataPlane.
func (f *Fake) Counters() (map[Key]Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[Key]Counter, len(f.counters))
	for k, c := range f.counters {
		out[k] = c
	}
	return out, nil
}

// CountersOf implements DataPlane.
func (f *Fake) CountersOf(keys []Key) (map[Key]Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[Key]Counter, len(keys))
	for _, k := range keys {
		out[k] = f.counters[k]
	}
	return out, nil
}

// Forget implements DataPlane.
func (f *Fake) Forget(keys []Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		delete(f.counters, k)
	}
	return nil
}

// Exists implements DataPlane.
func (f *Fake) Exists() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.gone, nil
}

// Recreate implements DataPlane.
func (f *Fake) Recreate(ms []Mapping) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gone = false
	f.Recreated++
	clear(f.mapped)
	for _, m := range ms {
		f.mapped[m.Key] = m.Server
	}
	return nil
}

// Close implements DataPlane.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	clear(f.mapped)
	return nil
}

// Leave implements DataPlane: the mappings stay (Mapped still reports
// them), as the kernel keeps the table of a relay that left it.
func (f *Fake) Leave() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed, f.Left = true, true
	return nil
}

var _ DataPlane = (*Fake)(nil)

type fakeError string

func (e fakeError) Error() string { return string(e) }

const errNoTable = fakeError("fake data plane: the table was removed")
