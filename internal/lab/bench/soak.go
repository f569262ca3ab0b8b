package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/relay"
)

// SoakOptions configure Soak. Zero values take the defaults in brackets.
type SoakOptions struct {
	// Lab is a "detours" topology with at least two detour nodes
	// (detour1, detour2), a client and a server.
	Lab    *lab.Lab
	Binary string // mpdetour executable for the daemons
	Dir    string // scratch directory: configs, daemon logs
	// Duration of the churn [5m]. RestartEvery: a relay (alternating) is
	// restarted this often, every third time with SIGKILL [Duration/12,
	// i.e. 5 min in an hour]. FlapEvery/FlapFor: detour1's core link (C1)
	// is black-holed for FlapFor this often [30s / 5s], and half a period
	// later the default path (C0) for as long (FlapFor < FlapEvery/2).
	Duration, RestartEvery, FlapEvery, FlapFor time.Duration
	// ConnsPerSecond short MPTCP connections (open, send 32 KB, read them
	// back, close) [5], started on a fixed schedule (Duration x
	// ConnsPerSecond of them); Long connections keep sending ~2 Mbit/s
	// each for the whole run [2]. Every byte is echoed and checked.
	ConnsPerSecond float64
	ConnBytes      int // bytes each short connection sends [32 KiB]
	Long           int
	Sample         time.Duration // sampling period [10s]
	// Policy is the agent's policy ("" = its default).
	Policy string
	// SubflowLowat is the agent's subflow_lowat in bytes, written into
	// its configuration (0: subflow_lowat: 0, off, the agent's default
	// before it was turned on; "lab soak" passes the agent's default,
	// agentd.DefaultSubflowLowat, unless told; docs/agent.md "Per-subflow
	// unsent limit"). Its BPF program attaches to this runner's lab
	// cgroup (withLabCgroup).
	SubflowLowat int
	Progress     io.Writer // one line per sample (nil: none)
	// Attacks are attack-suite cases (breaks.InPlaceCases) run against
	// the soak's own relays and agent, one every AttackEvery [30s] in
	// turn, while the traffic runs (none: the soak as before). Self and
	// PeerCommand are the lab binary and its hidden command for the other
	// local user's side (convert-socket).
	Attacks           []string
	AttackEvery       time.Duration
	Self, PeerCommand string
}

// soakSubflows are the agent's detour subflows per connection.
const soakSubflows = 2

// soakAgentExtra is the soak agent's configuration besides its relays:
// tunnels, metrics, and the options' policy and subflow_lowat.
func soakAgentExtra(o SoakOptions) string {
	extra := "tunnels: true\nmetrics: {listen: " + soakAgentMetrics + "}\n"
	if o.Policy != "" {
		extra += "policy: " + o.Policy + "\n"
	}
	// Always written: 0 says off whatever the agent's default (on).
	return extra + fmt.Sprintf("subflow_lowat: %d\n", o.SubflowLowat)
}

// SoakSample is one look at every daemon.
type SoakSample struct {
	T      float64              `json:"t"` // seconds since the churn started
	Agent  ProcStats            `json:"agent"`
	Relays map[string]RelayLook `json:"relays"`
	// Connections started (short and long), ended with every byte echoed
	// and checked, and failed so far; bytes checked.
	Opened   int64 `json:"opened"`
	Verified int64 `json:"verified"`
	Failed   int64 `json:"failed"`
	Bytes    int64 `json:"bytes_verified"`
}

// ProcStats are a daemon's resources, from its Prometheus endpoint.
type ProcStats struct {
	RSSBytes   float64 `json:"rss_bytes"`
	FDs        float64 `json:"fds"`
	Goroutines float64 `json:"goroutines"`
	CPUSeconds float64 `json:"cpu_seconds"` // since the process started
	// What of the RSS is Go's: the heap in use, goroutine stacks, and all
	// memory the Go runtime obtained from the OS (go_memstats_*).
	HeapInuseBytes  float64 `json:"heap_inuse_bytes,omitempty"`
	StackInuseBytes float64 `json:"stack_inuse_bytes,omitempty"`
	GoSysBytes      float64 `json:"go_sys_bytes,omitempty"`
	// P99CreateS is the agent's ESTABLISHED -> SUBFLOW_CREATE p99 over its
	// recent samples (agent only).
	P99CreateS float64 `json:"p99_create_s,omitempty"`
	// MPTCPDisabled is 1 while the kernel's MPTCP blackhole detection
	// makes new connections plain TCP; MPTCPFallbacks counts those
	// connections since boot (agent only).
	MPTCPDisabled  float64 `json:"mptcp_blackhole_disabled,omitempty"`
	MPTCPFallbacks float64 `json:"mptcp_blackhole_fallbacks,omitempty"`
}

// RelayLook is a relay's resources and state.
type RelayLook struct {
	ProcStats
	Mappings    int `json:"mappings"`     // the relay's table (relay status)
	NftElements int `json:"nft_elements"` // its DNAT map in the kernel
	TunnelPeers int `json:"tunnel_peers"` // WireGuard peers
	Restarts    int `json:"restarts"`
}

