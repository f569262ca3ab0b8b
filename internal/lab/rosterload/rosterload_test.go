// Package rosterload measures what agents reading rosters cost one relay
// (issue 30, item 2): a real relay process (gossip on, roster served from
// its snapshot) in a namespace of its own, and sessions of listed members
// sending digest reads (OpRoster with the digest they hold: the agent's
// steady state, discovery.interval 500 ms) at the rate A agents would
// send them. Reported: the relay process's CPU (from /proc), bytes/s on
// the wire (UDP payload and IP/UDP headers), read latency (p50, p99, max).
//
// Run (root; heavy: under the lock; the report is docs/results/roster):
//
//	MPDETOUR_ROSTER_LOAD=2000,10000,100000 flock /work/runs/heavy.lock \
//	    go test -count=1 -run TestRosterLoad -v ./internal/lab/rosterload
package rosterload

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/relayd"
	"github.com/mpdetour/mpdetour/internal/roster"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// The relay runs as a separate process (its CPU is measured apart from
// the load generator's): this test binary, when ROSTERLOAD_RELAY_CONFIG
// is set.
func TestMain(m *testing.M) {
	if cfg := os.Getenv("ROSTERLOAD_RELAY_CONFIG"); cfg != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := relayd.Run(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), nil)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	sessions = 64                     // member sessions carrying the load
	interval = 500 * time.Millisecond // the agent's discovery.interval
	window   = 20 * time.Second       // measured per load level
	timeout  = time.Second            // a read not answered by then counts as lost
)

// Result is one load level.
type Result struct {
	Agents         int     `json:"agents"`
	Interval       string  `json:"interval"`
	OfferedPerSec  float64 `json:"offered_reads_per_s"`
	AnsweredPerSec float64 `json:"answered_reads_per_s"`
	NotSent        uint64  `json:"not_sent"` // the generator fell behind (64 outstanding on a session)
	Lost           uint64  `json:"lost"`     // not answered within 1 s, or refused
	RelayCores     float64 `json:"relay_cores"`
	GenCores       float64 `json:"generator_cores"`
	CPUPerReadUs   float64 `json:"relay_cpu_per_read_us"`
	BytesPerSecIn  float64 `json:"relay_bytes_per_s_in"`
	BytesPerSecOut float64 `json:"relay_bytes_per_s_out"`
	P50Ms          float64 `json:"p50_ms"`
	P99Ms          float64 `json:"p99_ms"`
	MaxMs          float64 `json:"max_ms"`
	Load           string  `json:"loadavg_after"`
}

