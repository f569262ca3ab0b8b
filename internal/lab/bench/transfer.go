package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab/attack"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
)

func setupTCP(ctx context.Context, env *Env) (Session, error) {
	// Beside a converter (scenario converter), plain TCP is the baseline
	// for setup latency too.
	return &transfer{env: env, dst: env.serverAddr(), probeSetup: env.Roles.Converter != "" && env.LatencyPort > 0}, nil
}

// setupTCP6 is setupTCP to the server's IPv6 address.
func setupMPTCP1(ctx context.Context, env *Env) (Session, error) {
	return &transfer{env: env, dst: env.serverAddr(), mptcp: true, wantSubflows: 1}, nil
}

// pauseBetweenTrials lets queues drain and TIME_WAIT settle so that one
// trial's tail does not eat into the next one's warm-up.
const pauseBetweenTrials = 500 * time.Millisecond

// transfer is a session that measures client -> dst with the goodput tool.
type transfer struct {
	env   *Env
	dst   netip.AddrPort
	mptcp bool
	// inet6: the client opens an AF_INET6 socket even for an IPv4 dst
	// (IPv4-mapped), as dual-stack programs do (mptcp-cross).
	inet6 bool
	// wantSubflows > 0 makes a trial fail when the MPTCP connection ends
	// with fewer subflows (a detour that never came up is not a detour
	// measurement).
	wantSubflows int
	// paths names subflows by their local or remote address, prefixes by
	// the prefix of their local address (tunnel addresses the relay chose).
	paths    map[netip.Addr]string
	prefixes map[netip.Prefix]string
	close    func() error
	// daemons are the cell's relay/agent processes: one that died
	// explains a failed trial.
	daemons []*daemon
	// wrap, when set, runs the sender as a process in the client node
	// behind these arguments ("mpdetour run --convert SOCKET --"), as an
	// unmodified program, instead of in-process.
	wrap []string
	// probeSetup measures setup latency (connect() to first byte) before
	// each transfer, through wrap if set.
	probeSetup bool
	// check, when set, runs after each trial (e.g. that the connection was
	// converted).
	check func(res *benchtool.Result) error
	// cpuOf, when set, is a daemon whose CPU time over each transfer is
	// recorded (Measurement.Process, prefix cpuName).
	cpuOf   *daemon
	cpuName string
}

// explain adds to err what became of the cell's daemons.
func (t *transfer) explain(err error) error {
	for _, d := range t.daemons {
		if ok, _ := d.exited(); ok {
			return fmt.Errorf("%w; %w", err, d.failure())
		}
	}
	return err
}