// SoakCheck is one pass/fail criterion.
type SoakCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// SoakReport is what Soak measured.
type SoakReport struct {
	Options struct {
		Duration, RestartEvery, FlapEvery, FlapFor string
		ConnsPerSecond                             float64
		ConnBytes, Long                            int
		Policy                                     string `json:",omitempty"`
		SubflowLowat                               int    `json:",omitempty"`
	} `json:"options"`
	Version  string       `json:"version"` // version of the mpdetour binary the soak runs
	Samples  []SoakSample `json:"samples"`
	Restarts []string     `json:"restarts"` // "t=..s relay detour1 SIGTERM"
	Faults   []string     `json:"faults"`   // "t=..s C0 (default path) 5s"
	// Expected short connections (Duration x ConnsPerSecond) and the
	// short ones started; failures by kind (short and long).
	ExpectedShort int64            `json:"expected_short"`
	StartedShort  int64            `json:"started_short"`
	Failures      map[string]int64 `json:"failures"`
	// AgentRSSTrend: the agent's RSS slope after the warm-up (MB/h) with
	// its 95 % confidence interval.
	AgentRSSTrend struct {
		Slope, Lo, Hi, WindowS float64
	} `json:"agent_rss_trend_mb_per_h"`
	Final map[string]RelayLook
	// Attacks: every in-place case's runs (none without Options.Attacks).
	Attacks []SoakAttack `json:"attacks,omitempty"`
	// LearnedLimits: server join limits the agent learned over the soak
	// (its log; every one is wrong: the server accepts all joins).
	LearnedLimits int         `json:"learned_limits"`
	Checks        []SoakCheck `json:"checks"`
}

// Failed lists the checks that did not pass.
func (r *SoakReport) Failed() []SoakCheck {
	var f []SoakCheck
	for _, c := range r.Checks {
		if !c.OK {
			f = append(f, c)
		}
	}
	return f
}

const (
	soakAgentMetrics = "127.0.0.1:9465"
	soakRelayMetrics = "127.0.0.1:9464"
)

