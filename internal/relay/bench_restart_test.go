package relay

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRelayRestartStall measures what a relay restart (SIGTERM, then
// a new start: systemctl restart, an upgrade) does to a transfer through
// one of its NAT detours, with a state_file (handover) and, interleaved in
// the same run, without one (the table is removed at the stop). The
// transfer is a paced echo (16 KB every 5 ms, ~26 Mbit/s each way) over a
// TCP connection from the client namespace through the detour port to the
// server namespace: the same NAT path a detour subflow takes. Per restart:
// the longest gap between echoed bytes at the client from 0.5 s before the
// SIGTERM to 1.5 s after the new relay serves, whether the connection was
// reset, and how long no relay ran. MPDETOUR_BENCH_ROUNDS restarts per
// configuration (default 5). Run it under the heavy-measurement lock:
//
//	go test -c -o /tmp/relay.test ./internal/relay
//	flock /work/runs/heavy.lock /tmp/relay.test -test.run='^$' -test.bench=RelayRestartStall -test.benchtime=1x -test.v
func BenchmarkRelayRestartStall(b *testing.B) {
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("MPDETOUR_BENCH_ROUNDS")); err == nil {
		rounds = v
	}
	type line struct {
		name string
		f    *fixture
		cfg  string
		p    *relayProc
		k    keys
	}
	mk := func(name, extra string) *line {
		l := &line{name: name, f: newFixture(b), k: newKeys(b)}
		l.cfg = filepath.Join(b.TempDir(), "relay.yaml")
		writeConfig(b, l.cfg, l.k, extra)
		startSink(b, l.f.Server, fxServer+":5201")
		l.p = startRelay(b, l.f.Relay, l.cfg)
		return l
	}
	lines := []*line{
		mk("state_file (handover)", "state_file: "+filepath.Join(b.TempDir(), "state.json")+"\n"),
		mk("no state_file", ""),
	}
	type result struct {
		stall, down time.Duration
		reset       bool
	}
	res := map[string][]result{}
	for r := 0; r < rounds; r++ {
		for i := range lines {
			l := lines[(i+r)%len(lines)]
			c := dialRelayFrom(b, l.f.Client, l.k, fxClient)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			d, _, err := c.Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			conn, err := dialFrom(b, l.f.Client, d.String())
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var reads []time.Time
			var rerr, werr error
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				buf := make([]byte, 16<<10)
				tk := time.NewTicker(5 * time.Millisecond)
				defer tk.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tk.C:
					}
					if _, err := conn.Write(buf); err != nil {
						mu.Lock()
						werr = err
						mu.Unlock()
						return
					}
				}
			})
			wg.Go(func() {
				buf := make([]byte, 64<<10)
				for {
					_, err := conn.Read(buf)
					now := time.Now()
					mu.Lock()
					if err != nil {
						rerr = err
						mu.Unlock()
						return
					}
					reads = append(reads, now)
					mu.Unlock()
				}
			})
			time.Sleep(time.Second)
			from := time.Now().Add(-500 * time.Millisecond)
			t0 := time.Now()
			if err := l.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				b.Fatal(err)
			}
			_ = l.p.wait(b)
			l.p = startRelay(b, l.f.Relay, l.cfg)
			for !strings.Contains(l.p.stderr.String(), "relay serving") && time.Since(t0) < 10*time.Second {
				time.Sleep(5 * time.Millisecond)
			}
			down := time.Since(t0)
			time.Sleep(1500 * time.Millisecond)
			close(stop)
			to := time.Now()
			conn.Close()
			wg.Wait()
			mu.Lock()
			var stall time.Duration
			prev := from
			for _, at := range reads {
				if at.Before(from) {
					continue
				}
				if at.After(to) {
					break
				}
				stall = max(stall, at.Sub(prev))
				prev = at
			}
			stall = max(stall, to.Sub(prev))
			// Closing conn at the end ends both loops with "use of closed
			// network connection": only other errors (reset, broken pipe)
			// mean the restart broke the connection.
			broke := func(err error) bool { return err != nil && !strings.Contains(err.Error(), "use of closed") }
			reset := broke(werr) || broke(rerr)
			mu.Unlock()
			c.Close()
			res[l.name] = append(res[l.name], result{stall, down, reset})
			b.Logf("round %d %-22s longest stall %v, relay down %v, reset %v (write: %v, read: %v)", r, l.name, stall.Round(time.Millisecond), down.Round(time.Millisecond), reset, werr, rerr)
		}
	}
	var sb strings.Builder
	sb.WriteString("| configuration | restarts | connections reset | longest stall: median | max | relay down (SIGTERM to serving): median |\n|---|---|---|---|---|---|\n")
	for _, l := range lines {
		rs := res[l.name]
		var st, dn []time.Duration
		resets := 0
		for _, x := range rs {
			if x.reset {
				resets++
			} else {
				st = append(st, x.stall)
			}
			dn = append(dn, x.down)
		}
		slices.Sort(st)
		slices.Sort(dn)
		med, mx := "-", "-"
		if len(st) > 0 {
			med, mx = st[len(st)/2].Round(time.Millisecond).String(), st[len(st)-1].Round(time.Millisecond).String()
		}
		fmt.Fprintf(&sb, "| %s | %d | %d | %s | %s | %v |\n", l.name, len(rs), resets, med, mx, dn[len(dn)/2].Round(time.Millisecond))
	}
	b.Logf("\n%s", sb.String())
}