func (t *transfer) Trial(ctx context.Context, n int) (Measurement, error) {
	if n > 1 {
		select {
		case <-time.After(pauseBetweenTrials):
		case <-ctx.Done():
			return Measurement{}, ctx.Err()
		}
	}
	e := t.env
	if e.Cell.Flow != nil {
		return t.flowTrial(ctx)
	}
	if f := e.Cell.Fault; f != nil {
		stop, err := t.scheduleFault(ctx, f)
		if err != nil {
			return Measurement{}, err
		}
		defer stop()
	}
	var setup []float64
	if t.probeSetup {
		var err error
		if setup, err = t.setupLatency(ctx, setupProbes); err != nil {
			return Measurement{}, t.explain(err)
		}
	}
	var atk *attack.Run
	if a := e.Cell.Attack; a != nil {
		// An attack may break the genuine connection: a stalled transfer
		// fails the trial after twice its duration plus 10 s.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*e.Duration+10*time.Second)
		defer cancel()
		var err error
		if atk, err = startAttack(ctx, e, a); err != nil {
			return Measurement{}, err
		}
	}
	var cpu0 time.Duration
	var wall0 time.Time
	if t.cpuOf != nil {
		var err error
		if cpu0, err = processCPU(t.cpuOf.cmd.Process.Pid); err != nil {
			return Measurement{}, err
		}
		wall0 = time.Now()
	}
	res, err := t.send(ctx)
	var process map[string]float64
	if t.cpuOf != nil && err == nil {
		cpu1, cerr := processCPU(t.cpuOf.cmd.Process.Pid)
		if cerr != nil {
			return Measurement{}, t.explain(cerr)
		}
		var bytes uint64
		for _, sf := range res.Subflows {
			bytes += sf.BytesAcked
		}
		cpu := (cpu1 - cpu0).Seconds()
		process = map[string]float64{t.cpuName + ".cpu_s": cpu, t.cpuName + ".wall_s": time.Since(wall0).Seconds()}
		if bytes > 0 {
			process[t.cpuName+".cores_per_gbps"] = cpu / (float64(bytes) * 8 / 1e9)
		}
	}
	var attackStats map[string]float64
	if atk != nil {
		var aerr error
		attackStats, aerr = atk.Stop()
		if aerr != nil && err == nil {
			return Measurement{}, aerr
		}
	}
	if err != nil {
		return Measurement{Attack: attackStats}, t.explain(err)
	}
	if t.check != nil {
		if err := t.check(res); err != nil {
			return Measurement{}, t.explain(err)
		}
	}
	// A failed trial keeps the attack's counters (an attack that forces a
	// fallback is exactly what they show).
	if res.CongestionControl != e.CC {
		return Measurement{Attack: attackStats}, fmt.Errorf("congestion control is %q, not %q", res.CongestionControl, e.CC)
	}
	if t.mptcp && !res.MPTCP {
		return Measurement{Attack: attackStats}, errors.New("the connection fell back to plain TCP")
	}
	if !t.mptcp && res.MPTCP && t.wrap == nil {
		return Measurement{Attack: attackStats}, errors.New("plain TCP was requested but the connection is MPTCP")
	}
	m := Measurement{GoodputMbps: res.Goodput, WindowBytes: res.WindowBytes, MaxGapS: res.MaxGap, MaxGapEndS: res.MaxGapEnd, SetupMs: setup, Attack: attackStats, Process: process}
	pathOf := t.pathOf
	if f := e.Cell.Fault; f != nil {
		m.ResumeS = resumeAfter(res.Series, f, func(key string) string {
			if key == "tcp" {
				return "default"
			}
			l, r, ok := strings.Cut(key, "-")
			la, err1 := netip.ParseAddrPort(l)
			ra, err2 := netip.ParseAddrPort(r)
			if !ok || err1 != nil || err2 != nil {
				return ""
			}
			return pathOf(la, ra)
		})
	}
	if e.Cell.Fault != nil {
		m.TailMbps = tailRate(res.Series, 2*e.Duration.Seconds()/3)
	}
	for _, sf := range res.Subflows {
		p := pathOf(sf.Local, sf.Remote)
		m.Subflows = append(m.Subflows, results.Subflow{
			Path: p, Local: sf.Local.String(), Remote: sf.Remote.String(),
			Bytes: sf.BytesAcked, WindowBytes: sf.WindowBytesAcked,
			RTTms: sf.RTT, MinRTTms: sf.MinRTT, Retrans: uint64(sf.Retransmits),
		})
	}
	sortSubflows(m.Subflows)
	if t.wantSubflows > 1 && len(res.Subflows) < t.wantSubflows && e.Cell.Fault == nil && e.Cell.Attack == nil {
		return m, t.explain(&FewSubflowsError{Got: len(res.Subflows), Want: t.wantSubflows})
	}
	return m, nil
}

// KeptFewSubflows starts the reason of an ok trial of a procedure whose
// policy closes subflows on purpose (scenario.ClosesSubflows) that ended
// with fewer subflows than its cell opens.
const KeptFewSubflows = "kept: the policy may close a detour subflow"

// FewSubflowsError: an MPTCP trial ended with fewer subflows than its cell
// opens. The Measurement returned with it is complete; a caller whose
// policy may close a detour subflow on purpose (the design's backup-first)
// can keep it. Returned wrapped when a daemon also died.
type FewSubflowsError struct{ Got, Want int }

func (e *FewSubflowsError) Error() string {
	return fmt.Sprintf("%d subflow(s) at the end of the transfer, want %d (a detour subflow did not come up)", e.Got, e.Want)
}

// pathOf names a subflow's path: by t.paths (local or remote address),
// t.prefixes (local address), "default" for client -> server, else the
// address pair.
func (t *transfer) pathOf(local, remote netip.AddrPort) string {
	e := t.env
	p := t.paths[local.Addr()]
	if p == "" {
		p = t.paths[remote.Addr()]
	}
	for pf, name := range t.prefixes {
		if p == "" && pf.Contains(local.Addr()) {
			p = name
		}
	}
	if p == "" {
		switch {
		case sameHost(local.Addr(), e.Lab.Addr(e.Roles.Client)) && sameHost(remote.Addr(), e.serverAddr().Addr()):
			p = "default"
		default:
			p = local.Addr().String() + ">" + remote.Addr().String()
		}
	}
	return p
}

// setupProbes is how many setup-latency connections a trial makes.
const setupProbes = 5

