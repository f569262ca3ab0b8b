package agent

import (
	"net/netip"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// syncPolicy serialises the event loop's calls with status queries, so a
// Policy implementation never needs its own locking.
type syncPolicy struct {
	mu sync.Mutex
	p  policy.Policy
}

func (s *syncPolicy) Created(c policy.Conn) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Created(c)
}

func (s *syncPolicy) Established(c policy.Conn) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Established(c)
}

func (s *syncPolicy) Closed(token uint32) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Closed(token)
}

func (s *syncPolicy) Announced(token uint32, id uint8, addr netip.AddrPort) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Announced(token, id, addr)
}

func (s *syncPolicy) Removed(token uint32, id uint8) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Removed(token, id)
}

func (s *syncPolicy) SubflowEstablished(sf policy.Subflow) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.SubflowEstablished(sf)
}

func (s *syncPolicy) SubflowClosed(sf policy.Subflow) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.SubflowClosed(sf)
}

func (s *syncPolicy) Priority(sf policy.Subflow) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Priority(sf)
}

func (s *syncPolicy) Stalled(sf policy.Subflow) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Stalled(sf)
}

func (s *syncPolicy) Failed(in policy.Intent, err error) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Failed(in, err)
}

func (s *syncPolicy) Adopt(c policy.Conn, sfs []policy.Subflow) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Adopt(c, sfs)
}

func (s *syncPolicy) Tick(now time.Time) []policy.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p.Tick(now)
}

// backoff asks the policy, if it tracks detour health, until when d is avoided.
func (s *syncPolicy) backoff(d detour.Detour) time.Time {
	b, ok := s.p.(interface{ Backoff(detour.Detour) time.Time })
	if !ok {
		return time.Time{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return b.Backoff(d)
}
