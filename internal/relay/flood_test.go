package relay

import (
	"context"
	"encoding/binary"
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
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// floodNet is where the spoofed initiations claim to come from. The relay
// routes it back to the client namespace, which drops what it gets (it has
// no such address and does not forward), as the Internet would for
// addresses nobody answers on.
const floodNet = "10.98.0.0/15"

// floodSources is how many distinct source addresses the flood cycles
// through (all of floodNet: 131,072).
const floodSources = 1 << 17

// flooder sends spoofed handshake initiations from the client namespace
// through a raw socket, each from a different source address and port.
type flooder struct {
	fd   int
	to   syscall.SockaddrInet4
	pkts [][]byte
	sent atomic.Int64
}

// newFlooder precomputes initiations signed by a key the relay does not
// know (each costs the relay a full Noise handshake unless it can refuse it
// earlier) and opens the raw socket inside ns.
func newFlooder(t testing.TB, ns string, relay netip.AddrPort, relayPub proto.Key) *flooder {
	t.Helper()
	stranger, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	f := &flooder{to: syscall.SockaddrInet4{Addr: relay.Addr().As4()}}
	if os.Getenv("MPDETOUR_FLOOD_KIND") == "junk" {
		// Transport packets naming receiver indices no session has: each
		// is junk the relay must drop without keeping state per source.
		for i := 0; i < 256; i++ {
			junk := make([]byte, 64)
			junk[0], junk[1] = proto.TypeTransport, proto.Version
			binary.BigEndian.PutUint32(junk[4:], uint32(0x7f000000+i))
			f.pkts = append(f.pkts, junk)
		}
	}
	for i := 0; len(f.pkts) < 256; i++ {
		ini, err := proto.NewInitiation(stranger, relayPub, uint32(i+1), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		f.pkts = append(f.pkts, ini.Packet)
	}
	in(t, ns, func() {
		f.fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	})
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(f.fd) })
	return f
}

// datagram builds an IPv4/UDP packet from a spoofed source; the kernel fills
// in the IP checksum and length (IP_HDRINCL), UDP checksum 0 means none.
func (f *flooder) datagram(buf []byte, i int, dport uint16) []byte {
	payload := f.pkts[i%len(f.pkts)]
	n := 20 + 8 + len(payload)
	b := buf[:n]
	b[0], b[1] = 0x45, 0
	binary.BigEndian.PutUint16(b[2:], uint16(n))
	binary.BigEndian.PutUint32(b[4:], 0)
	b[8], b[9] = 64, syscall.IPPROTO_UDP
	b[10], b[11] = 0, 0
	src := i % floodSources
	b[12], b[13], b[14], b[15] = 10, 98+byte(src>>16), byte(src>>8), byte(src)
	copy(b[16:20], f.to.Addr[:])
	binary.BigEndian.PutUint16(b[20:], uint16(1024+i%60000))
	binary.BigEndian.PutUint16(b[22:], dport)
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	b[26], b[27] = 0, 0
	copy(b[28:], payload)
	return b
}

// run sends rate datagrams per second until ctx ends, catching up after
// scheduling delays so the average rate holds.
func (f *flooder) run(ctx context.Context, rate int, dport uint16) {
	buf := make([]byte, 2048)
	start := time.Now()
	i := 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * float64(rate))
		for ; i < due; i++ {
			if err := syscall.Sendto(f.fd, f.datagram(buf, i, dport), 0, &f.to); err == nil {
				f.sent.Add(1)
			}
		}
	}
}

// floodResult is what one flood run measured.
type floodResult struct {
	Rate      int           // spoofed initiations per second asked for
	Sent      int64         // sent by the flooder
	Duration  time.Duration // of the flood
	Attempts  int           // genuine grant attempts, each on a fresh handshake
	OK        int           // attempts that got a grant
	Within1s  int           // ... within one second of starting
	Latencies []time.Duration
	RelayCPU  time.Duration
	// RelayWait is the time the relay's threads were runnable but waiting
	// for a CPU (the sum of /proc/PID/task/*/schedstat's second field):
	// how much it was starved of CPU.
	RelayWait time.Duration
	// Fails counts the attempts without a grant within the deadline by
	// where the exchange stopped (failKind).
	Fails map[string]int
}

