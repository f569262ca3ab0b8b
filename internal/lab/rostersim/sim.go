// Package rostersim runs many relays of a collective in one process over
// memberlist with an in-process network, to measure roster convergence,
// gossip cost and failure detection at sizes no lab reaches (issue 30;
// docs/results/roster). Test apparatus: it lives outside the product's
// packages and uses only internal/roster's exported API.
package rostersim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// The simulation runs many relays in one process over memberlist with an
// in-process network (simNet) instead of UDP/TCP sockets, to measure how
// the roster converges and what gossip costs per relay at a scale no lab
// reaches (1,000 relays). Everything but the network is the
// product's code path: Node, signed entries, memberlist's SWIM.
//
// memberlist ships a MockNetwork, but its unbuffered channels block a
// sender forever once the receiver has stopped, so a killed relay would
// hang the others; simNet is a lossy datagram network (a full queue drops,
// like a socket buffer) whose dead nodes drop packets and refuse streams,
// and which counts bytes.

// SimConfig configures Simulate.
type SimConfig struct {
	Relays        int
	Kill          int           // relays killed (no leave) after convergence
	JoinRate      float64       // relays started per (simulated) second (0: as fast as possible)
	Window        time.Duration // steady-state bandwidth measurement, simulated time (default 10 s)
	Settle        time.Duration // wait after convergence before measuring, simulated time (default 15 s: gossip queues drain)
	Timeout       time.Duration // for each phase, wall-clock time (default 5 min)
	ProbeInterval time.Duration // defaults as roster.Config; simulated time
	ProbeTimeout  time.Duration
	SuspicionMult int
	// Tuning, as roster.Config (0: the relays' defaults).
	SuspicionMaxTimeoutMult int
	GossipNodes             int
	GossipInterval          time.Duration // simulated time
	PushPullInterval        time.Duration // simulated time
	RetransmitMult          int
	// TimeScale K dilates time (Config.TimeScale): every memberlist and
	// Node interval and timeout, the join rate's period, Settle and Window
	// run K times slower on the wall clock; SimResult has the wall-clock
	// measurements, its Sim* methods divide them by K. 0: 1.
	TimeScale float64
	// VerifyEach: every relay verifies every entry itself (default: one
	// verification per distinct entry, shared, see SimResult.Verified).
	VerifyEach bool
	Progress   io.Writer // progress lines (nil: none)
}

// SimResult is what Simulate measured. Durations and rates are on the
// wall clock of the (dilated) run; the Sim* methods convert them to the
// simulated time, dividing durations by TimeScale.
type SimResult struct {
	Relays      int
	TimeScale   float64
	StartTime   time.Duration // starting every relay (each joins an earlier one)
	Convergence time.Duration // from the last start until every roster lists every relay (0: not within Timeout)
	// Complete50/90/99: until 50, 90, 99 % of the rosters listed every
	// relay (0: not reached); Known: the share of all entries the rosters
	// held at the end of the phase (1 when converged); Incomplete: rosters
	// still incomplete after Timeout.
	Complete50, Complete90, Complete99 time.Duration
	Known                              float64
	Incomplete                         int
	BytesPerRelay                      float64 // gossip bytes sent per relay until convergence, or Timeout (join cost)
	SteadyBps                          float64 // gossip bytes sent per relay per wall-clock second in steady state
	SteadyPps                          float64 // datagrams sent per relay per wall-clock second in steady state
	Killed                             int
	KillDetection                      time.Duration // from the kill until no live roster lists a killed relay
	KillDetectFirst                    time.Duration // until the first live roster dropped all killed relays
	Dropped                            uint64        // datagrams dropped by full queues (loss)
	Verified                           uint64        // signature verifications done
	FalseRemovals                      uint64        // live relays missing from a live roster after convergence (flapping)
	CRLSpread                          time.Duration // a revocation list given to one relay: until every relay applied it
	// One more relay joins the converged collective: until 99.9 % of the
	// other rosters list it, and all of them (0: not within Timeout).
	JoinOne999, JoinOneAll time.Duration
	HeapPerRelay           float64 // live heap after a GC in steady state / relays (bytes; includes the simulated network)
	// SteadySeries: bytes sent per relay per wall-clock second in
	// consecutive slices of SeriesSlice over Settle and Window (the decay
	// of the join's retransmissions, the state syncs' spikes).
	SteadySeries []float64
	SeriesSlice  time.Duration
}