// send runs the transfer: in-process, or as "mpdetour bench send" behind
// t.wrap in the client node.
func (t *transfer) send(ctx context.Context) (*benchtool.Result, error) {
	e := t.env
	if t.wrap == nil {
		return benchtool.Send(ctx, benchtool.SendOptions{
			Addr: t.dst.String(), Duration: e.Duration, Warmup: e.Warmup, MPTCP: t.mptcp, Inet6: t.inet6, CC: e.CC,
			Netns: e.Lab.NetnsPath(e.Roles.Client), Download: e.Download, SeriesEvery: seriesEvery(e.Cell.Fault),
		})
	}
	argv := append(append([]string{}, t.wrap...), e.Binary, "bench", "send", t.dst.String(), "--json",
		"--duration", e.Duration.String(), "--warmup", e.Warmup.String(), "--cc", e.CC)
	if e.Download {
		argv = append(argv, "--download")
	}
	out, err := t.output(ctx, argv)
	if err != nil {
		return nil, err
	}
	var res benchtool.Result
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("bench send output: %w", err)
	}
	return &res, nil
}

// setupLatency runs "mpdetour bench latency" (behind t.wrap) against the
// server's latency responder.
func (t *transfer) setupLatency(ctx context.Context, n int) ([]float64, error) {
	e := t.env
	dst := netip.AddrPortFrom(e.serverAddr().Addr(), uint16(e.LatencyPort))
	argv := append(append([]string{}, t.wrap...), e.Binary, "bench", "latency", dst.String(), "--json", "--count", strconv.Itoa(n))
	out, err := t.output(ctx, argv)
	if err != nil {
		return nil, err
	}
	var ms []float64
	if err := json.Unmarshal(out, &ms); err != nil || len(ms) != n {
		return nil, fmt.Errorf("bench latency output %q: %v", out, err)
	}
	return ms, nil
}

