package pathcheck

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Filter wraps a detour.Source (the agent's relay grants, `path_check:
// true` in its config): every NAT detour the source hands out is probed
// once, in the background, with an MP_CAPABLE and an MP_JOIN SYN sent to
// the relay's address and port (no TTL sweep). A detour whose probe gets a
// plain SYN/ACK back has lost the MPTCP option on the way (a server that
// speaks MPTCP answers MP_CAPABLE with MP_CAPABLE and an unknown MP_JOIN
// token with a reset): its subflows could never join, so Detours withholds
// it from then on and Unusable reports it (status shows it unhealthy,
// "mptcp-stripped"). Tunnel detours pass unchecked: their options travel
// encrypted. A detour is used while its check is pending, and kept when
// the check cannot tell (no answer, no raw socket): the filter only ever
// removes detours it has evidence against.
type Filter struct {
	inner detour.Source
	check func(ctx context.Context, d detour.Detour) (stripped bool, detail string, err error)
	log   *slog.Logger

	mu       sync.Mutex
	state    map[netip.AddrPort]*verdictEntry // by the detour's relay address:port
	watching map[netip.AddrPort]bool          // servers whose grants Prepare waits for

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type verdictEntry struct {
	d        detour.Detour
	done     bool
	stripped bool
	detail   string
}

// FilterConfig configures NewFilter.
type FilterConfig struct {
	Netns string // the agent's namespace ("" = ours)
	Wait  time.Duration
	Log   *slog.Logger
}

// NewFilter wraps inner. Close stops the checks in flight.
func NewFilter(inner detour.Source, cfg FilterConfig) *Filter {
	if cfg.Wait <= 0 {
		cfg.Wait = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	f := &Filter{inner: inner, log: cfg.Log, state: map[netip.AddrPort]*verdictEntry{}, watching: map[netip.AddrPort]bool{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.check = func(ctx context.Context, d detour.Detour) (bool, string, error) {
		rep, err := Run(ctx, Options{Netns: cfg.Netns, NoTTL: true, Wait: cfg.Wait, Join: true,
			Paths: []Path{{Name: "nat:" + d.Relay, Kind: NAT, Dst: d.Remote}}})
		if err != nil {
			return false, "", err
		}
		stripped, detail := StrippedByAnswer(rep.Paths[0])
		return stripped, detail, nil
	}
	return f
}

// StrippedByAnswer says whether a path's final answers show the MPTCP
// option lost: a plain SYN/ACK to MP_CAPABLE or to MP_JOIN.
func StrippedByAnswer(p PathResult) (bool, string) {
	for _, pr := range p.Probes {
		if f := pr.Final; f != nil && f.Flags == "SA" && f.MPTCP == "" {
			return true, "mptcp-stripped: " + pr.Probe + " probe answered by a plain SYN/ACK"
		}
	}
	return false, ""
}

// Prepare passes on and watches the grants for server as they arrive, so
// that they are checked before the connection is established.
func (f *Filter) Prepare(server netip.AddrPort) {
	f.inner.Prepare(server)
	f.mu.Lock()
	if f.watching[server] { // one watcher per server, however many connections
		f.mu.Unlock()
		return
	}
	f.watching[server] = true
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer func() {
			f.mu.Lock()
			delete(f.watching, server)
			f.mu.Unlock()
		}()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		deadline := time.After(5 * time.Second)
		for {
			if f.startChecks(f.inner.Detours(server)) {
				return
			}
			select {
			case <-f.ctx.Done():
				return
			case <-deadline:
				return
			case <-tick.C:
			}
		}
	}()
}

// startChecks starts a check for every NAT detour not seen before; it
// says whether ds had any NAT detour.
func (f *Filter) startChecks(ds []detour.Detour) bool {
	any := false
	for _, d := range ds {
		if d.Kind != detour.NAT {
			continue
		}
		any = true
		f.mu.Lock()
		_, seen := f.state[d.Remote]
		if !seen {
			f.state[d.Remote] = &verdictEntry{d: d}
		}
		f.mu.Unlock()
		if seen {
			continue
		}
		f.wg.Add(1)
		go func(d detour.Detour) {
			defer f.wg.Done()
			stripped, detail, err := f.check(f.ctx, d)
			f.mu.Lock()
			e := f.state[d.Remote]
			if e != nil {
				e.done, e.stripped, e.detail = true, stripped, detail
			}
			f.mu.Unlock()
			switch {
			case err != nil && f.ctx.Err() == nil:
				f.log.Warn("path check failed, detour kept", "detour", d.String(), "err", err)
			case stripped:
				f.log.Warn("detour loses MPTCP options, not used (a tunnel detour from this relay keeps them: tunnels: true)", "detour", d.String(), "why", detail)
			default:
				f.log.Debug("path check: MPTCP options survive", "detour", d.String())
			}
		}(d)
	}
	return any
}

// Detours returns the inner source's detours less those found stripped.
func (f *Filter) Detours(server netip.AddrPort) []detour.Detour {
	ds := f.inner.Detours(server)
	f.startChecks(ds)
	out := ds[:0:0]
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range ds {
		if e := f.state[d.Remote]; d.Kind == detour.NAT && e != nil && e.stripped {
			continue
		}
		out = append(out, d)
	}
	return out
}

// Unusable says whether d was found to strip MPTCP options, and why.
func (f *Filter) Unusable(d detour.Detour) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.state[d.Remote]; d.Kind == detour.NAT && e != nil && e.stripped {
		return e.detail, true
	}
	return "", false
}

// Stripped lists the detours withheld (for status, which shows them
// unhealthy although the policy never sees them).
func (f *Filter) Stripped() []detour.Detour {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []detour.Detour
	for _, e := range f.state {
		if e.stripped {
			out = append(out, e.d)
		}
	}
	return out
}

// Release passes on to the inner source when it holds grants; a released
// grant's port may be handed out again, so its verdict is forgotten.
func (f *Filter) Release(ctx context.Context, server netip.AddrPort) error {
	ds := f.inner.Detours(server)
	f.mu.Lock()
	for _, d := range ds {
		if e := f.state[d.Remote]; e != nil && e.done {
			delete(f.state, d.Remote)
		}
	}
	f.mu.Unlock()
	if r, ok := f.inner.(detour.Releaser); ok {
		return r.Release(ctx, server)
	}
	return nil
}

// Refused passes on to the inner source (detour.Refuser): a refused
// detour's grant is asked again there.
func (f *Filter) Refused(server netip.AddrPort, d detour.Detour) {
	if r, ok := f.inner.(detour.Refuser); ok {
		r.Refused(server, d)
	}
}

// Close stops the checks in flight and waits for them.
func (f *Filter) Close() {
	f.cancel()
	f.wg.Wait()
}