// Summary is the machine-readable form of a run (docs/results/roster/
// sim-<N>-<name>.json): durations in simulated seconds (null: not
// reached), rates per simulated second.
type Summary struct {
	Name                    string   `json:"name"`
	Relays                  int      `json:"relays"`
	TimeScale               float64  `json:"time_scale"`
	Settings                any      `json:"settings"`
	StartS                  float64  `json:"start_s"`
	AllRostersCompleteS     *float64 `json:"all_rosters_complete_s"`
	Complete50S             *float64 `json:"rosters_complete_50_s"`
	Complete90S             *float64 `json:"rosters_complete_90_s"`
	Complete99S             *float64 `json:"rosters_complete_99_s"`
	KnownShare              float64  `json:"known_share"`
	JoinCostKiB             float64  `json:"join_cost_per_relay_kib"`
	SteadyBytesPerS         float64  `json:"steady_bytes_per_s_per_relay"`
	SteadyDatagramsPerS     float64  `json:"steady_datagrams_per_s_per_relay"`
	HeapPerRelayKiB         float64  `json:"heap_per_relay_kib"`
	CRLOnEveryRelayS        *float64 `json:"crl_on_every_relay_s"`
	JoinedIn999PctS         *float64 `json:"joined_relay_in_99_9_pct_of_rosters_s"`
	JoinedInAllS            *float64 `json:"joined_relay_in_all_rosters_s"`
	Killed                  int      `json:"killed"`
	KilledOutOfFirstRosterS *float64 `json:"killed_out_of_first_roster_s"`
	KilledOutOfEveryRosterS *float64 `json:"killed_out_of_every_roster_s"`
	FalseRemovals           uint64   `json:"false_removals"`
	DatagramsDropped        uint64   `json:"datagrams_dropped"`
	// SteadySeriesBytesPerS: bytes per simulated second per relay in
	// slices of SeriesSliceS simulated seconds from the end of the
	// convergence phase (settle, then window).
	SeriesSliceS          float64   `json:"series_slice_s,omitempty"`
	SteadySeriesBytesPerS []float64 `json:"steady_series_bytes_per_s_per_relay,omitempty"`
	Error                 string    `json:"error,omitempty"`
}

// Summary converts the result to simulated time.
func (r *SimResult) Summary(name string, cfg SimConfig, runErr error) Summary {
	sec := func(d time.Duration) *float64 {
		if d <= 0 {
			return nil
		}
		v := math.Round(r.Sim(d).Seconds()*1000) / 1000
		return &v
	}
	s := Summary{Name: name, Relays: r.Relays, TimeScale: r.TimeScale, StartS: r.Sim(r.StartTime).Seconds(),
		AllRostersCompleteS: sec(r.Convergence), Complete50S: sec(r.Complete50), Complete90S: sec(r.Complete90), Complete99S: sec(r.Complete99),
		KnownShare: r.Known, JoinCostKiB: r.BytesPerRelay / 1024, SteadyBytesPerS: r.SimRate(r.SteadyBps), SteadyDatagramsPerS: r.SimRate(r.SteadyPps),
		HeapPerRelayKiB: r.HeapPerRelay / 1024, CRLOnEveryRelayS: sec(r.CRLSpread), JoinedIn999PctS: sec(r.JoinOne999), JoinedInAllS: sec(r.JoinOneAll),
		Killed: r.Killed, KilledOutOfFirstRosterS: sec(r.KillDetectFirst), KilledOutOfEveryRosterS: sec(r.KillDetection),
		FalseRemovals: r.FalseRemovals, DatagramsDropped: r.Dropped}
	if r.SeriesSlice > 0 {
		s.SeriesSliceS = r.Sim(r.SeriesSlice).Seconds()
		for _, v := range r.SteadySeries {
			s.SteadySeriesBytesPerS = append(s.SteadySeriesBytesPerS, math.Round(r.SimRate(v)))
		}
	}
	s.Settings = map[string]any{"probe_interval": cfg.ProbeInterval.String(), "probe_timeout": cfg.ProbeTimeout.String(), "suspicion_mult": cfg.SuspicionMult,
		"suspicion_max_timeout_mult": cfg.SuspicionMaxTimeoutMult, "gossip_nodes": cfg.GossipNodes, "gossip_interval": cfg.GossipInterval.String(),
		"push_pull_interval": cfg.PushPullInterval.String(), "retransmit_mult": cfg.RetransmitMult, "join_rate": cfg.JoinRate, "kill": cfg.Kill}
	if runErr != nil {
		s.Error = runErr.Error()
	}
	return s
}

