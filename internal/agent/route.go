package agent

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// RouteSource looks up the namespace's own source address toward an
// address (RTM_GETROUTE, what `ip route get` does): the source of a
// cross-family NAT detour subflow (policy.Config.SourceFor). Answers are
// kept for a few seconds: the policy asks on every fill.
type RouteSource struct {
	mu    sync.Mutex
	h     *netlink.Handle
	cache map[netip.Addr]routeAnswer
	now   func() time.Time
}

type routeAnswer struct {
	src netip.Addr
	err error
	at  time.Time
}

const routeCacheFor = 5 * time.Second

// OpenRouteSource opens a route lookup in the namespace spec names.
func OpenRouteSource(spec string) (*RouteSource, error) {
	h, err := netnsx.NetlinkHandle(spec)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in namespace %q: %w", spec, err)
	}
	return &RouteSource{h: h, cache: map[netip.Addr]routeAnswer{}, now: time.Now}, nil
}

// SourceFor returns the source address the namespace's routes give toward dst.
func (r *RouteSource) SourceFor(dst netip.Addr) (netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if a, ok := r.cache[dst]; ok && now.Sub(a.at) < routeCacheFor {
		return a.src, a.err
	}
	if len(r.cache) > 4096 {
		clear(r.cache)
	}
	a := routeAnswer{at: now}
	routes, err := r.h.RouteGet(dst.AsSlice())
	switch {
	case err != nil:
		a.err = fmt.Errorf("route to %s: %w", dst, err)
	case len(routes) == 0 || routes[0].Src == nil:
		a.err = fmt.Errorf("route to %s: no source address", dst)
	default:
		src, ok := netip.AddrFromSlice(routes[0].Src)
		if !ok {
			a.err = fmt.Errorf("route to %s: bad source %v", dst, routes[0].Src)
		}
		a.src = src.Unmap()
	}
	r.cache[dst] = a
	return a.src, a.err
}

// Close releases the netlink socket.
func (r *RouteSource) Close() { r.h.Close() }