// failKind says where a failed attempt stopped: no handshake response
// (the initiation or the relay's response lost or late: relayconn's
// session error), or the grant request or its reply (the handshake
// completed), or another error (its text).
func failKind(err error) string {
	switch e := err.Error(); {
	case strings.Contains(e, "no handshake response"):
		return "handshake"
	case strings.Contains(e, "no session"):
		return "handshake refused"
	case strings.Contains(e, context.DeadlineExceeded.Error()):
		return "grant"
	default:
		return e
	}
}

// fails lists r.Fails, "-" when none.
func (r floodResult) fails() string {
	if len(r.Fails) == 0 {
		return "-"
	}
	var l []string
	for k, n := range r.Fails {
		l = append(l, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(l)
	return strings.Join(l, ", ")
}

func (r floodResult) pct(n int) float64 {
	if r.Attempts == 0 {
		return 0
	}
	return 100 * float64(n) / float64(r.Attempts)
}

func (r floodResult) quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	l := append([]time.Duration(nil), r.Latencies...)
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[int(q*float64(len(l)-1))]
}

// memberAddr is member i's address in the client namespace.
func memberAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 1, byte(10 + i)}) }

// floodLine starts a relay with n members and returns the keys of each;
// extra is appended to the relay's configuration.
func floodLine(t testing.TB, n int, extra string) (*fixture, proto.Key, []proto.Key, *relayProc) {
	return floodLineBin(t, n, extra, os.Args[0])
}

// floodLineBin is floodLine with the relay run by bin (startRelayBin).
func floodLineBin(t testing.TB, n int, extra, bin string) (*fixture, proto.Key, []proto.Key, *relayProc) {
	t.Helper()
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	f := newFixture(t)
	if out, err := exec.Command("ip", "-n", f.Relay, "route", "add", floodNet, "via", fxClient).CombinedOutput(); err != nil {
		t.Fatalf("route: %v %s", err, out)
	}
	relayKey, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	var members []proto.Key
	var b strings.Builder
	for i := 0; i < n; i++ {
		k, err := proto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, k)
		// Each member has its own address, as members on different hosts
		// would (the relay limits handshakes per source address).
		if out, err := exec.Command("ip", "-n", f.Client, "addr", "add", memberAddr(i).String()+"/24", "dev", "c0").CombinedOutput(); err != nil {
			t.Fatalf("address: %v %s", err, out)
		}
		fmt.Fprintf(&b, "  - name: m%d\n    public_key: %s\n", i, k.Public())
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("listen: %s:%d\nprivate_key: %s\nports: 40000-49999\nquota: {per_member: 100000}\nmembers:\n%sallow_destinations: [10.0.2.0/24]\nattribution_log: %s\n%s",
		fxRelay, DefaultPort, relayKey, b.String(), filepath.Join(dir, "attribution.jsonl"), extra)
	path := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return f, relayKey, members, startRelayBin(t, f.Relay, path, bin)
}

// runFlood floods the relay at rate for d while every member, one attempt
// after the other, opens a fresh control connection (a new handshake) and
// asks for a grant with a deadline of wait.
func runFlood(t testing.TB, f *fixture, relayKey proto.Key, members []proto.Key, p *relayProc, rate int, d, wait time.Duration) floodResult {
	t.Helper()
	res := floodResult{Rate: rate, Duration: d, Fails: map[string]int{}}
	cpu0 := procCPU(t, p.cmd.Process.Pid)
	wait0 := runqueueWait(p.cmd.Process.Pid)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var fl *flooder
	if rate > 0 {
		fl = newFlooder(t, f.Client, relayAddr(), relayKey.Public())
		wg.Add(1)
		go func() { defer wg.Done(); fl.run(ctx, rate, DefaultPort) }()
		time.Sleep(200 * time.Millisecond) // the flood is on before members start
	}
	var mu sync.Mutex
	server := netip.MustParseAddrPort(fxServer + ":5201")
	relay := relayconn.Relay{Name: "r", Addr: relayAddr(), PublicKey: relayKey.Public()}
	for i, k := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the members' starts over the first 200 ms.
			time.Sleep(time.Duration(i) * 200 * time.Millisecond / time.Duration(len(members)))
			for ctx.Err() == nil {
				start := time.Now()
				c, err := relayconn.Dial(relay, k, relayconn.Options{ListenPacket: func() (net.PacketConn, error) {
					var pc net.PacketConn
					var err error
					in(t, f.Client, func() {
						pc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(memberAddr(i), 0)))
					})
					return pc, err
				}})
				if err != nil {
					t.Error(err)
					return
				}
				gctx, gcancel := context.WithTimeout(context.Background(), wait)
				_, _, err = c.Grant(gctx, server, 0)
				took := time.Since(start)
				gcancel()
				c.Close()
				mu.Lock()
				res.Attempts++
				if err == nil {
					res.OK++
					res.Latencies = append(res.Latencies, took)
					if took <= time.Second {
						res.Within1s++
					}
				} else {
					res.Fails[failKind(err)]++
				}
				mu.Unlock()
				// Pace: one attempt per member every 250 ms at most.
				if rest := 250*time.Millisecond - took; rest > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(rest):
					}
				}
			}
		}()
	}
	wg.Wait()
	if fl != nil {
		res.Sent = fl.sent.Load()
	}
	res.RelayCPU = procCPU(t, p.cmd.Process.Pid) - cpu0
	res.RelayWait = runqueueWait(p.cmd.Process.Pid) - wait0
	return res
}