// WriteFile writes the summary as JSON.
func (s Summary) WriteFile(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Sim converts a wall-clock duration of the run to simulated time.
func (r *SimResult) Sim(d time.Duration) time.Duration {
	if r.TimeScale <= 0 {
		return d
	}
	return time.Duration(float64(d) / r.TimeScale)
}

// SimRate converts a rate per wall-clock second to one per simulated second.
func (r *SimResult) SimRate(x float64) float64 {
	if r.TimeScale <= 0 {
		return x
	}
	return x * r.TimeScale
}

// Simulate builds a collective of cfg.Relays relays and measures it.
func Simulate(ctx context.Context, cfg SimConfig) (*SimResult, error) {
	if cfg.Relays < 2 {
		return nil, errors.New("simulate: at least 2 relays")
	}
	if cfg.Kill < 0 || cfg.Kill >= cfg.Relays {
		return nil, fmt.Errorf("simulate: kill %d of %d relays", cfg.Kill, cfg.Relays)
	}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 15 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.TimeScale < 1 || math.IsInf(cfg.TimeScale, 0) || math.IsNaN(cfg.TimeScale) {
		return nil, fmt.Errorf("simulate: time scale %v: want 1 or more", cfg.TimeScale)
	}
	scale := cfg.TimeScale
	wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", a...)
		}
	}
	auth, err := collective.NewAuthority()
	if err != nil {
		return nil, err
	}
	trust := collective.NewTrust(auth.Public())
	secret := make([]byte, 32) // gossip is sealed as between real relays
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	sn := &simNet{nodes: map[string]*simTransport{}}
	var verified atomic.Uint64
	var cache sync.Map // string(meta) -> *roster.Entry
	verify := func(meta []byte, now time.Time) (*roster.Entry, error) {
		if !cfg.VerifyEach {
			if e, ok := cache.Load(string(meta)); ok {
				return e.(*roster.Entry), nil
			}
		}
		e, err := roster.Parse(meta)
		if err == nil {
			err = e.Verify(trust, now)
		}
		verified.Add(1)
		if err != nil {
			return nil, err
		}
		if !cfg.VerifyEach {
			cache.Store(string(meta), e)
		}
		return e, nil
	}
	res := &SimResult{Relays: cfg.Relays, Killed: cfg.Kill, TimeScale: scale}
	defer func() { res.Dropped, res.Verified = sn.dropped.Load(), verified.Load() }()
	nodes := make([]*roster.Node, cfg.Relays, cfg.Relays+1)
	alive := make([]bool, cfg.Relays, cfg.Relays+1)
	addrs := make([]string, cfg.Relays, cfg.Relays+1)
	// Every relay holds its own revocation list (the entries' verification
	// is shared, above, and ignores lists: the list revokes nobody here).
	trusts := make([]*collective.Trust, cfg.Relays, cfg.Relays+1)
	defer func() {
		for i, n := range nodes {
			if n != nil && alive[i] {
				_ = n.Kill()
			}
		}
	}()
	now := time.Now()
	// start starts relay i (joining relay join).
	start := func(i, join int) (*roster.Node, error) {
		k, err := proto.GenerateKey()
		if err != nil {
			return nil, err
		}
		c, err := auth.Issue(k.Public(), fmt.Sprintf("sim%04d", i), collective.RoleRelay, now.Add(-time.Minute), now.Add(24*time.Hour))
		if err != nil {
			return nil, err
		}
		addr := simAddrOf(i)
		tr := sn.add(addr)
		var joins []string
		if join >= 0 {
			joins = []string{simAddrOf(join)}
		}
		tt := collective.NewTrust(auth.Public())
		n, err := roster.Start(roster.Config{Transport: tr, Join: joins, Secret: secret, Key: k, Cert: c, Trust: tt, Verify: verify,
			ProbeInterval: cfg.ProbeInterval, ProbeTimeout: cfg.ProbeTimeout, SuspicionMult: cfg.SuspicionMult,
			SuspicionMaxTimeoutMult: cfg.SuspicionMaxTimeoutMult, GossipNodes: cfg.GossipNodes, GossipInterval: cfg.GossipInterval,
			PushPullInterval: cfg.PushPullInterval, RetransmitMult: cfg.RetransmitMult, TimeScale: scale},
			roster.Info{Addrs: []netip.AddrPort{netip.MustParseAddrPort(addr)}, Capacity: 1000, Kinds: roster.KindNAT | roster.KindTunnel, Region: "sim"})
		if err != nil {
			return nil, fmt.Errorf("relay %d: %w", i, err)
		}
		if i < len(nodes) {
			nodes[i], alive[i], addrs[i], trusts[i] = n, true, addr, tt
		} else {
			nodes, alive, addrs, trusts = append(nodes, n), append(alive, true), append(addrs, addr), append(trusts, tt)
		}
		return n, nil
	}
	t0 := time.Now()
	for i := range cfg.Relays {
		join := -1
		if i > 0 {
			join = i / 2 // a join tree: every relay joins an earlier one
		}
		if _, err := start(i, join); err != nil {
			return nil, err
		}
		if cfg.JoinRate > 0 {
			if d := wall(time.Duration(float64(i+1)/cfg.JoinRate*float64(time.Second))) - time.Since(t0); d > 0 {
				time.Sleep(d)
			}
		}
		if (i+1)%100 == 0 {
			say("started %d relays (%v)", i+1, time.Since(t0).Round(time.Millisecond))
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	res.StartTime = time.Since(t0)
	t1 := time.Now()
	complete := func(want int) (int, error) {
		deadline := time.Now().Add(cfg.Timeout)
		last := time.Now()
		for {
			// size, not Count: see there. Members only for the
			// progress line (O(N) per relay as well).
			done := 0
			lo, hi := 1<<30, 0
			for i, n := range nodes {
				if !alive[i] {
					continue
				}
				c := n.Size()
				lo, hi = min(lo, c), max(hi, c)
				if c == want {
					done++
				}
			}
			live := 0
			for _, a := range alive {
				if a {
					live++
				}
			}
			if done == live {
				return done, nil
			}
			// Milestones: the slowest roster often waits for one
			// missed relay until a state sync (docs/results/roster).
			for q, at := range map[int]*time.Duration{50: &res.Complete50, 90: &res.Complete90, 99: &res.Complete99} {
				if *at == 0 && done*100 >= q*live {
					*at = time.Since(t1)
				}
			}
			known := 0
			for i, n := range nodes {
				if alive[i] {
					known += min(n.Size(), want)
				}
			}
			res.Known = float64(known) / float64(live*want)
			if time.Since(last) > 5*time.Second {
				mlo, mhi := 1<<30, 0
				for i, n := range nodes {
					if alive[i] {
						mlo, mhi = min(mlo, n.Members()), max(mhi, n.Members())
					}
				}
				say("  %d of %d rosters complete (%v, simulated %v): rosters of %d-%d relays (%.3f %% of the entries), memberlist sees %d-%d; %d datagrams dropped, %d verifications",
					done, live, time.Since(t1).Round(time.Millisecond), res.Sim(time.Since(t1)).Round(time.Millisecond), lo, hi, 100*res.Known, mlo, mhi, sn.dropped.Load(), verified.Load())
				last = time.Now()
			}
			if time.Now().After(deadline) {
				return done, fmt.Errorf("simulate: %d of %d rosters complete after %v", done, live, cfg.Timeout)
			}
			if err := ctx.Err(); err != nil {
				return done, err
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	if done, err := complete(cfg.Relays); err != nil {
		if ctx.Err() != nil {
			return res, err
		}
		// Not converged within Timeout: the other phases are still
		// measured (steady state, the list, the kill), on incomplete
		// rosters; Convergence stays 0.
		res.Incomplete = cfg.Relays - done
		say("%v; %.3f %% of the entries known: measuring the other phases anyway", err, 100*res.Known)
	} else {
		res.Convergence = time.Since(t1)
		res.Complete50, res.Complete90, res.Complete99 = min(res.Complete50, res.Convergence), min(res.Complete90, res.Convergence), min(res.Complete99, res.Convergence)
		if res.Complete50 == 0 {
			res.Complete50 = res.Convergence
		}
		if res.Complete90 == 0 {
			res.Complete90 = res.Convergence
		}
		if res.Complete99 == 0 {
			res.Complete99 = res.Convergence
		}
		res.Known = 1
		say("converged: every roster lists %d relays %v after the last start (simulated %v)", cfg.Relays, res.Convergence.Round(time.Millisecond), res.Sim(res.Convergence).Round(time.Millisecond))
	}
	b, _ := sn.totals()
	res.BytesPerRelay = float64(b) / float64(cfg.Relays)
	say("rosters complete: 50 %% of them after %v, 90 %% after %v, 99 %% after %v (simulated %v, %v, %v; 0: not reached)",
		res.Complete50.Round(time.Millisecond), res.Complete90.Round(time.Millisecond), res.Complete99.Round(time.Millisecond),
		res.Sim(res.Complete50).Round(time.Millisecond), res.Sim(res.Complete90).Round(time.Millisecond), res.Sim(res.Complete99).Round(time.Millisecond))

	// Steady state: nothing changes, memberlist probes, gossips and syncs.
	// A series of slices over settle and window shows when the join's
	// retransmissions have died out and where the state syncs fall.
	res.SeriesSlice = max(wall(cfg.Settle+cfg.Window)/60, wall(10*time.Second))
	series := time.NewTicker(res.SeriesSlice)
	defer series.Stop()
	lastB, _ := sn.totals()
	lastT := time.Now()
	sample := func() {
		b, _ := sn.totals()
		now := time.Now()
		bps := float64(b-lastB) / now.Sub(lastT).Seconds() / float64(cfg.Relays)
		res.SteadySeries = append(res.SteadySeries, bps)
		say("  steady series: %.0f B/s per relay per simulated second over the last %v simulated", res.SimRate(bps), res.Sim(now.Sub(lastT)).Round(time.Second))
		lastB, lastT = b, now
	}
	wait := func(d time.Duration) error {
		end := time.After(d)
		for {
			select {
			case <-end:
				return nil
			case <-series.C:
				sample()
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if err := wait(wall(cfg.Settle)); err != nil {
		return res, err
	}
	b0, p0 := sn.totals()
	tw := time.Now()
	if err := wait(wall(cfg.Window)); err != nil {
		return res, err
	}
	b1, p1 := sn.totals()
	secs := time.Since(tw).Seconds()
	res.SteadyBps = float64(b1-b0) / secs / float64(cfg.Relays)
	res.SteadyPps = float64(p1-p0) / secs / float64(cfg.Relays)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapPerRelay = float64(ms.HeapAlloc) / float64(cfg.Relays)
	say("live heap after a GC: %.1f MiB, %.0f KiB per relay", float64(ms.HeapAlloc)/(1<<20), res.HeapPerRelay/1024)
	say("steady state over %v (simulated %v): %.0f B/s and %.1f datagrams/s sent per relay (per simulated second: %.0f B/s, %.1f datagrams/s)",
		wall(cfg.Window), cfg.Window, res.SteadyBps, res.SteadyPps, res.SimRate(res.SteadyBps), res.SimRate(res.SteadyPps))

	// A revocation list given to relay 0 (as its crl_file would): until
	// every relay applied it (broadcast, crl.go).
	l := auth.Revoke(nil, time.Now(), 1)
	if _, err := trusts[0].Install(l); err != nil {
		return res, err
	}
	tc := time.Now()
	nodes[0].PublishCRL()
	for {
		missing := 0
		for _, tr := range trusts {
			if c := tr.CRL(); c == nil || c.Seq < l.Seq {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Since(tc) > cfg.Timeout {
			return res, fmt.Errorf("simulate: the revocation list missing on %d relays after %v", missing, cfg.Timeout)
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.CRLSpread = time.Since(tc)
	say("revocation list given to one relay: applied by all %d after %v (simulated %v)", cfg.Relays, res.CRLSpread.Round(time.Millisecond), res.Sim(res.CRLSpread).Round(time.Millisecond))

	// One more relay joins (a random one of the collective): until
	// 99.9 % of the others' rosters list it, and all.
	{
		tj := time.Now()
		n, err := start(cfg.Relays, mrand.IntN(cfg.Relays))
		if err != nil {
			return res, err
		}
		name := n.Name()
		others := cfg.Relays
		for {
			listed := 0
			for i, o := range nodes[:cfg.Relays] {
				if alive[i] && o.ListsAny(name) {
					listed++
				}
			}
			if res.JoinOne999 == 0 && listed*1000 >= others*999 {
				res.JoinOne999 = time.Since(tj)
			}
			if listed == others {
				res.JoinOneAll = time.Since(tj)
				break
			}
			if time.Since(tj) > cfg.Timeout {
				say("the joined relay is in %d of %d rosters after %v", listed, others, cfg.Timeout)
				break
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
			time.Sleep(20 * time.Millisecond)
		}
		say("one relay joined: in 99.9 %% of the rosters after %v, in all after %v (simulated %v, %v; 0: not within the timeout)",
			res.JoinOne999.Round(time.Millisecond), res.JoinOneAll.Round(time.Millisecond), res.Sim(res.JoinOne999).Round(time.Millisecond), res.Sim(res.JoinOneAll).Round(time.Millisecond))
	}

	if cfg.Kill > 0 {
		var dead []string // node names
		for i := 0; i < cfg.Kill; i++ {
			j := cfg.Relays - 1 - i*(cfg.Relays/cfg.Kill) // spread over the join tree
			dead = append(dead, nodes[j].Name())
			sn.kill(addrs[j])
			_ = nodes[j].Kill()
			alive[j] = false
		}
		tk := time.Now()
		first := time.Duration(0)
		deadline := tk.Add(cfg.Timeout)
		for {
			clean, live := 0, 0
			for i, n := range nodes {
				if !alive[i] {
					continue
				}
				live++
				if !n.ListsAny(dead...) {
					clean++
				}
			}
			if clean > 0 && first == 0 {
				first = time.Since(tk)
			}
			if clean == live {
				break
			}
			if time.Now().After(deadline) {
				return res, fmt.Errorf("simulate: killed relays still in %d of %d rosters after %v", live-clean, live, cfg.Timeout)
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
			time.Sleep(50 * time.Millisecond)
		}
		res.KillDetection, res.KillDetectFirst = time.Since(tk), first
		say("killed %d relays: out of the first roster after %v, out of every roster after %v (simulated %v, %v)", cfg.Kill,
			first.Round(time.Millisecond), res.KillDetection.Round(time.Millisecond), res.Sim(first).Round(time.Millisecond), res.Sim(res.KillDetection).Round(time.Millisecond))
		// Live relays still all listed (no false removals)? Only
		// meaningful when the rosters were complete before the kill.
		want := len(nodes) - cfg.Kill // the relays started, the joined one included
		for i, n := range nodes {
			if alive[i] && n.Size() != want && res.Incomplete == 0 {
				res.FalseRemovals++
			}
		}
	}
	if res.Incomplete > 0 {
		return res, fmt.Errorf("simulate: %d of %d rosters incomplete after %v (the other phases were measured)", res.Incomplete, cfg.Relays, cfg.Timeout)
	}
	return res, nil
}

// simNet is an in-process lossy datagram and stream network.
type simNet struct {
	mu      sync.RWMutex
	nodes   map[string]*simTransport
	bytes   atomic.Uint64
	packets atomic.Uint64
	dropped atomic.Uint64
}

func (n *simNet) add(addr string) *simTransport {
	t := &simTransport{net: n, addr: addr, packets: make(chan *memberlist.Packet, 512), streams: make(chan net.Conn, 64)}
	n.mu.Lock()
	n.nodes[addr] = t
	n.mu.Unlock()
	return t
}

func (n *simNet) kill(addr string) {
	n.mu.RLock()
	t := n.nodes[addr]
	n.mu.RUnlock()
	if t != nil {
		t.dead.Store(true)
	}
}

func (n *simNet) peer(addr string) *simTransport {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t := n.nodes[addr]
	if t == nil || t.dead.Load() {
		return nil
	}
	return t
}

func (n *simNet) totals() (bytes, packets uint64) { return n.bytes.Load(), n.packets.Load() }

type simTransport struct {
	net     *simNet
	addr    string
	packets chan *memberlist.Packet
	streams chan net.Conn
	dead    atomic.Bool
}

var _ memberlist.NodeAwareTransport = (*simTransport)(nil)

type simAddr string

func (a simAddr) Network() string { return "sim" }
func (a simAddr) String() string  { return string(a) }

func (t *simTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	h, p, err := net.SplitHostPort(t.addr)
	if err != nil {
		return nil, 0, err
	}
	port, _ := strconv.Atoi(p)
	return net.ParseIP(h), port, nil
}

func (t *simTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *simTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	if t.dead.Load() {
		return now, nil
	}
	t.net.bytes.Add(uint64(len(b)))
	t.net.packets.Add(1)
	dst := t.net.peer(a.Addr)
	if dst == nil {
		return now, nil // lost, like a datagram to a dead host
	}
	select {
	case dst.packets <- &memberlist.Packet{Buf: append([]byte(nil), b...), From: simAddr(t.addr), Timestamp: now}:
	default:
		t.net.dropped.Add(1)
	}
	return now, nil
}

func (t *simTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *simTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *simTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dst := t.net.peer(a.Addr)
	if dst == nil || t.dead.Load() {
		return nil, fmt.Errorf("sim: %s unreachable", a.Addr)
	}
	p1, p2 := net.Pipe()
	select {
	case dst.streams <- &countConn{Conn: p1, n: t.net}:
	case <-time.After(timeout):
		p1.Close()
		p2.Close()
		return nil, fmt.Errorf("sim: %s does not accept", a.Addr)
	}
	return &countConn{Conn: p2, n: t.net}, nil
}

func (t *simTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *simTransport) Shutdown() error {
	t.dead.Store(true)
	return nil
}

type countConn struct {
	net.Conn
	n *simNet
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.bytes.Add(uint64(n))
	return n, err
}

// simAddrOf is relay i's address on the simulated network (10.0.0.1, ...).
func simAddrOf(i int) string {
	j := i + 1
	return fmt.Sprintf("10.%d.%d.%d:%d", j>>16&255, j>>8&255, j&255, roster.DefaultPort)
}
