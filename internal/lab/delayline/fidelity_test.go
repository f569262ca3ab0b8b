package delayline

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// The fidelity report runs the delay line as a separate process (this test
// binary re-executed) so that its CPU time can be read from /proc, as the
// lab runs it.
const (
	childStateEnv = "DELAYLINE_CHILD_STATE"
	childStatsEnv = "DELAYLINE_CHILD_STATS"
	childPrioEnv  = "DELAYLINE_CHILD_PRIORITY"
	// childCommandEnv runs the "delayline" subcommand with this state file.
	childCommandEnv = "DELAYLINE_CHILD_COMMAND"
)

func TestMain(m *testing.M) {
	if state := os.Getenv(childStateEnv); state != "" {
		os.Exit(childMain(state, os.Getenv(childStatsEnv)))
	}
	if state := os.Getenv(childCommandEnv); state != "" {
		// As main does: SIGTERM cancels the command's context.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := runCommand(ctx, state)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func childMain(state, statsPath string) int {
	data, err := os.ReadFile(state)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := SetPriority(Priority(os.Getenv(childPrioEnv))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := New(cfg, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(os.Stderr, "ready")
	if err := l.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b, _ := json.Marshal(l.Stats())
	if err := os.WriteFile(statsPath, b, 0o644); err != nil {
		return 1
	}
	return 0
}

type child struct {
	cmd   *exec.Cmd
	stats string
}

func startChild(t testing.TB, cfg Config) *child {
	t.Helper()
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(state, b, 0o644); err != nil {
		t.Fatal(err)
	}
	c := &child{stats: filepath.Join(dir, "stats.json")}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childStateEnv+"="+state, childStatsEnv+"="+c.stats, childPrioEnv+"="+reportPriority())
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	sc := bufio.NewScanner(stderr)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("delay line child: %q", sc.Text())
	}
	go func() {
		for sc.Scan() {
			t.Logf("delay line child: %s", sc.Text())
		}
	}()
	return c
}

// cpu is the child's user+system CPU time so far.
func (c *child) cpu(t testing.TB) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ = 100
}

