package agentd

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Pinger is a relay's control connection (relayconn.Conn); tests use
// fakes.
type Pinger interface {
	Do(ctx context.Context, req proto.Request) (proto.Reply, error)
}

// HandshakeFunc returns the time of a tunnel's last WireGuard handshake
// (zero: none yet) and whether the tunnel exists at all.
type HandshakeFunc func() (last time.Time, up bool, err error)

// RelayHealthConfig tunes a RelayHealth; zero values take the defaults.
type RelayHealthConfig struct {
	// Ping: a relay without an answer for this long is pinged (default
	// 30 s); PingTimeout bounds one ping (default 5 s).
	Ping, PingTimeout time.Duration
	// HandshakeStale: a tunnel whose last handshake is older (or that has
	// none this long after it came up) is "tunnel-no-handshake" (default
	// 3 min: WireGuard hand shakes every 2 min while it sends).
	HandshakeStale time.Duration
	// DeniedFor: how long a destination refused by policy is shown
	// (default 5 min; a later grant toward it clears it).
	DeniedFor time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

// maxDenied bounds the destinations remembered per relay.
const maxDenied = 8

// maxRelays bounds the relays tracked (configured and discovered).
const maxRelays = 64

type relayState struct {
	agent.RelayStatus
	// control: the state the control protocol's last outcome says (ok,
	// no-answer, unauthorized, revoked, refused); everOK: a success in
	// this run (an "unauthorized" after it is a revocation).
	control     string
	controlWhy  string
	lastAnswer  time.Time
	everOK      bool
	denied      map[netip.AddrPort]time.Time
	pinger      Pinger
	handshake   HandshakeFunc
	tunnelSince time.Time // when the agent first saw the tunnel up
	tunnelErr   string
}

// RelayHealth keeps each relay's state from the outcomes of the requests
// the agent makes anyway (grants, renewals: Observe), from pings when a
// relay has been silent (Run), and from the tunnels' handshakes; it logs
// one WARN per change to a bad state (and one per newly refused
// destination), one INFO back to ok.
type RelayHealth struct {
	cfg    RelayHealthConfig
	log    *slog.Logger
	mu     sync.Mutex
	relays map[string]*relayState
}

// NewRelayHealth tracks the named relays (more appear as they are
// observed, up to 64).
func NewRelayHealth(cfg RelayHealthConfig, log *slog.Logger, names ...string) *RelayHealth {
	if cfg.Ping <= 0 {
		cfg.Ping = 30 * time.Second
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = 5 * time.Second
	}
	if cfg.HandshakeStale <= 0 {
		cfg.HandshakeStale = 3 * time.Minute
	}
	if cfg.DeniedFor <= 0 {
		cfg.DeniedFor = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &RelayHealth{cfg: cfg, log: log, relays: map[string]*relayState{}}
	for _, n := range names {
		h.relay(n)
	}
	return h
}

// relay returns name's state (h.mu held), nil beyond maxRelays.
func (h *RelayHealth) relay(name string) *relayState {
	r := h.relays[name]
	if r == nil && len(h.relays) < maxRelays {
		r = &relayState{RelayStatus: agent.RelayStatus{Name: name, State: agent.RelayUnknown}, control: agent.RelayUnknown, denied: map[netip.AddrPort]time.Time{}}
		h.relays[name] = r
	}
	return r
}

// SetPinger makes Run ping the relay through p when it has been silent.
func (h *RelayHealth) SetPinger(name string, p Pinger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.relay(name); r != nil {
		r.pinger = p
	}
}

// SetTunnel makes the relay's tunnel handshake part of its state.
func (h *RelayHealth) SetTunnel(name string, f HandshakeFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.relay(name); r != nil {
		r.handshake, r.Tunnel = f, true
	}
}

// Observe records the outcome of one request to a relay (op: grant,
// renew, ping, tunnel...; server: the destination of a grant, or zero).
func (h *RelayHealth) Observe(name, op string, server netip.AddrPort, err error) {
	now := h.cfg.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.relay(name)
	if r == nil {
		return
	}
	if err == nil {
		r.control, r.controlWhy, r.LastSuccess, r.lastAnswer, r.everOK = agent.RelayOK, "", now, now, true
		if server.IsValid() {
			delete(r.denied, server)
		}
		h.update(r, now)
		return
	}
	r.LastError, r.LastErrorAt = op+": "+err.Error(), now
	reason := proto.ReasonOf(err)
	switch {
	case reason == proto.ReasonPolicyDenied:
		// An authenticated answer: the relay is there and knows us.
		r.lastAnswer = now
		if server.IsValid() {
			if _, known := r.denied[server]; !known {
				h.log.Warn("relay refuses a destination by its policy: no detour through it to that server",
					"relay", name, "server", server, "fix", "the relay's allow_destinations (private ranges, port 25, deny lists: docs/relay.md)")
			}
			if len(r.denied) >= maxDenied {
				oldest := netip.AddrPort{}
				for d, t := range r.denied {
					if !oldest.IsValid() || t.Before(r.denied[oldest]) {
						oldest = d
					}
				}
				delete(r.denied, oldest)
			}
			r.denied[server] = now
		}
	case reason == proto.ReasonUnauthorized && r.everOK, reason == proto.ReasonExpired:
		r.control, r.controlWhy = agent.RelayRevoked, "the relay accepted this member earlier and refuses it now: the member was removed or its certificate revoked or expired; ask the relay's operator"
	case reason == proto.ReasonUnauthorized:
		r.control, r.controlWhy = agent.RelayUnauthorized, "the relay does not know this member key: add it to the relay's members (or certify it)"
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "no handshake response"):
		r.control, r.controlWhy = agent.RelayNoAnswer, "check the relay's address, that it runs, that its UDP port is open on every firewall on the way, and that relays[].public_key is the relay's (a relay cannot answer a handshake made for another key)"
	case reason != proto.OK:
		r.control, r.controlWhy = agent.RelayRefused, reason.String()
		r.lastAnswer = now
	default:
		r.control, r.controlWhy = agent.RelayRefused, err.Error()
	}
	h.update(r, now)
}

// update recomputes r's state and logs a change (h.mu held).
func (h *RelayHealth) update(r *relayState, now time.Time) {
	for d, t := range r.denied {
		if now.Sub(t) > h.cfg.DeniedFor {
			delete(r.denied, d)
		}
	}
	state, why := r.control, r.controlWhy
	tunnelBad := r.Tunnel && r.tunnelErr != ""
	switch {
	case state == agent.RelayRevoked || state == agent.RelayUnauthorized || state == agent.RelayNoAnswer:
	case tunnelBad:
		state, why = agent.RelayNoHandshake, r.tunnelErr
	case len(r.denied) > 0:
		ds := make([]string, 0, len(r.denied))
		for d := range r.denied {
			ds = append(ds, d.String())
		}
		sort.Strings(ds)
		state, why = agent.RelayPolicyDenied, "refuses by policy: "+strings.Join(ds, ", ")+" (the relay's allow_destinations: docs/relay.md)"
	}
	old := r.State
	r.State, r.Detail = state, why
	if state == old {
		return
	}
	r.Since = now
	switch state {
	case agent.RelayOK:
		if old != agent.RelayUnknown {
			h.log.Info("relay answers again", "relay", r.Name, "was", old)
		}
	case agent.RelayPolicyDenied:
		// Logged per destination in Observe.
	default:
		h.log.Warn("relay trouble: its detours are not usable", "relay", r.Name, "state", state, "detail", why, "last_error", r.LastError)
	}
}

// check pings silent relays and reads tunnel handshakes; Run calls it
// every few seconds (tests call it with a fake clock).
func (h *RelayHealth) check(ctx context.Context) {
	now := h.cfg.Now()
	type ping struct {
		name string
		p    Pinger
	}
	var pings []ping
	h.mu.Lock()
	for _, r := range h.relays {
		if r.pinger != nil && now.Sub(r.lastAnswer) >= h.cfg.Ping && now.Sub(r.LastErrorAt) >= h.cfg.Ping {
			pings = append(pings, ping{r.Name, r.pinger})
		}
		if r.handshake != nil {
			h.tunnel(r, now)
		}
		h.update(r, now)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pings {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, h.cfg.PingTimeout)
			defer cancel()
			_, err := p.p.Do(pctx, proto.Request{Op: proto.OpPing})
			if ctx.Err() == nil {
				h.Observe(p.name, "ping", netip.AddrPort{}, err)
			}
		})
	}
	wg.Wait()
}

