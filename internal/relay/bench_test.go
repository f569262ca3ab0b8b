package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// BenchmarkRelayReport measures what docs/relay.md reports: grants per
// second, relay RSS and nft state at 100,000 mappings, TCP goodput through
// the relay with 1 and 100,000 mappings, and NAT versus plain routing. One
// run takes about a minute (it is a report, not a loop: -benchtime 1x):
//
//	go test -run '^$' -bench RelayReport -benchtime 1x -v ./internal/relay
func BenchmarkRelayReport(tb *testing.B) {
	t := tb
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft", "iperf3")
	total := 100000
	if v, err := strconv.Atoi(os.Getenv("MPDETOUR_BENCH_MAPPINGS")); err == nil {
		total = v
	}
	rounds := 15
	if v, err := strconv.Atoi(os.Getenv("MPDETOUR_BENCH_ROUNDS")); err == nil {
		rounds = v
	}
	if v := os.Getenv("MPDETOUR_BENCH_SECONDS"); v != "" {
		benchSeconds = v
	}
	// Two identical client-relay-server lines: relay A holds one mapping,
	// relay B the same plus total-1 others, so runs can alternate between
	// them (this host is shared and its load drifts).
	ctx := context.Background()
	server := netip.MustParseAddrPort(fxServer + ":5201")
	extra := ""
	if os.Getenv("MPDETOUR_BENCH_FAST_PATH") == "1" {
		extra = "fast_path: true\n" // both relays
	}
	var lines [2]*benchLine
	for i := range lines {
		lines[i] = newBenchLine(t, extra)
	}
	a, b := lines[0], lines[1]
	// Plain routing (line A) needs a way back from the server.
	netnstest.MustRun(t, "ip", "-n", a.f.Server, "route", "add", "10.0.1.0/24", "via", fxRelayServer)
	rssBefore := procStatus(t, b.p.cmd.Process.Pid, "VmRSS")

	// Baseline: both relays with one mapping, run at the same time. The
	// two lines are built identically but need not perform identically
	// (CPU placement of their softirq work): the 100k comparison below is
	// divided by this baseline.
	var pN0 []float64
	for i := 0; i < rounds; i++ {
		g := iperfConcurrent(t, [][2]any{{a.f.Client, a.d}, {b.f.Client, b.d}})
		pN0 = append(pN0, g[1]/g[0])
	}

	// Fill relay B: two client addresses (a client address has 64k ports).
	c3 := dialRelayFrom(t, b.f.Client, b.k, "10.0.1.3")
	var done atomic.Int64
	var failed atomic.Int64
	cpu0 := procCPU(t, b.p.cmd.Process.Pid)
	start := time.Now()
	var wg sync.WaitGroup
	per := (total - 1 + 1) / 2
	for ci, c := range []*relayconn.Conn{b.c1, c3} {
		jobs := make(chan int)
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range jobs {
					srv := netip.AddrPortFrom(netip.MustParseAddr(fxServer), uint16(10000+j))
					gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					if _, _, err := c.Grant(gctx, srv, 0); err != nil {
						if failed.Add(1) < 5 {
							t.Logf("grant %d/%d: %v", ci, j, err)
						}
					} else {
						done.Add(1)
					}
					cancel()
				}
			}()
		}
		go func() {
			for j := 0; j < per; j++ {
				jobs <- j
			}
			close(jobs)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	relayCPU := procCPU(t, b.p.cmd.Process.Pid) - cpu0
	rate := float64(done.Load()) / elapsed.Seconds()
	t.Logf("grants: %d ok, %d failed in %v: %.0f grants/s (64 requests in flight, 2 client addresses); relay CPU %.2f s = %.0f grants per relay CPU-second",
		done.Load(), failed.Load(), elapsed.Round(time.Millisecond), rate, relayCPU.Seconds(), float64(done.Load())/relayCPU.Seconds())

	n := elements(t, b.f.Relay)
	rss := procStatus(t, b.p.cmd.Process.Pid, "VmRSS")
	out, _ := nftList(t, b.f.Relay, "list", "table", "ip", TableName)
	t.Logf("relay B at %d mappings: VmRSS %s (%s with 1 mapping), `nft list table` %d bytes", n, rss, rssBefore, len(out))

	var nat1, natN, plain, c1, cN, cP []float64
	_ = iperfGbps(t, a.f.Client, a.d) // warm-up (ARP, conntrack, page cache)
	_ = iperfGbps(t, b.f.Client, b.d)
	for i := 0; i < rounds; i++ {
		g, c := iperfRun(t, a.f.Client, a.d)
		nat1, c1 = append(nat1, g), append(c1, c)
		g, c = iperfRun(t, b.f.Client, b.d)
		natN, cN = append(natN, g), append(cN, c)
		g, c = iperfRun(t, a.f.Client, server)
		plain, cP = append(plain, g), append(cP, c)
	}
	t.Logf("CPU-seconds per GB (sender+receiver), medians: NAT 1 mapping %.3f; NAT %d mappings %.3f; plain %.3f",
		median(c1), n, median(cN), median(cP))
	// Concurrent pairs: both transfers of a pair run at the same time and
	// so see the same load from the rest of the host; with the CPU as the
	// bottleneck, their goodput ratio is the inverse of their cost ratio.
	var pN, pP []float64
	plain2 := netip.AddrPortFrom(server.Addr(), 5202)
	for i := 0; i < rounds; i++ {
		g := iperfConcurrent(t, [][2]any{{a.f.Client, a.d}, {b.f.Client, b.d}})
		pN = append(pN, g[1]/g[0])
		g = iperfConcurrent(t, [][2]any{{a.f.Client, a.d}, {a.f.Client, plain2}})
		pP = append(pP, g[0]/g[1])
	}
	t.Logf("concurrent pairs (%d rounds of %s s): relay B / relay A goodput with 1 mapping each %.3f (median %.3f), with %d mappings in B %.3f (median %.3f): %d vs 1 mapping %.3f; NAT / plain routing %.3f (median %.3f)",
		rounds, benchSeconds, pN0, median(pN0), n, pN, median(pN), n, median(pN)/median(pN0), pP, median(pP))
	m1, mN, mp := median(nat1), median(natN), median(plain)
	// Runs next to each other share the host's load: ratios per round.
	var rN, rP []float64
	for i := range nat1 {
		rN = append(rN, natN[i]/nat1[i])
		rP = append(rP, nat1[i]/plain[i])
	}
	t.Logf("goodput Gbit/s, medians of %d alternating %s-s runs (cubic): NAT 1 mapping %.2f %.2f; NAT %d mappings %.2f %.2f; plain routing %.2f %.2f",
		rounds, benchSeconds, m1, nat1, n, mN, natN, mp, plain)
	t.Logf("ratios of medians: %d vs 1 mapping %.3f; NAT vs plain routing %.3f", n, mN/m1, m1/mp)
	t.Logf("per-round ratios: %d vs 1 mapping %.3f (median %.3f); NAT vs plain %.3f (median %.3f)", n, rN, median(rN), rP, median(rP))
	fmt.Fprintf(os.Stderr, "BENCH grants_per_s=%.0f mappings=%d rss=%q rss1=%q nft_bytes=%d gbps_nat1=%.2f gbps_natN=%.2f gbps_plain=%.2f ratioN=%.3f ratioP=%.3f cpu1=%.3f cpuN=%.3f cpuP=%.3f pairN0=%.3f pairN=%.3f pairP=%.3f\n",
		rate, n, rss, rssBefore, len(out), m1, mN, mp, median(rN), median(rP), median(c1), median(cN), median(cP), median(pN0), median(pN), median(pP))
}

