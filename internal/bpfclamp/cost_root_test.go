package bpfclamp

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// costArm is one way of running the transfer in TestLowatCost.
type costArm string

const (
	armOff      costArm = "off"      // nothing attached
	armAttached costArm = "attached" // the program, no entries
	armLowat    costArm = "lowat"    // the program, a lowat for both subflows
)

// costRow is one transfer of TestLowatCost.
type costRow struct {
	arm   costArm
	bytes int64
	secs  float64
	cpu   float64 // this process's user+system seconds
	sirq  float64 // the ksoftirqd threads' seconds
	busy  float64 // the machine's busy CPU seconds (/proc/stat)
	sets  uint64  // lowat settings (armLowat)
}

func (r costRow) gbps() float64      { return float64(r.bytes) * 8 / r.secs / 1e9 }
func (r costRow) cpuPerGB() float64  { return r.cpu / (float64(r.bytes) / 1e9) }
func (r costRow) busyPerGB() float64 { return r.busy / (float64(r.bytes) / 1e9) }

// machineBusy is the machine's non-idle CPU time (/proc/stat: every
// field but idle and iowait), seconds: softirq work charged to no task
// of this process counts here, and so does every other process's.
func machineBusy(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var ticks int64
	for i, v := range f[1:min(len(f), 9)] {
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return float64(ticks) / 100
}

// processCPU is this process's user+system time (every thread), seconds.
func processCPU(t *testing.T) float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// softirqCPU is the user+system time of the ksoftirqd threads, seconds
// (USER_HZ ticks): softirq work the kernel deferred there instead of
// running it in the context of the process it interrupted.
func softirqCPU(t *testing.T) float64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var ticks int64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil || !strings.Contains(string(b), "(ksoftirqd/") {
			continue
		}
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest) // from field 3 (state): utime is field 14
		if len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			ticks += u + s
		}
	}
	return float64(ticks) / 100
}

// established lists the TCP sockets established in ns (the sender's
// subflows: the receiver is in another namespace).
func established(t *testing.T, ns *netnstest.NS) []Conn {
	t.Helper()
	var out []Conn
	for _, line := range strings.Split(ns.Run("ss", "-tnH", "state", "established"), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		l, err1 := netip.ParseAddrPort(noDevice(f[2]))
		r, err2 := netip.ParseAddrPort(noDevice(f[3]))
		if err1 != nil || err2 != nil {
			t.Fatalf("ss line %q", line)
		}
		out = append(out, Conn{Local: l, Remote: r})
	}
	return out
}

// noDevice drops the "%DEV" ss writes after the address of a socket
// bound to a device (10.0.0.1%eth1:5201).
func noDevice(a string) string {
	i, j := strings.Index(a, "%"), strings.LastIndex(a, ":")
	if i < 0 || j < i {
		return a
	}
	return a[:i] + a[j:]
}