// tunnel reads r's handshake (h.mu held).
func (h *RelayHealth) tunnel(r *relayState, now time.Time) {
	last, up, err := r.handshake()
	r.LastHandshake = last
	switch {
	case err != nil:
		r.tunnelErr = "cannot read the tunnel: " + err.Error()
	case !up:
		r.tunnelSince = time.Time{}
		r.tunnelErr = "" // not up (yet): the tunnel source says why in its log
	default:
		if r.tunnelSince.IsZero() {
			r.tunnelSince = now
		}
		ref := last
		if ref.IsZero() {
			ref = r.tunnelSince
		}
		if now.Sub(ref) > h.cfg.HandshakeStale {
			age := "never"
			if !last.IsZero() {
				age = now.Sub(last).Round(time.Second).String() + " ago"
			}
			r.tunnelErr = "tunnel up but latest handshake " + age + ": the relay's WireGuard UDP port (tunnel.listen, 51820 by default) is closed on a firewall, or the relay lost the tunnel"
		} else {
			r.tunnelErr = ""
		}
	}
}

// Run checks every few seconds until ctx ends.
func (h *RelayHealth) Run(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		h.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Status returns every relay's state, by name.
func (h *RelayHealth) Status() []agent.RelayStatus {
	now := h.cfg.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]agent.RelayStatus, 0, len(h.relays))
	for _, r := range h.relays {
		h.update(r, now)
		out = append(out, r.RelayStatus)
	}
	slices.SortFunc(out, func(a, b agent.RelayStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}