// benchLine is a client-relay-server line for benchmarks: a relay (config
// extra added) with one mapping to the server's iperf3 on 5201, a second
// iperf3 on 5202 for plain routing at the same time, and the client's
// second address 10.0.1.3.
type benchLine struct {
	f   *fixture
	p   *relayProc
	k   keys
	d   netip.AddrPort
	c1  *relayconn.Conn
	cfg string
}

func newBenchLine(t testing.TB, extra string) *benchLine {
	t.Helper()
	l := &benchLine{f: newFixture(t), k: newKeys(t)}
	netnstest.MustRun(t, "ip", "-n", l.f.Client, "addr", "add", "10.0.1.3/24", "dev", "c0")
	l.cfg = filepath.Join(t.TempDir(), "relay.yaml")
	writeConfig(t, l.cfg, l.k, "quota: {per_member: 200000, global: 200000}\nrate: {per_member: 1000000, burst: 1000000}\nlease: 1h\n"+extra)
	b, _ := os.ReadFile(l.cfg)
	_ = os.WriteFile(l.cfg, []byte(strings.Replace(string(b), "ports: 40000-40999", "ports: 1024-65535", 1)), 0o600)
	// 5201 behind the mapping; 5202 for plain routing run at the same
	// time (one iperf3 server serves one test at a time).
	for _, port := range []string{"5201", "5202"} {
		iperf := exec.Command("ip", "netns", "exec", l.f.Server, "iperf3", "-s", "-p", port)
		if err := iperf.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = iperf.Process.Kill(); _ = iperf.Wait() })
	}
	l.p = startRelay(t, l.f.Relay, l.cfg)
	l.c1 = dialRelayFrom(t, l.f.Client, l.k, fxClient)
	var err error
	if l.d, _, err = l.c1.Grant(context.Background(), netip.MustParseAddrPort(fxServer+":5201"), 0); err != nil {
		t.Fatal(err)
	}
	return l
}