// TestLowatCost measures what the program costs an MPTCP transfer at
// full speed: two subflows over two veth pairs, unshaped, the sender
// (in a cgroup of its own) writing as fast as it can, its receiver in
// the same process, for MPD_LOWAT_COST_SECONDS per transfer (unset: the
// test is skipped; it is a measurement, run through /work/runs/measure),
// MPD_LOWAT_COST_ROUNDS rounds (default 5) of three arms in a rotating
// order: nothing attached, the program attached without entries (the
// lookup per ACK of each subflow), the program with a 128 KiB lowat for
// both subflows (the lookup, a bpf_getsockopt per ACK and the lowat's
// effect on the transfer). Per transfer: goodput and this process's CPU
// seconds per GB (getrusage: sender and receiver, with the softirq work
// that ran in their context; no IRQ time accounting on this kernel),
// the ksoftirqd threads' seconds and the machine's busy CPU seconds per
// GB beside it (machine-wide: other runs' work too; interleaving spreads
// that over the arms). After the rounds one more lowat transfer with
// the kernel's BPF statistics on counts the program's runs and their
// time. The rows are logged; nothing is asserted about the rates.
func TestLowatCost(t *testing.T) {
	v := os.Getenv("MPD_LOWAT_COST_SECONDS")
	if v == "" {
		t.Skip("a measurement: set MPD_LOWAT_COST_SECONDS (and MPD_LOWAT_COST_ROUNDS)")
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || secs <= 0 {
		t.Fatalf("MPD_LOWAT_COST_SECONDS=%q", v)
	}
	rounds := 5
	if v := os.Getenv("MPD_LOWAT_COST_ROUNDS"); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("MPD_LOWAT_COST_ROUNDS=%q", v)
		}
	}
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "ss")
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, cgroups)")
	}
	root := cgroupRoot(t)
	back := ownCgroup(t, root)
	dir := filepath.Join(root, fmt.Sprintf("mpd-bpfcost-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })

	snd, rcv := netnstest.New(t, "mpdlwc"), netnstest.New(t, "mpdlwc")
	netnstest.Link(t, snd, "10.77.21.1/24", rcv, "10.77.21.2/24")
	if2, _ := netnstest.Link(t, snd, "10.77.22.1/24", rcv, "10.77.22.2/24")
	snd.Run("ip", "mptcp", "limits", "set", "subflows", "2")
	rcv.Run("ip", "mptcp", "limits", "set", "subflows", "2")
	snd.Run("ip", "mptcp", "endpoint", "add", "10.77.22.1", "dev", if2, "subflow")
	var sndNetns uint64
	if err := snd.Do(func() (err error) { sndNetns, err = NetnsCookie(); return err }); err != nil {
		t.Fatal(err)
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := rcv.Listen(lc, "tcp", "10.77.21.2:40200")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var got atomic.Int64
	netnstest.Serve(ln, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	})

	transfer := func(arm costArm, d time.Duration, stats bool) (costRow, *ProgramStatsDelta) {
		t.Helper()
		var c *Clamper
		if arm != armOff {
			if c, err = Attach(dir, Options{}); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
		}
		pid := []byte(strconv.Itoa(os.Getpid()))
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
			t.Fatal(err)
		}
		var dl net.Dialer
		dl.SetMultipathTCP(true)
		conn, err := snd.Dial(&dl, "tcp", ln.Addr().String())
		if err2 := os.WriteFile(filepath.Join(back, "cgroup.procs"), pid, 0o644); err2 != nil {
			t.Fatal(err2)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		stop := netnstest.KeepWriting(conn)
		defer stop()
		var subs []Conn
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if subs = established(t, snd); len(subs) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d subflows established, want 2: %v", len(subs), subs)
			}
		}
		if arm == armLowat {
			for _, k := range subs {
				k.Netns = sndNetns
				if err := c.SetLowat(k, 128<<10); err != nil {
					t.Fatal(err)
				}
			}
		}
		time.Sleep(500 * time.Millisecond) // past the slow start
		var before *ProgramStatsDelta
		if stats {
			before = progStats(t, c)
		}
		b0, c0, s0, m0, t0 := got.Load(), processCPU(t), softirqCPU(t), machineBusy(t), time.Now()
		time.Sleep(d)
		b1, c1, s1, m1, t1 := got.Load(), processCPU(t), softirqCPU(t), machineBusy(t), time.Now()
		var delta *ProgramStatsDelta
		if stats {
			after := progStats(t, c)
			delta = &ProgramStatsDelta{Runs: after.Runs - before.Runs, Time: after.Time - before.Time}
		}
		// A writer that ended early (reset, EPIPE) would leave a row of
		// few or no bytes (cpu_s/GB +Inf): not a measurement.
		if err := stop(); err != nil {
			t.Fatalf("%s: the writer ended during the transfer: %v", arm, err)
		}
		row := costRow{arm: arm, bytes: b1 - b0, secs: t1.Sub(t0).Seconds(), cpu: c1 - c0, sirq: s1 - s0, busy: m1 - m0}
		if row.bytes <= 0 {
			t.Fatalf("%s: %d bytes arrived in %.1f s", arm, row.bytes, row.secs)
		}
		if c != nil {
			if row.sets, err = c.LowatSets(); err != nil {
				t.Fatal(err)
			}
			if r, err := c.Refused(); err != nil || r != (Refusals{}) {
				t.Errorf("refusals %+v (%v)", r, err)
			}
		}
		if arm == armLowat && row.sets < 2 {
			t.Errorf("lowat transfer: the program set TCP_NOTSENT_LOWAT %d times, want both subflows' (>= 2)", row.sets)
		}
		return row, delta
	}

	d := time.Duration(secs * float64(time.Second))
	arms := []costArm{armOff, armAttached, armLowat}
	var rows []costRow
	t.Logf("round arm GB Gbit/s cpu_s cpu_s/GB ksoftirqd_s machine_busy_s busy_s/GB lowat_sets")
	for i := range rounds {
		for j := range arms {
			arm := arms[(i+j)%len(arms)] // the order rotates per round
			r, _ := transfer(arm, d, false)
			rows = append(rows, r)
			t.Logf("%d %s %.3f %.3f %.3f %.3f %.2f %.2f %.3f %d", i+1, arm, float64(r.bytes)/1e9, r.gbps(), r.cpu, r.cpuPerGB(), r.sirq, r.busy, r.busyPerGB(), r.sets)
		}
	}
	for _, arm := range arms[1:] {
		var cpu, gp, busy []float64
		for i := range rounds {
			off, on := rows[i*3+slices.IndexFunc(rows[i*3:i*3+3], func(r costRow) bool { return r.arm == armOff })],
				rows[i*3+slices.IndexFunc(rows[i*3:i*3+3], func(r costRow) bool { return r.arm == arm })]
			cpu = append(cpu, math.Log(on.cpuPerGB()/off.cpuPerGB()))
			gp = append(gp, math.Log(on.gbps()/off.gbps()))
			busy = append(busy, math.Log(on.busyPerGB()/off.busyPerGB()))
		}
		t.Logf("paired %s/off over %d rounds: cpu_s/GB ratio %s, machine busy_s/GB ratio %s, goodput ratio %s", arm, rounds, geoInterval(cpu), geoInterval(busy), geoInterval(gp))
	}
	r, st := transfer(armLowat, d, true)
	if st != nil && st.Runs > 0 {
		t.Logf("with BPF statistics (one more lowat transfer, %.3f GB at %.3f Gbit/s): %d program runs, %.0f runs per GB, %.0f ns per run, %.4f s of program time per GB",
			float64(r.bytes)/1e9, r.gbps(), st.Runs, float64(st.Runs)/(float64(r.bytes)/1e9), float64(st.Time.Nanoseconds())/float64(st.Runs), st.Time.Seconds()/(float64(r.bytes)/1e9))
	}
}

