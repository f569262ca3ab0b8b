package relay

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// BenchmarkRelayFastPath measures what docs/relay.md reports under "NAT
// fast path": TCP goodput through relay A (fast_path: false: per-packet
// nftables accounting) and relay B (fast_path: true: flowtable where the
// kernel has one, attribution through conntrack accounting) against plain
// routing through the same relay namespaces (unshaped veths, no NAT),
// alternating, plus host CPU per Gbit/s:
//
//	go test -run '^$' -bench RelayFastPath -benchtime 1x -v ./internal/relay
//
// MPDETOUR_BENCH_ROUNDS (default 9) and MPDETOUR_BENCH_SECONDS (default 1) as for
// BenchmarkRelayReport.
func BenchmarkRelayFastPath(tb *testing.B) {
	t := tb
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft", "iperf3")
	rounds := 9
	if v, err := strconv.Atoi(os.Getenv("MPDETOUR_BENCH_ROUNDS")); err == nil {
		rounds = v
	}
	if v := os.Getenv("MPDETOUR_BENCH_SECONDS"); v != "" {
		benchSeconds = v
	}
	a, b := newBenchLine(t, ""), newBenchLine(t, "fast_path: true\n")
	for _, l := range []*benchLine{a, b} {
		netnstest.MustRun(t, "ip", "-n", l.f.Server, "route", "add", "10.0.1.0/24", "via", fxRelayServer)
	}
	waitFor(t, "relay B's fast path", func() bool { return strings.Contains(b.p.stderr.String(), "fast path") })
	offload := strings.Contains(b.p.stderr.String(), "flowtable installed")
	t.Logf("relay B flowtable installed: %v", offload)
	plainA := netip.AddrPortFrom(netip.MustParseAddr(fxServer), 5202)
	plainB := plainA

	type conf struct {
		name string
		ns   string
		to   netip.AddrPort
	}
	confs := []conf{
		{"NAT, nft accounting (fast_path: false)", a.f.Client, a.d},
		{"NAT, fast_path: true", b.f.Client, b.d},
		{"plain routing via relay A", a.f.Client, plainA},
		{"plain routing via relay B", b.f.Client, plainB},
	}
	for _, c := range confs { // warm-up (ARP, conntrack, page cache)
		_, _ = iperfRun(t, c.ns, c.to)
	}
	gbps := make([][]float64, len(confs))
	cpuGB := make([][]float64, len(confs))
	coresPerG := make([][]float64, len(confs))
	for r := 0; r < rounds; r++ {
		for k := range confs {
			i := (k + r) % len(confs) // rotate the order: no configuration always runs first
			c := confs[i]
			busy0, t0 := hostBusy(t), time.Now()
			g, cpu := iperfRun(t, c.ns, c.to)
			cores := (hostBusy(t) - busy0).Seconds() / time.Since(t0).Seconds()
			gbps[i] = append(gbps[i], g)
			cpuGB[i] = append(cpuGB[i], cpu)
			coresPerG[i] = append(coresPerG[i], cores/g)
		}
	}
	for i, c := range confs {
		t.Logf("%-40s goodput median %.2f Gbit/s %.2f; iperf3 CPU-s/GB %.3f; host cores per Gbit/s %.4f",
			c.name, median(gbps[i]), gbps[i], median(cpuGB[i]), median(coresPerG[i]))
	}
	ratio := func(x, y int) (float64, []float64) {
		var rs []float64
		for r := range gbps[x] {
			rs = append(rs, gbps[x][r]/gbps[y][r])
		}
		return median(rs), rs
	}
	rA, rAs := ratio(0, 2)
	rB, rBs := ratio(1, 3)
	rBA, _ := ratio(1, 0)
	rPP, _ := ratio(3, 2)
	t.Logf("per-round goodput ratios (medians): NAT/plain A %.3f %.3f; NAT/plain B %.3f %.3f; fast/nft NAT %.3f; plain B/plain A %.3f",
		rA, rAs, rB, rBs, rBA, rPP)

	// Concurrent pairs: NAT and plain routing through the same relay at
	// the same time see the same load; with the CPU as the bottleneck
	// their goodput ratio is the inverse of their cost ratio.
	var pA, pB []float64
	for r := 0; r < rounds; r++ {
		g := iperfConcurrent(t, [][2]any{{a.f.Client, a.d}, {a.f.Client, plainA}})
		pA = append(pA, g[0]/g[1])
		g = iperfConcurrent(t, [][2]any{{b.f.Client, b.d}, {b.f.Client, plainB}})
		pB = append(pB, g[0]/g[1])
	}
	t.Logf("concurrent pairs NAT/plain: relay A %.3f (median %.3f); relay B %.3f (median %.3f)", pA, median(pA), pB, median(pB))
	fmt.Fprintf(os.Stderr, "BENCH offload=%v rounds=%d seconds=%s gbps_nat=%.2f gbps_fast=%.2f gbps_plainA=%.2f gbps_plainB=%.2f ratio_nat=%.3f ratio_fast=%.3f fast_vs_nat=%.3f pair_nat=%.3f pair_fast=%.3f cpuGB_nat=%.3f cpuGB_fast=%.3f cpuGB_plainA=%.3f cpuGB_plainB=%.3f coresPerGbps_nat=%.4f coresPerGbps_fast=%.4f coresPerGbps_plainA=%.4f coresPerGbps_plainB=%.4f\n",
		offload, rounds, benchSeconds, median(gbps[0]), median(gbps[1]), median(gbps[2]), median(gbps[3]), rA, rB, rBA, median(pA), median(pB),
		median(cpuGB[0]), median(cpuGB[1]), median(cpuGB[2]), median(cpuGB[3]),
		median(coresPerG[0]), median(coresPerG[1]), median(coresPerG[2]), median(coresPerG[3]))
}

// hostBusy is the host's non-idle CPU time so far (all cores, /proc/stat:
// user, nice, system, irq, softirq, steal). On a shared host it includes
// other work; the benchmark reads it around each run.
func hostBusy(t testing.TB) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}