// Soak runs relays in detour1 and detour2 and an agent in the client with
// NAT and tunnel detours, and for Duration opens and closes connections,
// keeps long ones sending, restarts relays and flaps a detour link, sampling
// every daemon's memory, file descriptors and goroutines and the relays'
// mappings, nft elements and WireGuard peers. Afterwards it checks that
// nothing grew and no mapping was left behind. An error means the soak could
// not run; failed checks are in the report.
func Soak(ctx context.Context, o SoakOptions) (*SoakReport, error) {
	if o.Duration <= 0 {
		o.Duration = 5 * time.Minute
	}
	if o.RestartEvery <= 0 {
		o.RestartEvery = o.Duration / 12
	}
	if o.FlapEvery <= 0 {
		o.FlapEvery = 30 * time.Second
	}
	if o.FlapFor <= 0 {
		o.FlapFor = 5 * time.Second
	}
	if o.ConnsPerSecond <= 0 {
		o.ConnsPerSecond = 5
	}
	if o.Long < 0 {
		o.Long = 0
	}
	if o.ConnBytes <= 0 {
		o.ConnBytes = 32 << 10
	}
	if o.Sample <= 0 {
		o.Sample = 10 * time.Second
	}
	if o.AttackEvery <= 0 {
		o.AttackEvery = 30 * time.Second
	}
	if n := len(o.Attacks); n > 0 && o.Duration < time.Duration(n)*o.AttackEvery+AttackLongest {
		return nil, fmt.Errorf("duration %s leaves no room for every attack case once (at least %d x attack-every %s + %s)", o.Duration, n, o.AttackEvery, AttackLongest)
	}
	if o.FlapFor >= o.FlapEvery/2 {
		return nil, fmt.Errorf("flap-for %s must be shorter than half of flap-every %s (the detour and the default path are faulted in turn)", o.FlapFor, o.FlapEvery)
	}
	rep := &SoakReport{Final: map[string]RelayLook{}, Version: productVersion(o.Binary)}
	rep.Options.Duration, rep.Options.RestartEvery = o.Duration.String(), o.RestartEvery.String()
	rep.Options.FlapEvery, rep.Options.FlapFor = o.FlapEvery.String(), o.FlapFor.String()
	rep.Options.ConnsPerSecond, rep.Options.Long, rep.Options.ConnBytes = o.ConnsPerSecond, o.Long, o.ConnBytes
	rep.Options.Policy, rep.Options.SubflowLowat = o.Policy, o.SubflowLowat
	detours := []string{"detour1", "detour2"}
	env := &Env{Lab: o.Lab, Cell: scenario.Cell{Procedure: "soak", Detours: detours},
		Roles: scenario.Roles{Client: "client", Server: "server"}, Binary: o.Binary, Dir: o.Dir, Port: 5201,
		RelayLease: 30 * time.Second, RelayConfig: "metrics: {listen: " + soakRelayMetrics + "}\n", RelayState: true}
	if out, err := o.Lab.Command(ctx, "server", "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("server MPTCP limits: %v: %s", err, out)
	}
	// The soak black-holes the default path on purpose; each fault drops
	// MP_CAPABLE SYNs, which the kernel's MPTCP blackhole detection takes
	// for a middlebox and answers by making every new connection plain TCP
	// for an hour (net.mptcp.blackhole_timeout, 3600 s). Then the soak's
	// connections carry no detour and its "every byte echoed" would pass
	// without testing detours at all (before this: 1,178 of the 5-min CI
	// soak's ~1,500 connections were plain TCP). The detection is turned off
	// in the client (0 = off, Documentation/networking/mptcp-sysctl.rst),
	// and blackholeCheck judges that no connection fell back.
	if err := o.Lab.Do("client", func() error {
		return os.WriteFile("/proc/sys/net/mptcp/blackhole_timeout", []byte("0"), 0)
	}); err != nil {
		return nil, fmt.Errorf("client: turning the kernel's MPTCP blackhole detection off: %w", err)
	}
	var ln net.Listener
	err := o.Lab.Do("server", func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", env.Port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("server sink: %w", err)
	}
	defer ln.Close()
	go soakEcho(ln)
	// quiet: an attack runs while no relay restarts and no link is
	// faulted (its figure is the attack's, not the fault's).
	var quiet sync.Mutex
	var attacks *soakAttacks
	if len(o.Attacks) > 0 {
		if attacks, err = newSoakAttacks(o, env, &quiet); err != nil {
			return nil, err
		}
	}
	rs, err := startRelays(ctx, env, natTunnel)
	if err != nil {
		return nil, err
	}
	defer rs.close()
	for _, node := range detours {
		if err := rs.probe(ctx, env, node); err != nil {
			return nil, err
		}
	}
	extra := rs.agentSection(env, false) + soakAgentExtra(o)
	if attacks != nil {
		extra += attacks.agentConfig()
	}
	agent, err := startAgent(ctx, env, soakSubflows, nil, extra)
	if err != nil {
		return nil, err
	}
	defer agent.stop()

	var tally soakTally
	if attacks != nil {
		attacks.wire(rs, env, tally.attempted.Load)
	}
	runCtx, stopRun := context.WithTimeout(ctx, o.Duration)
	defer stopRun()
	var wg sync.WaitGroup
	start := time.Now()
	// A dial waits out a default-path fault (SYN retransmissions at 1, 3
	// and 7 s): 15 s.
	dial := func() (net.Conn, error) {
		var c net.Conn
		err := o.Lab.Do("client", func() (err error) {
			d := &net.Dialer{Timeout: 15 * time.Second}
			d.SetMultipathTCP(true)
			c, err = d.Dial("tcp4", env.serverAddr().String())
			return err
		})
		tally.attempted.Add(1)
		if err != nil {
			tally.fail("dial: " + errClass(err))
		}
		return c, err
	}
	// Short connections, on a fixed schedule (a late start is caught up,
	// not dropped, also past the end of the run): ExpectedShort of them
	// unless the soak is interrupted.
	rep.ExpectedShort = int64(o.Duration.Seconds() * o.ConnsPerSecond)
	var startedShort atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := int64(0); i < rep.ExpectedShort; i++ {
			at := start.Add(time.Duration(float64(i) / o.ConnsPerSecond * float64(time.Second)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at)):
			}
			startedShort.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := dial()
				if err != nil {
					return
				}
				if why := tally.shortConn(c, o.ConnBytes, time.Now().Add(30*time.Second)); why != "" {
					tally.fail(why)
				} else {
					tally.verified.Add(1)
				}
			}()
		}
	}()
	// Long connections: reopened if one breaks (counted as failed).
	for i := 0; i < o.Long; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				c, err := dial()
				if err != nil {
					time.Sleep(time.Second)
					continue
				}
				// 25 KiB every 100 ms: ~2 Mbit/s.
				if why := tally.longConn(c, 25<<10, 100*time.Millisecond, runCtx.Done()); why != "" {
					tally.fail(why)
				} else {
					tally.verified.Add(1)
				}
			}
		}()
	}
	// Relay restarts.
	restarts := map[string]int{}
	var restartMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(o.RestartEvery)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			node := detours[n%len(detours)]
			how := "SIGTERM"
			if n%3 == 2 {
				how = "SIGKILL"
			}
			quiet.Lock()
			err := rs.restart(ctx, env, node, how == "SIGKILL")
			quiet.Unlock()
			restartMu.Lock()
			restarts[node]++
			line := fmt.Sprintf("t=%.0fs relay %s %s", time.Since(start).Seconds(), node, how)
			if err != nil {
				line += ": " + err.Error()
			}
			rep.Restarts = append(rep.Restarts, line)
			restartMu.Unlock()
		}
	}()
	// Link faults: detour1's core link, and half a period later the
	// default path (C0), each black-holed for FlapFor (in turn: both are
	// faulted in r1, one fault table at a time).
	var faultMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			link, what := "C1", "detour1's core link"
			if n%2 == 0 {
				link, what = "C0", "the default path"
			}
			select {
			case <-runCtx.Done():
				return
			case <-time.After(time.Until(start.Add(time.Duration(n) * o.FlapEvery / 2))):
			}
			quiet.Lock()
			restore, err := o.Lab.BlackHole(link)
			line := fmt.Sprintf("t=%.0fs %s (%s) %s", time.Since(start).Seconds(), link, what, o.FlapFor)
			if err != nil {
				line += ": " + err.Error()
			}
			faultMu.Lock()
			rep.Faults = append(rep.Faults, line)
			faultMu.Unlock()
			if err != nil {
				quiet.Unlock()
				continue
			}
			select {
			case <-runCtx.Done():
			case <-time.After(o.FlapFor):
			}
			_ = restore()
			quiet.Unlock()
		}
	}()
	if attacks != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			attacks.run(ctx, start, start.Add(o.Duration))
		}()
	}
	// Samples.
	sample := func() SoakSample {
		failed, _ := tally.failures()
		s := SoakSample{T: time.Since(start).Seconds(), Relays: map[string]RelayLook{}, Opened: tally.attempted.Load(),
			Verified: tally.verified.Load(), Failed: failed, Bytes: tally.bytes.Load()}
		s.Agent, _ = scrapeProc(o.Lab, "client", soakAgentMetrics)
		restartMu.Lock()
		defer restartMu.Unlock()
		for _, node := range detours {
			look := lookRelay(ctx, o.Lab, o.Binary, node)
			look.Restarts = restarts[node]
			s.Relays[node] = look
		}
		return s
	}
	tick := time.NewTicker(o.Sample)
