package run_test

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// BenchmarkSocket measures socket()+close() inside the static probe: plain
// TCP, an explicit MPTCP socket (the kernel's own cost), TCP converted by the
// seccomp supervisor, and UDP under run (never leaves the kernel's filter).
// ns/socket is the probe's own timing, without process start-up.
func BenchmarkSocket(b *testing.B) {
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	for _, c := range []struct {
		name string
		run  bool
		kind string
	}{
		{"tcp", false, "tcp"},
		{"mptcp-explicit", false, "mptcp"},
		{"tcp-under-run", true, "tcp"},
		{"udp", false, "udp"},
		{"udp-under-run", true, "udp"},
	} {
		b.Run(c.name, func(b *testing.B) {
			argv := []string{sockprobe, "bench", strconv.Itoa(b.N), c.kind}
			if c.run {
				argv = append([]string{mpdetour, "run", "--mechanism", "seccomp", "--"}, argv...)
			}
			out, err := exec.Command(argv[0], argv[1:]...).Output()
			if err != nil {
				b.Fatal(err)
			}
			ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(ns, "ns/socket")
		})
	}
	b.Cleanup(func() { reapAndListSupervisors() })
}

// BenchmarkIperf3 measures loopback goodput in a fresh namespace (cubic set
// per socket by iperf3 -C) for plain TCP, MPTCP through the LD_PRELOAD
// converter and MPTCP through the seccomp supervisor: once the socket
// exists the supervisor is out of the data path, so the last two match.
func BenchmarkIperf3(b *testing.B) {
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	for _, mech := range []string{"none", "preload", "seccomp"} {
		b.Run(mech, func(b *testing.B) {
			ns := benchNS(b)
			var total float64
			for i := 0; i < b.N; i++ {
				total += iperfOnce(b, ns, mech)
			}
			b.ReportMetric(total/float64(b.N), "Mbit/s")
		})
	}
}

func benchNS(b *testing.B) string {
	return netnstest.New(b, "tu-bench").Name
}

func iperfOnce(b *testing.B, ns, mech string) float64 {
	wrap := func(argv ...string) *exec.Cmd {
		a := []string{"netns", "exec", ns}
		if mech != "none" {
			a = append(a, mpdetour, "run", "--mechanism", mech, "--")
		}
		return exec.Command("ip", append(a, argv...)...)
	}
	srv := wrap("iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", "7100")
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait(); reapAndListSupervisors() }()
	for try := 0; ; try++ {
		o, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-Hln", "sport", "=", ":7100").Output()
		if strings.TrimSpace(string(o)) != "" {
			break
		}
		if try > 200 {
			b.Fatal("iperf3 server did not listen")
		}
		time.Sleep(25 * time.Millisecond)
	}
	out, err := wrap("iperf3", "-c", "127.0.0.1", "-p", "7100", "-t", "3", "-C", "cubic", "-J").Output()
	if err != nil {
		b.Fatalf("iperf3: %v %s", err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				Bps float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatal(err)
	}
	return res.End.SumReceived.Bps / 1e6
}