// TestHandshakeFlood: while spoofed initiations arrive far faster than the
// relay's handshake budget, members still get grants (the relay answers
// unproven sources with cookies instead of spending the budget on them).
func TestHandshakeFlood(t *testing.T) {
	f, relayKey, members, p := floodLine(t, 4, "")
	res := runFlood(t, f, relayKey, members, p, 5000, 4*time.Second, 3*time.Second)
	t.Logf("flood %d/s: sent %d, attempts %d, ok %d (%.1f%%), within 1 s %d, p50 %v p99 %v, relay CPU %v",
		res.Rate, res.Sent, res.Attempts, res.OK, res.pct(res.OK), res.Within1s, res.quantile(0.5), res.quantile(0.99), res.RelayCPU)
	if res.Sent < int64(res.Rate) {
		t.Fatalf("the flood did not happen: %d initiations sent", res.Sent)
	}
	if res.Attempts < len(members) || res.OK != res.Attempts {
		t.Fatalf("under a spoofed flood %d of %d grant attempts failed (deadline 3 s)\n%s", res.Attempts-res.OK, res.Attempts, p.stderr.String())
	}
}

// BenchmarkHandshakeFlood reports the share of genuine
// members' grants (each on a fresh handshake) that succeed within 1 s during
// a spoofed flood of 20,000 initiations/s, next to the same without a flood.
// It is a report, not a loop:
//
//	go test -run '^$' -bench HandshakeFlood -benchtime 1x -v ./internal/relay
//
// MPDETOUR_FLOOD_RATE, MPDETOUR_FLOOD_SECONDS and MPDETOUR_FLOOD_MEMBERS change the defaults
// (20000, 10, 20); MPDETOUR_FLOOD_KIND=junk floods spoofed junk transport
// packets instead of initiations (sources cycle through 131,072 addresses);
// MPDETOUR_FLOOD_AFTER=seconds adds a phase without flood right after it
// (the members' handshakes and grants once the flood stops);
// MPDETOUR_FLOOD_LOWRATE=rate adds a flood at that rate afterwards (same
// length), to tell CPU starvation (misses shrink with the rate) from
// admission (misses do not depend on it);
// MPDETOUR_FLOOD_REPORT=path writes the markdown report there.
//
// MPDETOUR_FLOOD_RCVBUF=v1,v2,... compares relays instead, one per value of
// receive_buffer ("default": the key left out, i.e. DefaultReceiveBuffer;
// 0: the kernel's default), each on its own line of namespaces, all started
// before the first phase: MPDETOUR_FLOOD_ROUNDS rounds (default 2), each
// running on every relay in turn, in a rotated order, the flood and then
// (with MPDETOUR_FLOOD_AFTER) the phase after it, so every variant sees the
// same load over the run; the table ends with each variant's totals.
//
// MPDETOUR_FLOOD_BUILDS=name=path,name=path,... compares builds the same
// way: one relay per test binary of this package (go test -c, e.g. of main
// and of a branch), each run as the relay of its own line; the members and
// the flooder are this binary's for every line. name=path@bytes also sets
// that relay's receive_buffer.
//
// Each row also gives the relay's run-queue wait: the time its threads
// were runnable but not running (schedstat), a direct measure of CPU
// starvation on shared cores.
func BenchmarkHandshakeFlood(b *testing.B) {
	rate, secs, n, after, low, rounds := 20000, 10, 20, 0, 0, 2
	for _, v := range []struct {
		env string
		to  *int
	}{{"MPDETOUR_FLOOD_RATE", &rate}, {"MPDETOUR_FLOOD_SECONDS", &secs}, {"MPDETOUR_FLOOD_MEMBERS", &n},
		{"MPDETOUR_FLOOD_AFTER", &after}, {"MPDETOUR_FLOOD_LOWRATE", &low}, {"MPDETOUR_FLOOD_ROUNDS", &rounds}} {
		if x, err := strconv.Atoi(os.Getenv(v.env)); err == nil {
			*v.to = x
		}
	}
	d := time.Duration(secs) * time.Second
	type line struct {
		name     string
		f        *fixture
		relayKey proto.Key
		members  []proto.Key
		p        *relayProc
	}
	type phase struct {
		name  string
		r     floodResult
		load  string // load average at the phase's start and end
		self  time.Duration
		drops int64 // the relay namespace's UDP RcvbufErrors during the phase (-1: unreadable)
	}
	var phases []phase
	run := func(l line, name string, rate int, d time.Duration) {
		l0 := loadAvg()
		self0 := selfCPU()
		drops0 := rcvbufErrors(b, l.f.Relay)
		r := runFlood(b, l.f, l.relayKey, l.members, l.p, rate, d, time.Second)
		drops := rcvbufErrors(b, l.f.Relay)
		if drops >= 0 && drops0 >= 0 {
			drops -= drops0
		} else {
			drops = -1
		}
		phases = append(phases, phase{name, r, l0 + " -> " + loadAvg(), selfCPU() - self0, drops})
	}
	var lines []line
	if v := os.Getenv("MPDETOUR_FLOOD_BUILDS"); v != "" {
		for _, x := range strings.Split(v, ",") {
			name, bin, ok := strings.Cut(strings.TrimSpace(x), "=")
			if !ok || name == "" || bin == "" {
				b.Fatalf("MPDETOUR_FLOOD_BUILDS: %q is not name=path-to-test-binary", x)
			}
			bin, rb, withRB := strings.Cut(bin, "@")
			extra := ""
			if withRB {
				if _, err := strconv.Atoi(rb); err != nil {
					b.Fatalf("MPDETOUR_FLOOD_BUILDS: %q: the receive buffer after @ is not a byte count", x)
				}
				extra = "receive_buffer: " + rb + "\n"
			}
			if _, err := os.Stat(bin); err != nil {
				b.Fatalf("MPDETOUR_FLOOD_BUILDS: %v", err)
			}
			f, k, m, p := floodLineBin(b, n, extra, bin)
			lines = append(lines, line{fmt.Sprintf("build %s (socket rb %s)", name, relayRcvbuf(b, f.Relay)), f, k, m, p})
		}
	} else if v := os.Getenv("MPDETOUR_FLOOD_RCVBUF"); v != "" {
		for _, x := range strings.Split(v, ",") {
			x = strings.TrimSpace(x)
			extra := ""
			if x != "default" {
				if _, err := strconv.Atoi(x); err != nil {
					b.Fatalf("MPDETOUR_FLOOD_RCVBUF: %q is neither a byte count nor \"default\"", x)
				}
				extra = "receive_buffer: " + x + "\n"
			}
			f, k, m, p := floodLine(b, n, extra)
			lines = append(lines, line{fmt.Sprintf("receive_buffer %s (socket rb %s)", x, relayRcvbuf(b, f.Relay)), f, k, m, p})
		}
	}
	if len(lines) > 0 {
		for r := 0; r < rounds; r++ {
			for i := range lines {
				l := lines[(i+r)%len(lines)] // rotated: no variant always goes first
				run(l, fmt.Sprintf("%s, round %d: flood", l.name, r+1), rate, d)
				if after > 0 {
					run(l, fmt.Sprintf("%s, round %d: after the flood", l.name, r+1), 0, time.Duration(after)*time.Second)
				}
			}
		}
		// Each variant's totals over its rounds, flood and after apart.
		for _, l := range lines {
			for _, kind := range []string{": flood", ": after the flood"} {
				t := phase{name: l.name + ", all rounds" + kind, r: floodResult{Rate: -1, Fails: map[string]int{}}}
				for _, ph := range phases {
					if !strings.HasPrefix(ph.name, l.name+",") || !strings.HasSuffix(ph.name, kind) {
						continue
					}
					t.r.Rate, t.r.Sent, t.r.Duration = ph.r.Rate, t.r.Sent+ph.r.Sent, t.r.Duration+ph.r.Duration
					t.r.Attempts, t.r.OK, t.r.Within1s = t.r.Attempts+ph.r.Attempts, t.r.OK+ph.r.OK, t.r.Within1s+ph.r.Within1s
					t.r.Latencies = append(t.r.Latencies, ph.r.Latencies...)
					t.r.RelayCPU += ph.r.RelayCPU
					t.r.RelayWait += ph.r.RelayWait
					t.self += ph.self
					if t.drops >= 0 && ph.drops >= 0 {
						t.drops += ph.drops
					} else {
						t.drops = -1
					}
					for k, n := range ph.r.Fails {
						t.r.Fails[k] += n
					}
				}
				if t.r.Rate >= 0 {
					t.load = "-"
					phases = append(phases, t)
				}
			}
		}
	} else {
		f, k, m, p := floodLine(b, n, "")
		l := line{"", f, k, m, p}
		run(l, "no flood", 0, d/2)
		run(l, "flood", rate, d)
		if after > 0 {
			run(l, "after the flood", 0, time.Duration(after)*time.Second)
		}
		if low > 0 {
			run(l, "flood at the lower rate", low, d)
		}
	}
	var rep strings.Builder
	fmt.Fprintf(&rep, "| run | spoofed pkt/s asked (sent) | attempts | ok | grant within 1 s | failed (where) | p50 | p99 | max | relay CPU | relay run-queue wait (thread time per phase time) | test process CPU (members + flooder) | relay socket drops (UDP RcvbufErrors) | load average |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, ph := range phases {
		r := ph.r
		sent := float64(r.Sent) / r.Duration.Seconds()
		drops := "?"
		if ph.drops >= 0 {
			drops = strconv.FormatInt(ph.drops, 10)
		}
		fmt.Fprintf(&rep, "| %s | %d (%.0f) | %d | %d | %.1f%% | %s | %v | %v | %v | %.0f%% of a core | %.0f%% | %.0f%% of a core | %s | %s |\n", ph.name, r.Rate, sent, r.Attempts, r.OK,
			r.pct(r.Within1s), r.fails(), r.quantile(0.5).Round(time.Millisecond), r.quantile(0.99).Round(time.Millisecond), r.quantile(1).Round(time.Millisecond),
			100*r.RelayCPU.Seconds()/r.Duration.Seconds(), 100*r.RelayWait.Seconds()/r.Duration.Seconds(), 100*ph.self.Seconds()/r.Duration.Seconds(), drops, ph.load)
	}
	b.Logf("\n%s", rep.String())
	if path := os.Getenv("MPDETOUR_FLOOD_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(rep.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// relayRcvbuf is the receive buffer the kernel holds for the relay's
// control socket in namespace ns (ss's skmem rb), "?" when unreadable.
func relayRcvbuf(t testing.TB, ns string) string {
	out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-uamnH", "sport", "=", ":"+strconv.Itoa(DefaultPort)).CombinedOutput()
	if i := strings.Index(string(out), ",rb"); err == nil && i >= 0 {
		v := string(out[i+3:])
		if j := strings.IndexAny(v, ",)"); j >= 0 {
			return v[:j]
		}
	}
	t.Logf("ss in %s: %v %s", ns, err, out)
	return "?"
}

// rcvbufErrors is namespace ns's UDP RcvbufErrors (datagrams dropped
// because a socket's receive buffer was full: the relay's, in the relay
// namespace), -1 when unreadable.
func rcvbufErrors(t testing.TB, ns string) int64 {
	n := int64(-1)
	in(t, ns, func() {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return
		}
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Udp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i := range f {
				if i < len(names) && names[i] == "RcvbufErrors" {
					n, _ = strconv.ParseInt(f[i], 10, 64)
				}
			}
		}
	})
	return n
}

// loadAvg is the 1-minute load average ("?" when unreadable).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// selfCPU is the CPU time this process has used (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runqueueWait is how long pid's threads have waited on a run queue
// (runnable, not running) in total, from /proc/PID/task/*/schedstat; threads
// that ended are not counted (the relay's Go threads live as long as it).
func runqueueWait(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if f := strings.Fields(string(b)); err == nil && len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			sum += n
		}
	}
	return time.Duration(sum)
}
