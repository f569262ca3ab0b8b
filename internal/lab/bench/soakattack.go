package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/attack/breaks"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
)

// SoakAttack is what one in-place attack case did over the soak.
type SoakAttack struct {
	Case   string `json:"case"`
	Break  int    `json:"break"`
	Metric string `json:"metric"`
	Target string `json:"target"`
	Runs   int    `json:"runs"`
	Passed int    `json:"passed"`
	// Errors: runs that could not attack (neither passed nor failed).
	Errors int `json:"errors"`
	// Runs' figures and what each saw ("t=..s: ..."), in order.
	Values  []float64 `json:"values"`
	Details []string  `json:"details"`
}

// soakAttacks runs the in-place cases in turn while the soak's traffic
// runs, one every Options.AttackEvery, each while no relay is restarted
// and no link is faulted (quiet).
type soakAttacks struct {
	o      SoakOptions
	p      *breaks.InPlace
	quiet  *sync.Mutex
	mu     sync.Mutex
	byCase map[string]*SoakAttack
}

// AttackLongest bounds one case's run: none is started later than this
// before the churn ends (spoofed-junk ~17 s, subflow-churn ~20 s plus up
// to 30 s waiting for the kernel to make connections MPTCP again,
// forged-gossip up to ~40 s when the rosters are slow).
const AttackLongest = 60 * time.Second

// newSoakAttacks prepares the cases: their keys, authority and secret in
// dir/attacks, and the relays' and agent's configuration hooks in env.
func newSoakAttacks(o SoakOptions, env *Env, quiet *sync.Mutex) (*soakAttacks, error) {
	dir := filepath.Join(o.Dir, "attacks")
	// The other local user (convert-socket) reaches the agent's socket in
	// dir: both directories traversable (the files in them are 0600).
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{o.Dir, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	p, err := breaks.NewInPlace(dir)
	if err != nil {
		return nil, err
	}
	detours := env.Cell.Detours
	p.Lab, p.Binary, p.PeerCommand = o.Lab, o.Binary, o.PeerCommand
	if o.Self != "" {
		// The other local user runs a copy in dir: the lab binary's own
		// directory may not be reachable for it (a clone under /root).
		if p.Self, err = copyExecutable(o.Self, filepath.Join(dir, "mpdetour-lab-peer")); err != nil {
			return nil, err
		}
	}
	p.Relays = detours
	p.RelayAddr, p.RelayKey = map[string]netip.AddrPort{}, map[string]proto.Key{}
	p.Server, p.Echo = env.addr(env.Roles.Server), env.serverAddr()
	p.AgentLog, p.AgentMetrics, p.Subflows = filepath.Join(o.Dir, "agent.log"), soakAgentMetrics, soakSubflows
	env.RelayMembers = p.RelayMembers()
	env.RelayConfigFor = func(node string, pub proto.Key) (string, error) {
		p.RelayAddr[node] = netip.AddrPortFrom(env.addr(node), relay.DefaultPort)
		p.RelayKey[node] = pub
		return p.RelayConfig(node, pub, env.addr(node), env.addr(detours[0]))
	}
	a := &soakAttacks{o: o, p: p, quiet: quiet, byCase: map[string]*SoakAttack{}}
	for _, c := range o.Attacks {
		a.byCase[c] = &SoakAttack{Case: c}
	}
	return a, nil
}

// agentConfig is the agent's configuration text for the cases.
func (a *soakAttacks) agentConfig() string { return a.p.AgentConfig() }

// wire gives the cases what exists once the daemons run: the relays'
// reload and the soak's connection count.
func (a *soakAttacks) wire(rs *relays, env *Env, conns func() int64) {
	a.p.Conns = conns
	a.p.Reload = func(node string, edit func(string) string) error {
		path := filepath.Join(env.Dir, "relay-"+node+".yaml")
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(edit(string(b))), 0o600); err != nil {
			return err
		}
		d := rs.daemon(node)
		if d == nil {
			return fmt.Errorf("no relay in %s", node)
		}
		return d.cmd.Process.Signal(syscall.SIGHUP)
	}
}

// run starts a case every AttackEvery (the first after one period) until
// AttackLongest before end; start is the churn's start.
func (a *soakAttacks) run(ctx context.Context, start, end time.Time) {
	for n := 0; ; n++ {
		at := start.Add(time.Duration(n+1) * a.o.AttackEvery)
		if at.Add(AttackLongest).After(end) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		name := a.o.Attacks[n%len(a.o.Attacks)]
		a.quiet.Lock()
		t := time.Since(start).Seconds()
		r := a.p.Run(ctx, name)
		a.quiet.Unlock()
		a.record(t, r)
		if a.o.Progress != nil {
			res := "pass"
			switch {
			case r.Error != "":
				res = "ERROR " + r.Error
			case !r.Pass:
				res = "FAIL"
			}
			fmt.Fprintf(a.o.Progress, "soak t=%4.0fs attack %s (%.1f s): %s = %g (target %s): %s; %s\n", t, name, r.Seconds, r.Metric, r.Value, r.Target, res, r.Detail)
		}
	}
}

func (a *soakAttacks) record(t float64, r breaks.Result) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.byCase[r.Case]
	s.Break, s.Metric, s.Target = r.Break, r.Metric, r.Target
	s.Runs++
	switch {
	case r.Error != "":
		s.Errors++
		s.Details = append(s.Details, fmt.Sprintf("t=%.0fs: could not attack: %s", t, r.Error))
		return
	case r.Pass:
		s.Passed++
	}
	s.Values = append(s.Values, r.Value)
	s.Details = append(s.Details, fmt.Sprintf("t=%.0fs (%.1f s): %s", t, r.Seconds, r.Detail))
}

// report is every case's record, in the order of Options.Attacks.
func (a *soakAttacks) report() []SoakAttack {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []SoakAttack
	for _, c := range a.o.Attacks {
		out = append(out, *a.byCase[c])
	}
	return out
}

// figures are the runs' figures, "a, b, c" ("none" without any).
func (s SoakAttack) figures() string {
	if len(s.Values) == 0 {
		return "none"
	}
	vals := make([]string, len(s.Values))
	for i, v := range s.Values {
		vals[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(vals, ", ")
}

// attackChecks: every case ran at least once and passed every time.
func attackChecks(as []SoakAttack) []SoakCheck {
	var checks []SoakCheck
	for _, s := range as {
		detail := fmt.Sprintf("%d runs, %d passed, %d could not attack; %s: %s (target %s)", s.Runs, s.Passed, s.Errors, s.Metric, s.figures(), s.Target)
		checks = append(checks, SoakCheck{Name: "attack " + s.Case, OK: s.Runs > 0 && s.Passed == s.Runs, Detail: detail})
	}
	return checks
}

// learnedLimits counts the join limits the agent learned over the whole
// soak (its log): the server accepts every join (MPTCP limits 8), so each
// one is wrong (issue 28's "0 wrongly learned limits in the soak").
func learnedLimits(agentLog string) (int, string, error) {
	f, err := os.Open(agentLog)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	n, first := 0, ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "server subflow limit learned") {
			if n == 0 {
				first = sc.Text()
			}
			n++
		}
	}
	return n, first, sc.Err()
}

// copyExecutable copies the executable src to dst (mode 0755).
func copyExecutable(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return "", err
	}
	return dst, out.Close()
}