func dialRelayFrom(t testing.TB, ns string, k keys, addr string) *relayconn.Conn {
	t.Helper()
	c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: relayAddr(), PublicKey: k.relay.Public()}, k.member,
		relayconn.Options{ListenPacket: func() (net.PacketConn, error) { return udpIn(t, ns, addr+":0"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// iperfRun runs one iperf3 transfer and returns goodput and CPU cost
// (CPU-seconds of sender and receiver per GB, from iperf3's own rusage
// accounting: less sensitive than goodput to other load on the host).
func iperfRun(t testing.TB, ns string, to netip.AddrPort) (gbps, cpuPerGB float64) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "iperf3", "-c", to.Addr().String(), "-p", strconv.Itoa(int(to.Port())),
		"-t", benchSeconds, "-C", "cubic", "-J").Output()
	if err != nil {
		t.Fatalf("iperf3 to %v: %v\n%s", to, err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				Bytes         float64 `json:"bytes"`
				Seconds       float64 `json:"seconds"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			CPU struct {
				Host   float64 `json:"host_total"`
				Remote float64 `json:"remote_total"`
			} `json:"cpu_utilization_percent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	e := r.End
	cpu := (e.CPU.Host + e.CPU.Remote) / 100 * e.SumReceived.Seconds
	return e.SumReceived.BitsPerSecond / 1e9, cpu / (e.SumReceived.Bytes / 1e9)
}

var benchSeconds = "1"

// iperfConcurrent starts one iperf3 client per {namespace, destination}
// at the same time and returns their goodputs in Gbit/s.
func iperfConcurrent(t testing.TB, runs [][2]any) []float64 {
	t.Helper()
	cmds := make([]*exec.Cmd, len(runs))
	outs := make([]*strings.Builder, len(runs))
	for i, r := range runs {
		to := r[1].(netip.AddrPort)
		cmds[i] = exec.Command("ip", "netns", "exec", r[0].(string), "iperf3", "-c", to.Addr().String(), "-p", strconv.Itoa(int(to.Port())),
			"-t", benchSeconds, "-C", "cubic", "-J")
		outs[i] = &strings.Builder{}
		cmds[i].Stdout = outs[i]
	}
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	res := make([]float64, len(runs))
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("iperf3: %v\n%s", err, outs[i])
		}
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal([]byte(outs[i].String()), &r); err != nil {
			t.Fatal(err)
		}
		res[i] = r.End.SumReceived.BitsPerSecond / 1e9
	}
	return res
}

func iperfGbps(t testing.TB, ns string, to netip.AddrPort) float64 {
	g, _ := iperfRun(t, ns, to)
	return g
}

// procCPU is the user+system CPU time of a process (including the kernel
// work its syscalls do, such as nftables transactions).
func procCPU(t testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func procStatus(t testing.TB, pid int, field string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			return strings.TrimSpace(strings.TrimPrefix(l, field+":"))
		}
	}
	return "?"
}