sampling:
	for {
		select {
		case <-runCtx.Done():
			break sampling
		case <-tick.C:
			s := sample()
			rep.Samples = append(rep.Samples, s)
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "soak t=%4.0fs agent rss=%.1fMB (heap %.1f, stacks %.1f, go sys %.1f) fds=%.0f goroutines=%.0f cpu=%.1fs p99=%.2fms mptcp-off=%.0f | %s | conns %d verified %d failed %d, %.0f MB checked\n",
					s.T, s.Agent.RSSBytes/1e6, s.Agent.HeapInuseBytes/1e6, s.Agent.StackInuseBytes/1e6, s.Agent.GoSysBytes/1e6, s.Agent.FDs, s.Agent.Goroutines, s.Agent.CPUSeconds, 1000*s.Agent.P99CreateS, s.Agent.MPTCPDisabled, relayLine(s), s.Opened, s.Verified, s.Failed, float64(s.Bytes)/1e6)
			}
		}
	}
	tick.Stop()
	wg.Wait()
	rep.StartedShort = startedShort.Load()
	_, rep.Failures = tally.failures()
	// The totals after every connection ended.
	end := sample()
	rep.Samples = append(rep.Samples, end)
	if ok, _ := agent.exited(); ok {
		rep.Checks = append(rep.Checks, SoakCheck{Name: "agent alive", Detail: agent.failure().Error()})
		return rep, nil
	}
	// After the churn: every connection is closed, so the agent releases
	// its grants (or they expire with the lease): no mapping may remain.
	deadline := time.Now().Add(env.RelayLease + 20*time.Second)
	var final map[string]RelayLook
	for {
		final = map[string]RelayLook{}
		clean := true
		for _, node := range detours {
			look := lookRelay(ctx, o.Lab, o.Binary, node)
			final[node] = look
			if look.Mappings != 0 || look.NftElements != 0 || look.RSSBytes == 0 {
				clean = false // RSS 0: the relay did not answer, nothing is known
			}
		}
		if clean || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	rep.Final = final
	rep.Checks = append(rep.Checks, soakChecks(rep, o)...)
	learned, first, err := learnedLimits(filepath.Join(o.Dir, "agent.log"))
	rep.LearnedLimits = learned
	detail := fmt.Sprintf("%d (the server accepts every join: each would be wrong)", learned)
	if first != "" {
		detail += "; first: " + first
	}
	if err != nil {
		detail = "the agent's log: " + err.Error()
	}
	if attacks != nil {
		rep.Attacks = attacks.report()
		rep.Checks = append(rep.Checks, attackChecks(rep.Attacks)...)
		rep.Checks = append(rep.Checks, SoakCheck{Name: "join limits learned", OK: err == nil && learned == 0, Detail: detail})
	} else {
		rep.Checks = append(rep.Checks, SoakCheck{Name: "join limits learned", OK: true, Detail: detail + "; reported, judged with --attacks"})
	}
	return rep, nil
}

func relayLine(s SoakSample) string {
	var parts []string
	for _, node := range []string{"detour1", "detour2"} {
		r := s.Relays[node]
		parts = append(parts, fmt.Sprintf("%s rss=%.1fMB heap=%.1fMB fds=%.0f gr=%.0f map=%d nft=%d wg=%d", node, r.RSSBytes/1e6, r.HeapInuseBytes/1e6, r.FDs, r.Goroutines, r.Mappings, r.NftElements, r.TunnelPeers))
	}
	return strings.Join(parts, " | ")
}