func (c *child) stop(t testing.TB) []Stats {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("delay line child: %v", err)
	}
	b, err := os.ReadFile(c.stats)
	if err != nil {
		t.Fatal(err)
	}
	var s []Stats
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// flow runs one goodput measurement from src to dst (both in their own
// namespace) over port.
func flow(t testing.TB, src, dst *netnstest.NS, dstAddr string, port int, d time.Duration) (*benchtool.Result, error) {
	addr := fmt.Sprintf("%s:%d", dstAddr, port)
	srv, err := benchtool.Listen(benchtool.ServeOptions{Addr: addr, Netns: dst.Path})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	return benchtool.Send(ctx, benchtool.SendOptions{Addr: addr, Duration: d, Netns: src.Path})
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

// idealMbps is TCP payload at rate: 1448 payload bytes (MSS with
// timestamps) per 1514-byte frame, which is what tbf counts.
func idealMbps(rate float64) float64 { return rate * 1448 / 1514 }

func sumStats(ss []Stats) (pk, drops, late1 uint64, mean, maxLate time.Duration) {
	var lateSum float64
	for _, s := range ss {
		pk += s.Packets
		drops += s.DropFull + s.DropOversize + s.SendErrors + s.KernelDrops
		late1 += s.Late1ms
		lateSum += float64(s.LateMean) * float64(s.Packets)
		maxLate = max(maxLate, s.LateMax)
	}
	if pk > 0 {
		mean = time.Duration(lateSum / float64(pk))
	}
	return
}

// BenchmarkFidelityReport measures the table in docs/lab.md ("Delay
// line"), written to $MPDETOUR_FIDELITY (default: the benchmark log). One
// run takes about two minutes (a report, not a loop: -benchtime 1x):
//
//	MPDETOUR_FIDELITY=/tmp/fidelity.md go test -run '^$' -bench FidelityReport -benchtime 1x -timeout 10m ./internal/lab/delayline/
func BenchmarkFidelityReport(b *testing.B) {
	t := b
	out := os.Getenv("MPDETOUR_FIDELITY")
	testenv.Root(t)
	var md strings.Builder
	fmt.Fprintf(&md, "Measured %s, kernel %s, %d CPUs, load average at start %s, delay line priority %s, transfers 10 s, goodput from t=1 s, cubic.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), kernel(), numCPU(), loadavg(), reportPriority())

	// RTT on an idle link.
	md.WriteString("| one-way delay | RTT spec | min | median | p99 | max | target | ok |\n|---|---|---|---|---|---|---|---|\n")
	for _, d := range []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
		if !only("rtt") {
			break
		}
		t.Run("rtt", func(t *testing.B) {
			w := newWire(t, d, d)
			c := startChild(t, w.cfg)
			pingRTTs(t, w.A, addrB, 1, 0)
			r := pingRTTs(t, w.A, addrB, 200, 10*time.Millisecond)
			c.stop(t)
			spec := 2 * d
			tol := max(time.Millisecond, spec*3/100)
			med := median(r)
			ok := med-spec <= tol && spec-med <= tol
			fmt.Fprintf(&md, "| %v | %v | %s | %s | %s | %s | ±%s | %v |\n", d, spec, ms(slices.Min(r)), ms(med), ms(pct(r, 0.99)), ms(slices.Max(r)), ms(tol), yes(ok))
		})
	}

	// Goodput through tbf alone, then through tbf and the delay line.
	md.WriteString("\n| rate | one-way delay | tbf queue | goodput Mbit/s | % of ideal payload rate | % of no-delay baseline | delay line CPU | drops | late > 1 ms |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, rate := range []float64{10, 100} {
		if !only("goodput") {
			break
		}
		var base float64
		for _, d := range []time.Duration{0, 5 * time.Millisecond, 50 * time.Millisecond} {
			t.Run("goodput", func(t *testing.B) {
				// Queue: the lab's default 100 frames, or the BDP when larger.
				q := max(100, int(rate*1e6/8*(2*d).Seconds()/1514))
				var src, dst *netnstest.NS
				var c *child
				if d == 0 {
					testenv.Root(t)
					src, dst = netnstest.New(t, "tdA"), netnstest.New(t, "tdB")
					netnstest.Veth(t, src, "eth0", dst, "eth0")
					src.Addr(t, "eth0", addrA+"/24")
					dst.Addr(t, "eth0", addrB+"/24")
				} else {
					w := newWire(t, d, d)
					src, dst = w.A, w.B
					c = startChild(t, w.cfg)
				}
				src.Tbf(t, "eth0", uint64(rate*1e6), uint32(q*1514))
				var cpu0 time.Duration
				if c != nil {
					cpu0 = c.cpu(t)
				}
				t0 := time.Now()
				r, err := flow(t, src, dst, addrB, 5201, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				cpuS, dropS, lateS := "-", "-", "-"
				if c != nil {
					cpuS = fmt.Sprintf("%.1f%%", 100*float64(c.cpu(t)-cpu0)/float64(time.Since(t0)))
					_, drops, late1, _, _ := sumStats(c.stop(t))
					dropS, lateS = fmt.Sprint(drops), fmt.Sprint(late1)
				}
				if d == 0 {
					base = r.Goodput
				}
				fmt.Fprintf(&md, "| %.0f Mbit/s | %v | %d | %.3f | %.1f | %.1f | %s | %s | %s |\n", rate, d, q, r.Goodput,
					100*r.Goodput/idealMbps(rate), 100*r.Goodput/base, cpuS, dropS, lateS)
			})
		}
	}

	// Full load: 12 delayed directions (6 links, 5 ms, 3 at 20 and 3 at
	// 10 Mbit/s as brennan2017 core-limited), a bulk flow in each direction
	// of each link, plus an unshaped 7th link that only carries pings.
	md.WriteString("\n| load | flows | mean goodput % of ideal | worst flow | retransmits | delay line CPU (% of one core) | frames | drops | release late mean | max | late > 1 ms | idle-link RTT median (spec 10 ms) | p99 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, lc := range []struct {
		dirs int
		hog  bool
	}{{1, false}, {1, true}, {2, false}, {2, true}} {
		if !only("load") {
			break
		}
		hog := lc.hog
		t.Run("load", func(t *testing.B) {
			ws := newWires(t, 7, 5*time.Millisecond, 5*time.Millisecond)
			rates := []float64{20, 20, 20, 10, 10, 10}
			for i, r := range rates {
				ws[i].A.Tbf(t, "eth0", uint64(r*1e6), 100*1514)
				ws[i].B.Tbf(t, "eth0", uint64(r*1e6), 100*1514)
			}
			c := startChild(t, ws[0].cfg)
			pingRTTs(t, ws[6].A, addrB, 1, 0)
			if hog {
				for range 2 {
					h := exec.Command("sh", "-c", "while :; do :; done")
					if err := h.Start(); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = h.Process.Kill(); _ = h.Wait() })
				}
			}
			cpu0, t0 := c.cpu(t), time.Now()
			var mu sync.Mutex
			var pcts []float64
			var retrans uint64
			var wg sync.WaitGroup
			for i, rate := range rates {
				for dir := range lc.dirs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						src, dst, to := ws[i].A, ws[i].B, addrB
						if dir == 1 {
							src, dst, to = ws[i].B, ws[i].A, addrA
						}
						r, err := flow(t, src, dst, to, 5201+dir, 10*time.Second)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						pcts = append(pcts, 100*r.Goodput/idealMbps(rate))
						retrans += r.Retransmits
						mu.Unlock()
					}()
				}
			}
			time.Sleep(2 * time.Second)
			rtts := pingRTTs(t, ws[6].A, addrB, 500, 10*time.Millisecond)
			wg.Wait()
			cpu := 100 * float64(c.cpu(t)-cpu0) / float64(time.Since(t0))
			pk, drops, late1, mean, maxLate := sumStats(c.stop(t))
			var sum float64
			for _, p := range pcts {
				sum += p
			}
			name := "bulk A->B on each link, ACKs back"
			if lc.dirs == 2 {
				name = "bulk both ways on each link"
			}
			if hog {
				name += " + 2 busy-loop processes"
			}
			fmt.Fprintf(&md, "| %s | %d | %.1f | %.1f | %d | %.0f%% | %d | %d | %s µs | %s ms | %d | %s | %s |\n", name, len(pcts), sum/float64(len(pcts)),
				slices.Min(pcts), retrans, cpu, pk, drops, fmt.Sprintf("%.0f", float64(mean)/1e3), ms(maxLate), late1, ms(median(rtts)), ms(pct(rtts, 0.99)))
		})
	}
	// Throughput ceiling: one unshaped TCP flow through a 1 ms delay line.
	if only("max") {
		t.Run("max", func(t *testing.B) {
			w := newWire(t, time.Millisecond, time.Millisecond)
			c := startChild(t, w.cfg)
			cpu0, t0 := c.cpu(t), time.Now()
			r, err := flow(t, w.A, w.B, addrB, 5201, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			cpu := 100 * float64(c.cpu(t)-cpu0) / float64(time.Since(t0))
			pk, drops, late1, mean, _ := sumStats(c.stop(t))
			fmt.Fprintf(&md, "\nUnshaped TCP through a 1 ms delay line (throughput ceiling): %.0f Mbit/s, %d frames (%.0f frames/s both directions), delay line CPU %.0f%% of one core, %d drops, release late mean %.0f µs, %d frames late > 1 ms, %d retransmits.\n",
				r.Goodput, pk, float64(pk)/time.Since(t0).Seconds(), cpu, drops, float64(mean)/1e3, late1, r.Retransmits)
		})
	}
	defer func() {
		fmt.Fprintf(&md, "\nLoad average at the end: %s.\n", loadavg())
		if out != "" {
			if err := os.WriteFile(out, []byte(md.String()), 0o644); err != nil {
				t.Error(err)
			}
		}
		t.Logf("\n%s", md.String())
	}()
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// reportPriority is the delay line priority the report measures
// (MPDETOUR_FIDELITY_PRIORITY, default what Run uses).
func reportPriority() string {
	if p := os.Getenv("MPDETOUR_FIDELITY_PRIORITY"); p != "" {
		return p
	}
	return string(DefaultPriority)
}

// only reports whether the report section should run
// (MPDETOUR_FIDELITY_ONLY=rtt,goodput,load; default all).
func only(section string) bool {
	o := os.Getenv("MPDETOUR_FIDELITY_ONLY")
	return o == "" || slices.Contains(strings.Split(o, ","), section)
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}