// ProgramStatsDelta is the program's runs and run time over a window.
type ProgramStatsDelta struct {
	Runs uint64
	Time time.Duration
}

// progStats reads the program's counters, switching the kernel's BPF
// statistics on for the rest of the test (they cost two clock reads per
// run: on only in the last transfer).
func progStats(t *testing.T, c *Clamper) *ProgramStatsDelta {
	t.Helper()
	if !statsOn {
		cl, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			t.Logf("no BPF statistics: %v", err)
			return &ProgramStatsDelta{}
		}
		// Reset with the close, so that a second run (-count=2) switches
		// them on again instead of reading zero runs.
		t.Cleanup(func() { cl.Close(); statsOn = false })
		statsOn = true
	}
	s, err := c.prog.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return &ProgramStatsDelta{Runs: s.RunCount, Time: s.Runtime}
}

var statsOn bool

// geoInterval is the geometric mean of the ratios whose logs are ls, with
// a 95 % t interval (n-1 degrees of freedom) on the mean log.
func geoInterval(ls []float64) string {
	n := float64(len(ls))
	var m float64
	for _, x := range ls {
		m += x
	}
	m /= n
	if len(ls) < 2 {
		return fmt.Sprintf("%.3f (one round)", math.Exp(m))
	}
	var ss float64
	for _, x := range ls {
		ss += (x - m) * (x - m)
	}
	se := math.Sqrt(ss/(n-1)) / math.Sqrt(n)
	// Two-sided 97.5 % quantiles of t for 1-9 degrees of freedom, 2.0 beyond.
	tq := []float64{12.71, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262}
	q := 2.0
	if df := len(ls) - 1; df <= len(tq) {
		q = tq[df-1]
	}
	return fmt.Sprintf("%.3f [%.3f, %.3f]", math.Exp(m), math.Exp(m-q*se), math.Exp(m+q*se))
}