// soakChecks compares the start and the end of the run (the first samples
// after a warm-up of a fifth of the run against the last fifth): resources
// must stay flat, and no mapping may be left behind.
func soakChecks(rep *SoakReport, o SoakOptions) []SoakCheck {
	var checks []SoakCheck
	n := len(rep.Samples)
	if n < 5 {
		return []SoakCheck{{Name: "samples", Detail: fmt.Sprintf("only %d samples: run longer", n)}}
	}
	w := n / 5
	first, last := rep.Samples[w:2*w], rep.Samples[n-w:]
	flat := func(name string, get func(SoakSample) float64, slack, ratio float64) {
		a, b := maxOf(first, get), maxOf(last, get)
		ok := b <= a*ratio+slack
		checks = append(checks, SoakCheck{Name: name + " flat", OK: ok,
			Detail: fmt.Sprintf("max %.1f early, %.1f late (allowed %.1f)", a, b, a*ratio+slack)})
	}
	flat("agent RSS (MB)", func(s SoakSample) float64 { return s.Agent.RSSBytes / 1e6 }, 10, 1.25)
	flat("agent fds", func(s SoakSample) float64 { return s.Agent.FDs }, 10, 1)
	flat("agent goroutines", func(s SoakSample) float64 { return s.Agent.Goroutines }, 30, 1.25)
	for _, node := range []string{"detour1", "detour2"} {
		node := node
		flat("relay "+node+" RSS (MB)", func(s SoakSample) float64 { return s.Relays[node].RSSBytes / 1e6 }, 10, 1.25)
		flat("relay "+node+" fds", func(s SoakSample) float64 { return s.Relays[node].FDs }, 10, 1)
		flat("relay "+node+" goroutines", func(s SoakSample) float64 { return s.Relays[node].Goroutines }, 20, 1.25)
		flat("relay "+node+" mappings", func(s SoakSample) float64 { return float64(s.Relays[node].Mappings) }, 10, 1.5)
		peers := maxOf(rep.Samples, func(s SoakSample) float64 { return float64(s.Relays[node].TunnelPeers) })
		checks = append(checks, SoakCheck{Name: "relay " + node + " WireGuard peers bounded", OK: peers <= 1,
			Detail: fmt.Sprintf("at most %.0f peer(s) (one member)", peers)})
		f := rep.Final[node]
		checks = append(checks, SoakCheck{Name: "relay " + node + " no mapping left", OK: f.Mappings == 0 && f.NftElements == 0 && f.RSSBytes > 0,
			Detail: fmt.Sprintf("after the churn: %d mappings, %d nft elements (relay answered: %v)", f.Mappings, f.NftElements, f.RSSBytes > 0)})
	}
	// The checks above compare what was measured: make sure something was.
	// A relay being restarted may miss one sample per restart.
	answered := func(name string, restarts int, get func(SoakSample) float64) {
		ok := 0
		for _, x := range rep.Samples {
			if get(x) > 0 {
				ok++
			}
		}
		allowed := restarts + n/10
		checks = append(checks, SoakCheck{Name: name + " answered", OK: n-ok <= allowed,
			Detail: fmt.Sprintf("%d of %d samples (at most %d missed: one per restart and 10%%)", ok, n, allowed)})
	}
	answered("agent metrics", 0, func(x SoakSample) float64 { return x.Agent.RSSBytes })
	for _, node := range []string{"detour1", "detour2"} {
		node := node
		answered("relay "+node+" metrics", rep.Samples[n-1].Relays[node].Restarts, func(x SoakSample) float64 { return x.Relays[node].RSSBytes })
		maps := maxOf(rep.Samples, func(x SoakSample) float64 { return float64(x.Relays[node].Mappings) })
		peers := maxOf(rep.Samples, func(x SoakSample) float64 { return float64(x.Relays[node].TunnelPeers) })
		checks = append(checks, SoakCheck{Name: "relay " + node + " used", OK: maps >= 1 && peers >= 1,
			Detail: fmt.Sprintf("at most %.0f mappings and %.0f WireGuard peers seen (a detour and a tunnel must have been granted)", maps, peers)})
	}
	checks = append(checks, connectionChecks(rep)...)
	faulted := map[string]bool{}
	faultsOK := true
	for _, f := range rep.Faults {
		faulted[strings.Fields(f)[1]] = true
		if strings.Contains(f, ": ") {
			faultsOK = false
		}
	}
	checks = append(checks, SoakCheck{Name: "link faults", OK: faultsOK && faulted["C0"] && faulted["C1"],
		Detail: fmt.Sprintf("%d: %s", len(rep.Faults), strings.Join(rep.Faults, "; "))})
	checks = append(checks, agentTrendCheck(rep, o))
	checks = append(checks, blackholeCheck(rep))
	if o.RestartEvery < o.Duration { // restarts were asked for
		restartsOK := len(rep.Restarts) >= 1
		for _, r := range rep.Restarts {
			if strings.Contains(r, ": ") {
				restartsOK = false
			}
		}
		checks = append(checks, SoakCheck{Name: "relay restarts", OK: restartsOK, Detail: fmt.Sprintf("%d: %s", len(rep.Restarts), strings.Join(rep.Restarts, "; "))})
	}
	return checks
}

func maxOf(ss []SoakSample, get func(SoakSample) float64) float64 {
	m := math.Inf(-1)
	for _, s := range ss {
		m = math.Max(m, get(s))
	}
	return m
}