// output runs argv in the client node and returns its stdout.
func (t *transfer) output(ctx context.Context, argv []string) ([]byte, error) {
	cmd := t.env.Lab.Command(ctx, t.env.Roles.Client, argv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", strings.Join(argv[len(t.wrap):min(len(argv), len(t.wrap)+3)], " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// scheduleFault black-holes the fault's link at f.At after now and
// restores it after f.For; stop cancels what has not happened yet and
// restores the link in any case (a failed trial must not leave it dead).
func (t *transfer) scheduleFault(ctx context.Context, f *scenario.Fault) (stop func(), err error) {
	lab := t.env.Lab
	if lab.Topology().Link(f.Link) == nil {
		return nil, fmt.Errorf("fault: lab has no link %q", f.Link)
	}
	var mu sync.Mutex
	var restore func() error
	done := make(chan struct{})
	go func() {
		select {
		case <-time.After(f.At.D()):
		case <-done:
			return
		case <-ctx.Done():
			return
		}
		mu.Lock()
		r, err := lab.BlackHole(f.Link)
		if err == nil {
			restore = r
		}
		mu.Unlock()
		if f.For.D() <= 0 {
			return
		}
		select {
		case <-time.After(f.For.D()):
		case <-done:
			return
		case <-ctx.Done():
			return
		}
		mu.Lock()
		if restore != nil {
			_ = restore()
			restore = nil
		}
		mu.Unlock()
	}()
	return func() {
		close(done)
		mu.Lock()
		defer mu.Unlock()
		if restore != nil {
			_ = restore()
			restore = nil
		}
	}, nil
}

// warmUp runs short unrecorded transfers until one ends with the wanted
// subflows: detours the agent sets up in the background (tunnels) are
// then ready before the first trial.
func (t *transfer) warmUp(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	e := *t.env
	e.Duration, e.Warmup = 2*time.Second, 500*time.Millisecond
	w := *t
	w.env = &e
	var last error
	for time.Now().Before(deadline) {
		_, err := w.Trial(ctx, 1)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last = err
	}
	return fmt.Errorf("detours not ready after %s: %w", timeout, last)
}

func (t *transfer) Close() error {
	if t.close != nil {
		return t.close()
	}
	return nil
}

func (e *Env) serverAddr() netip.AddrPort {
	return netip.AddrPortFrom(e.addr(e.Roles.Server), uint16(e.Port))
}

// startReceiver serves goodput transfers in the server node until ctx ends.
// Clients the receiver drops (reset, no data, summary not written) are
// logged to receiverLog(env, node) when env.ReceiverLogDir is set.
func startReceiver(ctx context.Context, env *Env) (stop func(), err error) {
	o := benchtool.ServeOptions{
		Addr:  ":" + strconv.Itoa(env.Port),
		MPTCP: env.ServerMPTCP,
		Netns: env.Lab.NetnsPath(env.Roles.Server),
	}
	var logf *os.File
	if env.ReceiverLogDir != "" {
		logf, err = os.OpenFile(receiverLog(env, env.Roles.Server), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("receiver log: %w", err)
		}
		o.Log = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	closeLog := func() {
		if logf != nil {
			logf.Close()
		}
	}
	srv, err := benchtool.Listen(o)
	if err != nil {
		closeLog()
		return nil, err
	}
	if env.ServerMPTCP && !srv.MPTCP() {
		srv.Close()
		closeLog()
		return nil, errors.New("the receiver could not open an MPTCP listener (MPTCP disabled in the server node?)")
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ctx)
	}()
	return func() { cancel(); <-done; closeLog() }, nil
}

// receiverLog is the file startReceiver logs node's dropped clients to.
func receiverLog(env *Env, node string) string {
	if env.ReceiverLogDir == "" {
		return ""
	}
	return filepath.Join(env.ReceiverLogDir, "receiver-"+node+".log")
}

// seriesEvery samples the subflows during trials with a fault, to see when
// the restored path carries data again.
func seriesEvery(f *scenario.Fault) time.Duration {
	if f == nil {
		return 0
	}
	return 100 * time.Millisecond
}

// faultPath is the path name a fault's link carries: C0 is the default
// path, Ck detour k's core link (its NAT and tunnel subflows).
func faultPath(link, path string) bool {
	if link == "C0" {
		return path == "default"
	}
	if k, ok := strings.CutPrefix(link, "C"); ok {
		return strings.HasSuffix(path, ":detour"+k)
	}
	return false
}

// tailRate is the rate (Mbit/s) at which the sampled subflows together
// delivered after from (s): per subflow the most it reached after the
// last sample at or before from, less its bytes then (a subflow closed
// meanwhile keeps what it delivered), over the time sampled; nil without
// samples on both sides of from.
func tailRate(series []benchtool.SeriesPoint, from float64) *float64 {
	var base map[string]uint64
	var baseT, lastT float64
	most := map[string]uint64{}
	for _, pt := range series {
		if pt.T <= from {
			base, baseT = pt.Bytes, pt.T
			continue
		}
		lastT = pt.T
		for k, b := range pt.Bytes {
			most[k] = max(most[k], b)
		}
	}
	if base == nil || lastT <= baseT {
		return nil
	}
	var sum uint64
	for k, b := range most {
		if b > base[k] {
			sum += b - base[k]
		}
	}
	v := float64(sum) * 8 / 1e6 / (lastT - baseT)
	return &v
}

// resumeAfter is how long after the fault ended one of the faulted path's
// subflows (a replacement counts) had delivered more than when it ended;
// -1 if not before the transfer's end, nil if unknown (no samples, or no
// subflow on that path).
func resumeAfter(series []benchtool.SeriesPoint, f *scenario.Fault, pathOf func(key string) string) *float64 {
	end := (time.Duration(f.At) + time.Duration(f.For)).Seconds()
	var base map[string]uint64
	onPath := false
	for _, pt := range series {
		if pt.T <= end {
			base = pt.Bytes
			continue
		}
		if base == nil {
			return nil
		}
		for k, b := range pt.Bytes {
			if !faultPath(f.Link, pathOf(k)) {
				continue
			}
			onPath = true
			if b > base[k] {
				v := pt.T - end
				return &v
			}
		}
	}
	if !onPath {
		return nil
	}
	v := -1.0
	return &v
}

// attackProbePort is the attack prober's listener in the server node: not
// the receiver's port + 1 (the attack package's default), which is the
// setup-latency responder's (latencyPort) since every configuration runs
// one.
const attackProbePort = 5204

// startAttack starts the configuration's attack for one trial; the
// prober's connections go to a listener of its own (attackProbePort).
func startAttack(ctx context.Context, e *Env, a *scenario.Attack) (*attack.Run, error) {
	if a.From != "" && e.Lab.NetnsName(a.From) == "" {
		return nil, fmt.Errorf("attack: lab has no node %q", a.From)
	}
	return attack.Start(ctx, e.Lab, attack.Config{
		Kind: a.Kind, Attacker: a.From, Client: e.Roles.Client, Server: e.Roles.Server,
		Target: e.serverAddr(), Rate: a.Rate, ProbeRate: a.Probes, ProbePort: attackProbePort,
	})
}

// processCPU returns the user + system CPU time pid has used
// (/proc/PID/stat fields 14 and 15, in clock ticks of 1/100 s).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// sameHost says whether a and b are the same lab address in either family
// (an address or its IPv6 twin, topology.V6).
func sameHost(a, b netip.Addr) bool {
	return topology.V4(a.Unmap()) == topology.V4(b.Unmap())
}
