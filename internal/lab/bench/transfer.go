package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab/attack"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

func setupTCP(ctx context.Context, env *Env) (Session, error) {
	return &transfer{env: env, dst: env.serverAddr()}, nil
}

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
	if f := e.Cell.Fault; f != nil {
		stop, err := t.scheduleFault(ctx, f)
		if err != nil {
			return Measurement{}, err
		}
		defer stop()
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
	res, err := benchtool.Send(ctx, benchtool.SendOptions{
		Addr: t.dst.String(), Duration: e.Duration, Warmup: e.Warmup, MPTCP: t.mptcp, CC: e.CC,
		Netns: e.Lab.NetnsPath(e.Roles.Client), Download: e.Download, SeriesEvery: seriesEvery(e.Cell.Fault),
	})
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
	if res.CongestionControl != e.CC {
		return Measurement{}, fmt.Errorf("congestion control is %q, not %q", res.CongestionControl, e.CC)
	}
	if t.mptcp && !res.MPTCP {
		return Measurement{}, errors.New("the connection fell back to plain TCP")
	}
	if !t.mptcp && res.MPTCP {
		return Measurement{}, errors.New("plain TCP was requested but the connection is MPTCP")
	}
	m := Measurement{GoodputMbps: res.Goodput, WindowBytes: res.WindowBytes, MaxGapS: res.MaxGap, MaxGapEndS: res.MaxGapEnd, Attack: attackStats}
	client := e.Lab.Addr(e.Roles.Client)
	pathOf := func(local, remote netip.AddrPort) string {
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
			case local.Addr() == client && remote.Addr() == e.serverAddr().Addr():
				p = "default"
			default:
				p = local.Addr().String() + ">" + remote.Addr().String()
			}
		}
		return p
	}
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
	for _, sf := range res.Subflows {
		p := pathOf(sf.Local, sf.Remote)
		m.Subflows = append(m.Subflows, results.Subflow{
			Path: p, Local: sf.Local.String(), Remote: sf.Remote.String(),
			Bytes: sf.BytesAcked, WindowBytes: sf.WindowBytesAcked,
			RTTms: sf.RTT, MinRTTms: sf.MinRTT, Retrans: uint64(sf.Retransmits),
		})
	}
	// Default path first, then detours in name order (detour2 before detour10).
	sort.SliceStable(m.Subflows, func(i, j int) bool {
		a, b := m.Subflows[i].Path, m.Subflows[j].Path
		if (a == "default") != (b == "default") {
			return a == "default"
		}
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		return a < b
	})
	if t.wantSubflows > 1 && len(res.Subflows) < t.wantSubflows && e.Cell.Fault == nil && e.Cell.Attack == nil {
		return m, t.explain(fmt.Errorf("%d subflow(s) at the end of the transfer, want %d (a detour subflow did not come up)", len(res.Subflows), t.wantSubflows))
	}
	return m, nil
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
	return netip.AddrPortFrom(e.Lab.Addr(e.Roles.Server), uint16(e.Port))
}

// startReceiver serves goodput transfers in the server node until ctx ends.
func startReceiver(ctx context.Context, env *Env) (stop func(), err error) {
	srv, err := benchtool.Listen(benchtool.ServeOptions{
		Addr:  ":" + strconv.Itoa(env.Port),
		MPTCP: true,
		Netns: env.Lab.NetnsPath(env.Roles.Server),
	})
	if err != nil {
		return nil, err
	}
	if !srv.MPTCP() {
		srv.Close()
		return nil, errors.New("the receiver could not open an MPTCP listener (MPTCP disabled in the server node?)")
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ctx)
	}()
	return func() { cancel(); <-done }, nil
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

// startAttack starts the configuration's attack for one trial; the
// prober's connections go to the goodput receiver (it drops clients
// without its hello).
func startAttack(ctx context.Context, e *Env, a *scenario.Attack) (*attack.Run, error) {
	if a.From != "" && e.Lab.NetnsName(a.From) == "" {
		return nil, fmt.Errorf("attack: lab has no node %q", a.From)
	}
	return attack.Start(ctx, e.Lab, attack.Config{
		Kind: a.Kind, Attacker: a.From, Client: e.Roles.Client, Server: e.Roles.Server,
		Target: e.serverAddr(), Rate: a.Rate, ProbeRate: a.Probes,
	})
}