// scrapeProc reads a daemon's process metrics from its endpoint in node.
func scrapeProc(l *lab.Lab, node, addr string) (ProcStats, error) {
	var st ProcStats
	var body []byte
	err := l.Do(node, func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
		if err := req.Write(c); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		return err
	})
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			st.RSSBytes = v
		case "process_open_fds":
			st.FDs = v
		case "go_goroutines":
			st.Goroutines = v
		case "process_cpu_seconds_total":
			st.CPUSeconds = v
		case "go_memstats_heap_inuse_bytes":
			st.HeapInuseBytes = v
		case "go_memstats_stack_inuse_bytes":
			st.StackInuseBytes = v
		case "go_memstats_sys_bytes":
			st.GoSysBytes = v
		case `mpdetour_agent_established_to_subflow_create_seconds{quantile="0.99"}`:
			st.P99CreateS = v
		case "mpdetour_agent_mptcp_blackhole_disabled":
			st.MPTCPDisabled = v
		case "mpdetour_agent_mptcp_blackhole_fallbacks_total":
			st.MPTCPFallbacks = v
		}
	}
	return st, nil
}

// lookRelay reads a relay's resources, its table (relay status) and its
// nftables map in node.
func lookRelay(ctx context.Context, l *lab.Lab, bin, node string) RelayLook {
	var look RelayLook
	look.ProcStats, _ = scrapeProc(l, node, soakRelayMetrics)
	if out, err := l.Command(ctx, node, bin, "relay", "status", "--json").Output(); err == nil {
		var st relay.Status
		if json.Unmarshal(out, &st) == nil {
			look.Mappings = st.Mappings
			if st.Tunnel != nil {
				look.TunnelPeers = len(st.Tunnel.Peers)
			}
		}
	}
	if out, err := l.Command(ctx, node, "nft", "-j", "list", "table", "ip", relay.TableName).Output(); err == nil {
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if json.Unmarshal(out, &doc) == nil {
			for _, o := range doc.Nftables {
				if m, ok := o["map"]; ok {
					var mm struct {
						Name string            `json:"name"`
						Elem []json.RawMessage `json:"elem"`
					}
					if json.Unmarshal(m, &mm) == nil && mm.Name == "detours" {
						look.NftElements = len(mm.Elem)
					}
				}
			}
		}
	}
	return look
}

// restart stops the relay in node (SIGKILL if kill) and starts it again
// with the same configuration, waiting until it grants.
func (rs *relays) restart(ctx context.Context, env *Env, node string, kill bool) error {
	for i, d := range rs.daemons {
		if d.name != "relay-"+node {
			continue
		}
		if kill {
			_ = d.cmd.Process.Kill()
			<-d.done
		} else if err := d.stop(); err != nil {
			return err
		}
		nd, err := startDaemon(ctx, env, node, "relay-"+node, env.Binary, "relay", "--config", filepath.Join(env.Dir, "relay-"+node+".yaml"))
		if err != nil {
			return err
		}
		rs.daemons[i] = nd
		return rs.probe(ctx, env, node)
	}
	return fmt.Errorf("no relay in %s", node)
}

