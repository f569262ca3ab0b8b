package agent

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

var (
	benchRate    = flag.Int("agent.rate", 1000, "new MPTCP connections per second in BenchmarkAgentConnectionRate")
	benchHold    = flag.Duration("agent.hold", time.Second, "how long each benchmark connection stays open")
	benchWorkers = flag.Int("agent.workers", 4, "the agent's command_workers")
	benchProbe   = flag.String("agent.probe", "1s", "the agent's probe_interval (0 = off)")
	benchPorts   = flag.String("agent.ports", "", "client ip_local_port_range for the run, e.g. \"1024 65535\" (default: the kernel's)")
	benchNice    = flag.Int("agent.nice", 0, "the agent's nice setting (negative = higher priority)")
)

// procCPU returns the user+system CPU time a process has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100, nil // USER_HZ = 100
}

// BenchmarkAgentConnectionRate opens b.N MPTCP connections at -agent.rate
// per second from the lab's client through an agent (a separate process,
// so its CPU can be read from /proc) with 2 static NAT detours, and reports
// lost events, the ESTABLISHED -> SUBFLOW_CREATE latency and agent CPU.
//
//	go test -run XXX -bench AgentConnectionRate -benchtime 10000x ./internal/agent
func BenchmarkAgentConnectionRate(b *testing.B) {
	dl := upDetourLab(b, 2)
	if *benchPorts != "" {
		dl.run(b, "client", "sysctl", "-qw", "net.ipv4.ip_local_port_range="+*benchPorts)
	}
	dir := b.TempDir()
	bin, err := testenv.BuildMpdetour(dir)
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	cfgPath := filepath.Join(dir, "agent.yaml")
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "socket: %s\nnetns: %s\nsubflow_lowat: 0\nsubflows: 2\nlog_level: warn\ncommand_workers: %d\nprobe_interval: %s\nnice: %d\ndetours:\n", sock, dl.l.NetnsName("client"), *benchWorkers, *benchProbe, *benchNice)
	for i, r := range dl.relays {
		fmt.Fprintf(&cfg, "  - {kind: nat, relay: d%d, address: %s, server: %s}\n", i+1, r, dl.server)
	}
	os.WriteFile(cfgPath, []byte(cfg.String()), 0o644)
	agentCmd := exec.Command(bin, "agent", "--config", cfgPath)
	var logs bytes.Buffer
	agentCmd.Stderr = &logs
	if err := agentCmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		agentCmd.Process.Signal(os.Interrupt)
		agentCmd.Wait()
	}()
	for i := 0; ; i++ {
		if _, err := FetchStatus(sock); err == nil {
			break
		}
		if i > 200 {
			b.Fatalf("agent did not start: %s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	dl.serveB(b)

	// Dialers live on threads inside the client namespace.
	const dialers = 16
	work := make(chan struct{}, 4096)
	var opened, failed atomic.Int64
	var wg sync.WaitGroup
	for range dialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			h, err := netns.GetFromPath(dl.l.NetnsPath("client"))
			if err != nil || netns.Set(h) != nil {
				failed.Add(1)
				return
			}
			h.Close()
			d := &net.Dialer{Timeout: 5 * time.Second}
			d.SetMultipathTCP(true)
			for range work {
				c, err := d.Dial("tcp4", dl.server.String())
				if err != nil {
					failed.Add(1)
					continue
				}
				opened.Add(1)
				c.Write([]byte{1}) // data makes the connection fully established
				time.AfterFunc(*benchHold, func() { c.Close() })
			}
		}()
	}
	cpu0, _ := procCPU(agentCmd.Process.Pid)
	st0, _ := FetchStatus(sock)
	start := time.Now()
	b.ResetTimer()
	interval := time.Second / time.Duration(*benchRate)
	late := 0
	for i := range b.N {
		next := start.Add(time.Duration(i) * interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		select {
		case work <- struct{}{}:
		default:
			late++ // dialers saturated: the offered rate is not reached
		}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	time.Sleep(*benchHold + 2*time.Second) // let closes and last subflows settle
	cpu1, _ := procCPU(agentCmd.Process.Pid)
	st, err := FetchStatus(sock)
	if err != nil {
		b.Fatal(err)
	}
	var est, fail uint64
	for _, d := range st.Detours {
		est += d.Established
		fail += d.Failed
	}
	wall := elapsed + *benchHold + 2*time.Second
	b.ReportMetric(float64(opened.Load())/elapsed.Seconds(), "conn/s")
	b.ReportMetric(float64(st.Counters.EventsLost-st0.Counters.EventsLost), "lost-overflows")
	b.ReportMetric(st.Latency.P50ms, "p50-ms")
	b.ReportMetric(st.Latency.P99ms, "p99-ms")
	b.ReportMetric(st.LatencyAck.P99ms, "p99-ack-ms")
	b.ReportMetric(100*float64(cpu1-cpu0)/float64(wall), "agent-cpu-%")
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/1000/float64(max(opened.Load(), 1)), "agent-cpu-ms/conn")
	b.ReportMetric(float64(est)/float64(max(opened.Load(), 1)), "detour-subflows/conn")
	b.Logf("offered %d conns at %d/s: opened %d (%d failed, %d not dialed in time) in %s; events %d, overflows %d, resyncs %d; "+
		"ESTABLISHED->SUBFLOW_CREATE sent p50 %.3f p99 %.3f max %.3f ms (%d samples), acked p50 %.3f p99 %.3f max %.3f ms; detour subflows established %d, failed %d; "+
		"commands %d (%d errors: %v); agent CPU %s over %s; load average %s",
		b.N, *benchRate, opened.Load(), failed.Load(), late, elapsed.Round(time.Millisecond), st.Counters.Events,
		st.Counters.EventsLost, st.Counters.Resyncs, st.Latency.P50ms, st.Latency.P99ms, st.Latency.Maxms, st.Latency.Samples,
		st.LatencyAck.P50ms, st.LatencyAck.P99ms, st.LatencyAck.Maxms, est, fail, st.Counters.Commands, st.Counters.CommandErrors, st.Counters.ErrorsByErrno, cpu1-cpu0, wall.Round(time.Millisecond), loadavg())
	for s := bufio.NewScanner(&logs); s.Scan(); {
		b.Logf("agent log: %s", s.Text())
	}
}

func (dl *detourLab) serveB(b *testing.B) {
	var ln net.Listener
	err := dl.l.Do("server", func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp4", dl.server.String())
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				for {
					if _, err := c.Read(buf); err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:min(3, len(strings.Fields(string(b))))], " ")
}