func TestRosterLoad(t *testing.T) {
	spec := os.Getenv("MPDETOUR_ROSTER_LOAD")
	if spec == "" {
		t.Skip("a benchmark: set MPDETOUR_ROSTER_LOAD=agents[,agents...] (docs/results/roster)")
	}
	testenv.Root(t)
	var levels []int
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < sessions {
			t.Fatalf("MPDETOUR_ROSTER_LOAD: %q is not a number of agents >= %d", s, sessions)
		}
		levels = append(levels, n)
	}
	ns := netnstest.New(t, "rload")
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	rk, _ := proto.GenerateKey()
	now := time.Now()
	cert, err := auth.Issue(rk.Public(), "relay-under-load", collective.RoleRelay, now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var members strings.Builder
	keys := make([]proto.Key, sessions)
	for i := range keys {
		keys[i], _ = proto.GenerateKey()
		fmt.Fprintf(&members, "  - {name: m%d, public_key: %s}\n", i, keys[i].Public())
	}
	// The per-member request rate is raised: each session here carries
	// the reads of many agents (a real agent sends 2 a second).
	cfg := write("relay.yaml", fmt.Sprintf(`listen: 127.0.0.1:45673
private_key: %s
ports: 40000-40999
rate: {per_member: 1000000, burst: 100000}
members:
%scollective:
  authority: %s
  certificate_file: %s
  gossip:
    bind: 127.0.0.1:45675
    secret_file: %s
`, rk, members.String(), auth.Public(), write("relay.cert", cert.String()), write("gossip.key", roster.NewSecret())))
	cmd := exec.Command("ip", "netns", "exec", ns.Name, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ROSTERLOAD_RELAY_CONFIG="+cfg)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid // ip execs the relay: same process

	rel := relayconn.Relay{Name: "relay", Addr: netip.MustParseAddrPort("127.0.0.1:45673"), PublicKey: rk.Public()}
	conns := make([]*relayconn.Conn, sessions)
	for i := range conns {
		c, err := relayconn.Dial(rel, keys[i], relayconn.Options{ListenPacket: func() (net.PacketConn, error) {
			var pc net.PacketConn
			err := ns.Do(func() error {
				var err error
				pc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
				return err
			})
			return pc, err
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	// Every session reads the roster once (handshake, digest).
	var digest uint64
	deadline := time.Now().Add(30 * time.Second)
	for i, c := range conns {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r, err := c.RosterSince(ctx, 256, 0, true)
			cancel()
			if err == nil && r.Digest != 0 {
				digest = r.Digest
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %d: no roster: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	reqLen, repLen := wireLens(t, digest)
	t.Logf("relay pid %d; %d sessions up; digest read: %d B request, %d B reply on the wire", pid, sessions, reqLen, repLen)

	var results []Result
	for _, agents := range levels {
		res := run(t, conns, agents, digest, pid)
		res.BytesPerSecIn = res.AnsweredPerSec * float64(reqLen) // requests that got an answer reached the relay
		res.BytesPerSecOut = res.AnsweredPerSec * float64(repLen)
		t.Logf("%d agents (%.0f reads/s offered): answered %.0f/s, not sent %d, lost %d; relay %.3f cores (%.1f us a read), generator %.2f cores; in %.0f B/s, out %.0f B/s; latency p50 %.2f ms, p99 %.2f ms, max %.1f ms; load %s",
			agents, res.OfferedPerSec, res.AnsweredPerSec, res.NotSent, res.Lost, res.RelayCores, res.CPUPerReadUs, res.GenCores,
			res.BytesPerSecIn, res.BytesPerSecOut, res.P50Ms, res.P99Ms, res.MaxMs, res.Load)
		results = append(results, res)
	}
	if out := os.Getenv("MPDETOUR_ROSTER_LOAD_OUT"); out != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// run offers agents/interval digest reads per second, spread evenly over
// the sessions (open loop: each read leaves on its schedule whatever the
// earlier ones did), for window.
func run(t *testing.T, conns []*relayconn.Conn, agents int, digest uint64, pid int) Result {
	rate := float64(agents) / interval.Seconds()
	per := time.Duration(float64(len(conns)) / rate * float64(time.Second)) // one session's spacing
	var notSent, lost, answered atomic.Uint64
	lat := make([][]time.Duration, len(conns))
	relay0, gen0, t0 := cpuTicks(t, pid), cpuTicks(t, os.Getpid()), time.Now()
	end := t0.Add(window)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mu sync.Mutex
			var inflight atomic.Int32
			var rw sync.WaitGroup
			next := t0.Add(time.Duration(float64(per) * float64(i) / float64(len(conns)))) // phases spread
			for next.Before(end) {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				at := next
				next = next.Add(per)
				if inflight.Load() >= 64 {
					notSent.Add(1)
					continue
				}
				inflight.Add(1)
				rw.Add(1)
				go func() {
					defer rw.Done()
					defer inflight.Add(-1)
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					rep, err := c.Do(ctx, proto.Request{Op: proto.OpRoster, Body: &proto.RosterRequest{Have: digest, HasDigest: true}})
					cancel()
					rr, _ := rep.Body.(*proto.RosterReply)
					if err != nil || rep.Reason != 0 || rr == nil || rr.Roster.Digest != digest {
						lost.Add(1)
						return
					}
					d := time.Since(at) // from its schedule: a generator running late counts
					answered.Add(1)
					mu.Lock()
					lat[i] = append(lat[i], d)
					mu.Unlock()
				}()
			}
			rw.Wait()
		}()
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	relayTicks, genTicks := cpuTicks(t, pid)-relay0, cpuTicks(t, os.Getpid())-gen0
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	q := func(p float64) float64 {
		if len(all) == 0 {
			return math.NaN()
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / 1e6
	}
	la, _ := os.ReadFile("/proc/loadavg")
	res := Result{Agents: agents, Interval: interval.String(), OfferedPerSec: rate, AnsweredPerSec: float64(answered.Load()) / secs,
		NotSent: notSent.Load(), Lost: lost.Load(), RelayCores: float64(relayTicks) / 100 / secs, GenCores: float64(genTicks) / 100 / secs,
		P50Ms: q(0.50), P99Ms: q(0.99), MaxMs: q(1), Load: strings.Join(strings.Fields(string(la))[:3], " ")}
	if answered.Load() > 0 {
		res.CPUPerReadUs = float64(relayTicks) / 100 / float64(answered.Load()) * 1e6
	}
	return res
}

// cpuTicks is a process's user+system CPU time in clock ticks (1/100 s).
func cpuTicks(t *testing.T, pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return u + s
}

// wireLens: a digest read's request and "unchanged" reply as IPv4 packets
// (20 IP + 8 UDP + 16 transport header + message + 16 tag).
func wireLens(t *testing.T, digest uint64) (int, int) {
	req, err := proto.MarshalRequest(proto.Request{Op: proto.OpRoster, Body: &proto.RosterRequest{Have: digest, HasDigest: true}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := proto.MarshalReply(proto.Reply{Op: proto.OpRoster, Body: &proto.RosterReply{Roster: proto.RosterPage{Total: 1, Digest: digest}}})
	if err != nil {
		t.Fatal(err)
	}
	return 20 + 8 + 16 + len(req) + 16, 20 + 8 + 16 + len(rep) + 16
}