// WriteSoakReport writes report.md and samples.json into dir.
func WriteSoakReport(dir string, rep *SoakReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "samples.json"), b, 0o644); err != nil {
		return err
	}
	var m strings.Builder
	fmt.Fprintf(&m, "# Soak: %s of churn\n\n", rep.Options.Duration)
	policy := rep.Options.Policy
	if policy == "" {
		policy = "default"
	}
	if rep.Options.SubflowLowat != 0 {
		policy += fmt.Sprintf(" policy, subflow_lowat %d bytes (BPF program in the runner's lab cgroup)", rep.Options.SubflowLowat)
	} else {
		policy += " policy, subflow_lowat 0 (off)"
	}
	fmt.Fprintf(&m, "mpdetour %s. Relays in detour1 and detour2 (NAT and WireGuard tunnel detours, lease 30 s), the agent in the client (%s, 2 detour subflows per connection, tunnels on), a server that echoes. For %s: %.0f short MPTCP connections/s on a fixed schedule (%d bytes each way, every byte read back and compared), %d long ones sending ~2 Mbit/s (echo checked all along), one relay restarted every %s (alternating, every third with SIGKILL), detour1's core link and, half a period later, the default path black-holed for %s every %s.\n\n",
		rep.Version, policy, rep.Options.Duration, rep.Options.ConnsPerSecond, rep.Options.ConnBytes, rep.Options.Long, rep.Options.RestartEvery, rep.Options.FlapFor, rep.Options.FlapEvery)
	if n := len(rep.Samples); n >= 2 {
		a, b := rep.Samples[0], rep.Samples[n-1]
		var p99 []float64
		for _, s := range rep.Samples {
			if s.Agent.P99CreateS > 0 {
				p99 = append(p99, s.Agent.P99CreateS)
			}
		}
		sort.Float64s(p99)
		worst := 0.0
		if len(p99) > 0 {
			worst = p99[len(p99)-1]
		}
		fmt.Fprintf(&m, "Agent CPU over the run: %.1f%% of one core (%.1f s in %.0f s); ESTABLISHED -> SUBFLOW_CREATE p99 (agent's recent samples), worst sample: %.2f ms; short connections expected %d, started %d; connections started %d, verified %d, failed %d; %.1f MB checked each way; agent RSS trend %+.1f MB/h (95%% CI %+.1f..%+.1f).\n\n",
			100*(b.Agent.CPUSeconds-a.Agent.CPUSeconds)/(b.T-a.T), b.Agent.CPUSeconds-a.Agent.CPUSeconds, b.T-a.T, 1000*worst,
			rep.ExpectedShort, rep.StartedShort, b.Opened, b.Verified, b.Failed, float64(b.Bytes)/1e6, rep.AgentRSSTrend.Slope, rep.AgentRSSTrend.Lo, rep.AgentRSSTrend.Hi)
	}
	if n := len(rep.Samples); n > 0 {
		mem := func(name string, p ProcStats) {
			fmt.Fprintf(&m, "- %s: RSS %.1f MB; Go heap in use %.1f MB, goroutine stacks %.1f MB, all memory the Go runtime holds %.1f MB\n",
				name, p.RSSBytes/1e6, p.HeapInuseBytes/1e6, p.StackInuseBytes/1e6, p.GoSysBytes/1e6)
		}
		m.WriteString("Memory at the last sample of the churn:\n\n")
		at := rep.Samples[n-1]
		if n > 1 {
			at = rep.Samples[n-2] // the last one is taken after the churn
		}
		mem("agent", at.Agent)
		for _, node := range []string{"detour1", "detour2"} {
			mem("relay "+node, at.Relays[node].ProcStats)
		}
		m.WriteString("\n")
	}
	m.WriteString("## Checks\n\n| check | result | detail |\n|---|---|---|\n")
	for _, c := range rep.Checks {
		res := "pass"
		if !c.OK {
			res = "**FAIL**"
		}
		fmt.Fprintf(&m, "| %s | %s | %s |\n", c.Name, res, c.Detail)
	}
	if len(rep.Attacks) > 0 {
		m.WriteString("\n## Attacks (in place, during the churn)\n\n| case | break | metric | target | runs | passed | could not attack | figures |\n|---|---|---|---|---|---|---|---|\n")
		for _, a := range rep.Attacks {
			fmt.Fprintf(&m, "| %s | %d | %s | %s | %d | %d | %d | %s |\n", a.Case, a.Break, a.Metric, a.Target, a.Runs, a.Passed, a.Errors, a.figures())
		}
		for _, a := range rep.Attacks {
			fmt.Fprintf(&m, "\n%s:\n\n", a.Case)
			for _, d := range a.Details {
				fmt.Fprintf(&m, "- %s\n", d)
			}
		}
	}
	m.WriteString("\n## Samples\n\n| t (s) | agent RSS MB | agent fds | agent goroutines | relay1 RSS MB / fds / goroutines | relay1 mappings / nft / wg peers | relay2 RSS MB / fds / goroutines | relay2 mappings / nft / wg peers | conns started / verified / failed |\n|---|---|---|---|---|---|---|---|---|\n")
	step := 1
	if len(rep.Samples) > 40 {
		step = int(math.Ceil(float64(len(rep.Samples)) / 40))
	}
	for i, s := range rep.Samples {
		if i%step != 0 && i != len(rep.Samples)-1 {
			continue
		}
		r1, r2 := s.Relays["detour1"], s.Relays["detour2"]
		fmt.Fprintf(&m, "| %.0f | %.1f | %.0f | %.0f | %.1f / %.0f / %.0f | %d / %d / %d | %.1f / %.0f / %.0f | %d / %d / %d | %d / %d / %d |\n",
			s.T, s.Agent.RSSBytes/1e6, s.Agent.FDs, s.Agent.Goroutines,
			r1.RSSBytes/1e6, r1.FDs, r1.Goroutines, r1.Mappings, r1.NftElements, r1.TunnelPeers,
			r2.RSSBytes/1e6, r2.FDs, r2.Goroutines, r2.Mappings, r2.NftElements, r2.TunnelPeers, s.Opened, s.Verified, s.Failed)
	}
	m.WriteString("\nRestarts: " + strings.Join(rep.Restarts, "; ") + "\n")
	m.WriteString("\nLink faults: " + strings.Join(rep.Faults, "; ") + "\n")
	names := make([]string, 0, len(rep.Final))
	for k := range rep.Final {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		f := rep.Final[k]
		fmt.Fprintf(&m, "\nAfter the churn, relay %s: %d mappings, %d nft elements, %d WireGuard peers.\n", k, f.Mappings, f.NftElements, f.TunnelPeers)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(m.String()), 0o644)
}

// errSoakFailed is returned by callers when checks failed.
var errSoakFailed = errors.New("soak checks failed")

// SoakError describes failed checks.
func SoakError(rep *SoakReport) error {
	f := rep.Failed()
	if len(f) == 0 {
		return nil
	}
	var b strings.Builder
	for _, c := range f {
		fmt.Fprintf(&b, "\n  %s: %s", c.Name, c.Detail)
	}
	return fmt.Errorf("%w:%s", errSoakFailed, b.String())
}

// connectionChecks: every connection was started, and every one ended with
// all its bytes echoed and checked (none failed, none unaccounted for).
func connectionChecks(rep *SoakReport) []SoakCheck {
	last := rep.Samples[len(rep.Samples)-1] // taken after every connection ended
	var kinds []string
	for k, v := range rep.Failures {
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(kinds)
	failed := "none failed"
	if len(kinds) > 0 {
		failed = "failed: " + strings.Join(kinds, ", ")
	}
	return []SoakCheck{
		{Name: "short connections started", OK: rep.StartedShort == rep.ExpectedShort && rep.ExpectedShort > 0,
			Detail: fmt.Sprintf("%d of the %d the schedule asks for", rep.StartedShort, rep.ExpectedShort)},
		{Name: "every byte verified", OK: last.Failed == 0 && last.Verified == last.Opened && last.Bytes > 0,
			Detail: fmt.Sprintf("%d connections started, %d ended with every byte echoed and checked (%.1f MB each way); %s",
				last.Opened, last.Verified, float64(last.Bytes)/1e6, failed)},
	}
}

// Bounds of the agent's memory trend: the lower 95 % bound of its RSS
// slope after the warm-up may not exceed trendPerHour plus trendSlack over
// the window (over an hour, 2 MB/h + 4 MB over the 48 minutes after the
// warm-up, 7 MB/h: a rise of 52 to 62 MB fails). A window shorter than
// trendMinWindow is reported, not judged: the embedded WireGuard devices'
// buffers (26 MiB of heap each, allocated at start) enter the RSS as they
// are first used, which takes minutes, so a short run measures that
// warm-up, not a leak; its level checks judge it.
const (
	trendPerHour   = 2.0 // MB/h
	trendSlack     = 4.0 // MB
	trendMinWindow = 15 * time.Minute
)

// agentTrendCheck fits the agent's RSS over the samples after a warm-up
// (the first fifth of the run, at least 2.5 min when the run allows) and
// fails when memory rises with confidence.
func agentTrendCheck(rep *SoakReport, o SoakOptions) SoakCheck {
	warm := math.Max(o.Duration.Seconds()/5, math.Min(150, o.Duration.Seconds()/2))
	var x, y []float64
	for _, s := range rep.Samples {
		if s.T >= warm && s.T <= o.Duration.Seconds()+1 && s.Agent.RSSBytes > 0 {
			x, y = append(x, s.T/3600), append(y, s.Agent.RSSBytes/1e6)
		}
	}
	if len(x) < 5 {
		return SoakCheck{Name: "agent RSS trend", Detail: fmt.Sprintf("%d samples after the %.0f s warm-up: too few for a trend (run longer)", len(x), warm)}
	}
	slope, lo, hi := trend(x, y)
	window := x[len(x)-1] - x[0]
	allowed := trendPerHour + trendSlack/window
	rep.AgentRSSTrend.Slope, rep.AgentRSSTrend.Lo, rep.AgentRSSTrend.Hi, rep.AgentRSSTrend.WindowS = slope, lo, hi, window*3600
	if window*3600 < trendMinWindow.Seconds() {
		return SoakCheck{Name: "agent RSS trend", OK: true,
			Detail: fmt.Sprintf("%+.1f MB/h (95%% CI %+.1f..%+.1f) over %.0f s after the warm-up: reported, not judged (a trend is judged over at least %s after the warm-up)",
				slope, lo, hi, window*3600, trendMinWindow)}
	}
	return SoakCheck{Name: "agent RSS trend", OK: lo <= allowed,
		Detail: fmt.Sprintf("%+.1f MB/h (95%% CI %+.1f..%+.1f) over %.0f s after the warm-up; allowed: lower bound <= %.1f MB/h (%.0f MB/h + %.0f MB over the window)",
			slope, lo, hi, window*3600, allowed, trendPerHour, trendSlack)}
}

// blackholeCheck judges the kernel's MPTCP blackhole detection in the
// client: Soak turns it off there (the soak's default-path faults drop
// MP_CAPABLE SYNs on purpose), so a sample that shows MPTCP disabled, or a
// connection the detection made plain TCP (the agent's fallback counter,
// MPCapableSYNTXDisabled), means the soak did not test what it claims
// (connections without detours) and fails it. A connection that falls
// back at its last SYN retry (MPCapableSYNTXDrop) is not counted here.
func blackholeCheck(rep *SoakReport) SoakCheck {
	n, disabled := len(rep.Samples), 0
	for _, s := range rep.Samples {
		if s.Agent.MPTCPDisabled > 0 {
			disabled++
		}
	}
	fallbacks := rep.Samples[n-1].Agent.MPTCPFallbacks - rep.Samples[0].Agent.MPTCPFallbacks
	return SoakCheck{Name: "MPTCP blackhole fallback", OK: disabled == 0 && fallbacks == 0,
		Detail: fmt.Sprintf("the kernel had MPTCP disabled for new connections in %d of %d samples; %.0f connections made plain TCP (no detours) from the first sample to the last; want 0 and 0 (the detection is off in the client)", disabled, n, fallbacks)}
}
