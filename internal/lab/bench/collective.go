package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// Procedure collective (topology collective, docs/collective.md): the cell's detour
// nodes run relays of one collective (certificates from one authority,
// gossip cluster joined through the first relay); every trial starts an
// agent on each client node whose configuration lists ONE bootstrap relay
// (client i: relay i) with discovery on, opens an MPTCP connection from
// each client to a sink in the server node, and measures per client the
// time from the agent's start until (a) grants from >= 3 discovered relays
// (agent log) and (b) established subflows through >= 3 relays (the
// client's kernel, inet_diag). Then it kills with SIGKILL a relay that
// carries detours (the one used by most clients, never a bootstrap relay)
// and measures (c) until it is gone from every other relay's roster and
// dropped by every affected agent, and (d) until each affected client has
// subflows through as many live relays as before. The killed relay is
// restarted (and awaited in every roster) before the next trial.

const (
	collSinkPort   = 5203
	collGossipPort = 7946
	// collWant is the number of relays the targets count.
	collWant = 3
	// collMax is the agents' discovery max unless the cell's subflows
	// (procedure spec `subflows`) says otherwise.
	collMax = 4
	// collLimit bounds each measured phase of a trial.
	collLimit = 20 * time.Second
	// collConverge bounds waiting for every roster to list every relay.
	collConverge = 60 * time.Second
	collPoll     = 50 * time.Millisecond
)

type collRelay struct {
	node     string
	addr     netip.Addr
	key      proto.Key
	cfg      string
	d        *daemon
	restarts int
}

type collClient struct {
	node      string
	key       proto.Key
	cfg, sock string
	bootstrap int // index into relays
}

type collSession struct {
	env     *Env
	relays  []*collRelay
	clients []*collClient
	byAddr  map[netip.Addr]int // relay address -> index
	max     int
	// interval: the agents' discovery.interval ("" = their default).
	interval string
	sink     net.Listener
	sinkWG   sync.WaitGroup
	sinkMu   sync.Mutex
	sinkCs   []net.Conn
	agents   []*daemon
	// leaves undo the agents' lab cgroup (withLabCgroup), at Close.
	leaves []func() error
}

func setupCollective(ctx context.Context, env *Env) (_ Session, err error) {
	clients := env.Roles.Clients
	if len(clients) == 0 {
		clients = []string{env.Roles.Client}
	}
	if len(env.Cell.Detours) < collWant+1 {
		return nil, fmt.Errorf("procedure collective needs at least %d relays (roles.detours), not %d", collWant+1, len(env.Cell.Detours))
	}
	for _, n := range clients {
		if env.Lab.NetnsName(n) == "" {
			return nil, fmt.Errorf("procedure collective: no client node %q in the lab", n)
		}
	}
	s := &collSession{env: env, byAddr: map[netip.Addr]int{}, max: collMax}
	if env.Cell.Subflows > 0 {
		s.max = env.Cell.Subflows
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	auth, err := collective.NewAuthority()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	issue := func(k proto.Key, name string, roles collective.Roles) (string, error) {
		c, err := auth.Issue(k.Public(), name, roles, now.Add(-time.Hour), now.Add(30*24*time.Hour))
		if err != nil {
			return "", err
		}
		p := filepath.Join(env.Dir, name+".cert")
		return p, os.WriteFile(p, []byte(c.String()+"\n"), 0o600)
	}
	gossipKey := filepath.Join(env.Dir, "gossip.key") // one secret for all relays
	if err := os.WriteFile(gossipKey, []byte(roster.NewSecret()), 0o600); err != nil {
		return nil, err
	}
	server := env.Lab.Addr(env.Roles.Server)
	first := env.Lab.Addr(env.Cell.Detours[0])
	for i, node := range env.Cell.Detours {
		k, err := proto.GenerateKey()
		if err != nil {
			return nil, err
		}
		cert, err := issue(k, node, collective.RoleRelay)
		if err != nil {
			return nil, err
		}
		addr := env.Lab.Addr(node)
		join := ""
		if i > 0 {
			join = fmt.Sprintf("    join: [%s]\n", netip.AddrPortFrom(first, collGossipPort))
		}
		cfg := fmt.Sprintf(`listen: %s
private_key: %s
ports: 40000-40999
lease: %s
allow_destinations: [%s/32]
collective:
  authority: %s
  certificate_file: %s
  gossip:
    bind: %s
    secret_file: %s
%s    region: lab
`, netip.AddrPortFrom(addr, relay.DefaultPort), k, relayLease, server, auth.Public(), cert,
			netip.AddrPortFrom(addr, collGossipPort), gossipKey, join)
		cfg += env.RelayConfig
		path := filepath.Join(env.Dir, "relay-"+node+".yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		if err := enableForwarding(env, node); err != nil {
			return nil, err
		}
		s.relays = append(s.relays, &collRelay{node: node, addr: addr, key: k, cfg: path})
		s.byAddr[addr] = i
	}
	// MPDETOUR_BENCH_DISCOVERY_INTERVAL sets the agents' roster poll
	// (discovery.interval; default relayclient.DefaultDiscoveryEvery),
	// recorded in every trial.
	if v := os.Getenv("MPDETOUR_BENCH_DISCOVERY_INTERVAL"); v != "" {
		if _, err := time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("MPDETOUR_BENCH_DISCOVERY_INTERVAL: %w", err)
		}
		s.interval = v
	}
	level := "debug" // "relay grant" lines time (a)
	if v := os.Getenv("MPDETOUR_BENCH_LOG"); v != "" {
		level = v
	}
	for i, node := range clients {
		k, err := proto.GenerateKey()
		if err != nil {
			return nil, err
		}
		cert, err := issue(k, node, collective.RoleClient)
		if err != nil {
			return nil, err
		}
		c := &collClient{node: node, key: k, bootstrap: i % len(s.relays),
			cfg: filepath.Join(env.Dir, "agent-"+node+".yaml"), sock: filepath.Join(env.Dir, "agent-"+node+".sock")}
		cfg, leave, err := withLabCgroup(s.clientConfig(c, level, server, cert, auth.Public()) + env.AgentConfig)
		if err != nil {
			return nil, err
		}
		s.leaves = append(s.leaves, leave)
		if err := os.WriteFile(c.cfg, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		s.clients = append(s.clients, c)
	}
	if err := s.startSink(); err != nil {
		return nil, err
	}
	// The first relay, then the others (they join it).
	if err := s.startRelay(ctx, s.relays[0]); err != nil {
		return nil, err
	}
	if err := s.relays[0].d.waitFor(ctx, "status", 15*time.Second, func() bool { return s.roster(s.relays[0]) != nil }); err != nil {
		return nil, err
	}
	for _, r := range s.relays[1:] {
		if err := s.startRelay(ctx, r); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *collSession) startRelay(ctx context.Context, r *collRelay) error {
	name := "relay-" + r.node
	if r.restarts > 0 {
		name += fmt.Sprintf("-restart%d", r.restarts)
	}
	d, err := startDaemon(ctx, s.env, r.node, name, s.env.Binary, "relay", "--config", r.cfg)
	if err != nil {
		return err
	}
	r.d = d
	return nil
}

// startSink accepts MPTCP connections in the server node and discards what
// they send.
func (s *collSession) startSink() error {
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	err := s.env.Lab.Do(s.env.Roles.Server, func() error {
		var err error
		s.sink, err = lc.Listen(context.Background(), "tcp4", fmt.Sprintf(":%d", collSinkPort))
		return err
	})
	if err != nil {
		return fmt.Errorf("sink in %s: %w", s.env.Roles.Server, err)
	}
	s.sinkWG.Add(1)
	go func() {
		defer s.sinkWG.Done()
		for {
			c, err := s.sink.Accept()
			if err != nil {
				return
			}
			s.sinkMu.Lock()
			s.sinkCs = append(s.sinkCs, c)
			s.sinkMu.Unlock()
			s.sinkWG.Add(1)
			go func() {
				defer s.sinkWG.Done()
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return nil
}

func (s *collSession) Close() error {
	var errs []error
	for _, a := range s.agents {
		errs = append(errs, a.stop())
	}
	s.agents = nil
	for _, r := range s.relays {
		if r.d != nil {
			errs = append(errs, r.d.stop())
		}
	}
	if s.sink != nil {
		s.sink.Close()
		s.sinkMu.Lock()
		for _, c := range s.sinkCs {
			c.Close()
		}
		s.sinkMu.Unlock()
		s.sinkWG.Wait()
		s.sink = nil
	}
	for _, l := range s.leaves {
		errs = append(errs, l())
	}
	s.leaves = nil
	return errors.Join(errs...)
}

// clientConfig is client c's agent configuration, before the scenario's
// AgentConfig: level its log level, server the destination it selects,
// cert its certificate file, authority the collective's key.
func (s *collSession) clientConfig(c *collClient, level string, server netip.Addr, cert string, authority collective.AuthorityKey) string {
	b := s.relays[c.bootstrap]
	// The bootstrap relay is one of the agent's detours too; max
	// discovered ones besides it.
	cfg := fmt.Sprintf(`socket: %s
subflows: %d
log_level: %s
selectors:
  - {prefixes: [%s/32], ports: ["%d"]}
relays:
  key: %s
  certificate_file: %s
  servers:
    - {name: %s, address: %s, public_key: %s}
  discovery:
    authority: %s
    max: %d
`, c.sock, s.max+1, level, server, collSinkPort, c.key, cert, b.node, netip.AddrPortFrom(b.addr, relay.DefaultPort), b.key.Public(), authority, s.max)
	if s.interval != "" {
		cfg += "    interval: " + s.interval + "\n"
	}
	return cfg
}

// roster returns the names in the roster of relay r (nil: no answer).
func (s *collSession) roster(r *collRelay) map[string]bool {
	var st *relay.Status
	err := s.env.Lab.Do(r.node, func() error {
		var err error
		st, err = relay.QueryStatus(time.Second)
		return err
	})
	if err != nil || st == nil || st.Roster == nil {
		return nil
	}
	m := map[string]bool{}
	for _, e := range st.Roster.Relays {
		m[e.Name] = true
	}
	return m
}

// converged waits until every relay runs and lists every relay.
func (s *collSession) converged(ctx context.Context) error {
	deadline := time.Now().Add(collConverge)
	for {
		var missing []string
		for _, r := range s.relays {
			if ok, _ := r.d.exited(); ok {
				return r.d.failure()
			}
			if m := s.roster(r); len(m) != len(s.relays) {
				missing = append(missing, fmt.Sprintf("%s lists %d", r.node, len(m)))
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rosters not complete after %s (%d relays): %s", collConverge, len(s.relays), strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// subflowRelays returns, per relay index, whether the client node has an
// established MPTCP subflow to that relay's address.
func (s *collSession) subflowRelays(node string) (map[int]bool, error) {
	sfs, err := mptcppm.DumpSubflows(mptcppm.Options{NetNS: s.env.Lab.NetnsPath(node)})
	if err != nil {
		return nil, err
	}
	m := map[int]bool{}
	for _, sf := range sfs {
		if sf.State != 1 { // TCP_ESTABLISHED
			continue
		}
		if i, ok := s.byAddr[sf.Remote.Addr().Unmap()]; ok {
			m[i] = true
		}
	}
	return m, nil
}

func secs(d time.Duration) float64 { return d.Seconds() }

func fptr(v float64) *float64 { return &v }

func (s *collSession) Trial(ctx context.Context, n int) (Measurement, error) {
	env := s.env
	// Every relay up (the one killed last trial restarted) and in every roster.
	for _, r := range s.relays {
		if ok, _ := r.d.exited(); ok {
			r.restarts++
			if err := s.startRelay(ctx, r); err != nil {
				return Measurement{}, err
			}
		}
	}
	if err := s.converged(ctx); err != nil {
		return Measurement{}, err
	}
	res := &results.Collective{Relays: len(s.relays), DiscoveryInterval: s.interval}
	if s.interval == "" {
		res.DiscoveryInterval = relayclient.DefaultDiscoveryEvery.String() + " (default)"
	}
	runs := make([]*collRun, len(s.clients))
	for i, c := range s.clients {
		_ = os.Remove(c.sock)
		r := &collRun{c: c, out: results.CollectiveClient{Name: c.node, Bootstrap: s.relays[c.bootstrap].node,
			ConnectS: -1, UsableS: -1, DetoursS: -1, DiscoveredDetoursS: -1}}
		runs[i] = r
	}
	defer func() {
		for _, r := range runs {
			if r.conn != nil {
				r.conn.Close()
			}
			if r.agent != nil {
				r.agent.stop()
			}
		}
		s.agents = nil
	}()
	// Phase 1: discovery. All agents start at once.
	for _, r := range runs {
		r.t0 = time.Now()
		d, err := startDaemon(ctx, env, r.c.node, fmt.Sprintf("agent-%s-t%d", r.c.node, n), env.Binary, "agent", "--config", r.c.cfg)
		if err != nil {
			return Measurement{}, err
		}
		r.agent = d
		s.agents = append(s.agents, d)
	}
	stopWriters := make(chan struct{})
	var writers sync.WaitGroup
	defer func() { close(stopWriters); writers.Wait() }()
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A little traffic from the start: the client's MPTCP
			// connection is fully established (the PM's ESTABLISHED
			// event, when the agent adds subflows) only once data flows,
			// as with any application; it also keeps every subflow in use.
			r.err = s.discover(ctx, r.c, r.agent, r.t0, &r.out, &r.conn, func(conn net.Conn) {
				writers.Add(1)
				go func() {
					defer writers.Done()
					buf := make([]byte, 1024)
					t := time.NewTicker(100 * time.Millisecond)
					defer t.Stop()
					for {
						if _, err := conn.Write(buf); err != nil {
							return
						}
						select {
						case <-stopWriters:
							return
						case <-t.C:
						}
					}
				}()
			})
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Measurement{}, err
	}
	for _, r := range runs {
		if r.err != nil {
			return Measurement{}, fmt.Errorf("%s: %w", r.c.node, r.err)
		}
	}
	// The relays each client uses now; the victim carries detours of the
	// most clients and is nobody's bootstrap.
	boot := map[int]bool{}
	for _, c := range s.clients {
		boot[c.bootstrap] = true
	}
	carried := map[int][]int{}
	for ci, r := range runs {
		m, err := s.subflowRelays(r.c.node)
		if err != nil {
			return Measurement{}, err
		}
		r.before = m
		for i := range m {
			r.out.Relays = append(r.out.Relays, s.relays[i].node)
			if !boot[i] {
				carried[i] = append(carried[i], ci)
			}
		}
		slices.Sort(r.out.Relays)
	}
	victim := -1
	for i := range s.relays {
		if len(carried[i]) > 0 && (victim < 0 || len(carried[i]) > len(carried[victim])) {
			victim = i
		}
	}
	if victim < 0 {
		for _, r := range runs {
			r.agent.stop()
		}
		fillLogTimes(time.Time{}, "", runs)
		for _, r := range runs {
			res.Clients = append(res.Clients, r.out)
		}
		return Measurement{Collective: res}, errors.New("no detour subflow through any relay that is not a bootstrap relay: nothing to kill")
	}
	v := s.relays[victim]
	res.Killed = v.node
	var affected []*collRun
	for _, ci := range carried[victim] {
		affected = append(affected, runs[ci])
		res.Affected = append(res.Affected, runs[ci].c.node)
	}
	// Phase 2: SIGKILL (no leave message; its nftables table stays, so
	// subflows through it keep working until someone closes them). The
	// agents started together and read the roster every interval from
	// their start: a random wait of up to one interval puts the kill at
	// a random phase of their reads, as a relay's death would be.
	iv := relayclient.DefaultDiscoveryEvery
	if s.interval != "" {
		iv, _ = time.ParseDuration(s.interval)
	}
	select {
	case <-time.After(rand.N(iv)):
	case <-ctx.Done():
		return Measurement{}, ctx.Err()
	}
	if err := v.d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return Measurement{}, err
	}
	tk := time.Now()
	res.KilledAtS = secs(tk.Sub(runs[0].t0))
	<-v.d.done
	outAt := map[int]time.Duration{}
	replaced := map[*collRun]time.Duration{}
	gone := map[*collRun]time.Duration{}
	for time.Since(tk) < collLimit {
		for i, r := range s.relays {
			if i == victim {
				continue
			}
			if _, ok := outAt[i]; ok {
				continue
			}
			if m := s.roster(r); m != nil && !m[v.node] {
				outAt[i] = time.Since(tk)
			}
		}
		for _, r := range affected {
			m, err := s.subflowRelays(r.c.node)
			if err != nil {
				continue
			}
			at := time.Since(tk)
			if _, ok := gone[r]; !ok && !m[victim] {
				gone[r] = at
			}
			live := 0
			for i := range m {
				if i != victim {
					live++
				}
			}
			if _, ok := replaced[r]; !ok && live >= len(r.before) {
				replaced[r] = at
			}
		}
		if len(outAt) == len(s.relays)-1 && len(replaced) == len(affected) && len(gone) == len(affected) {
			break
		}
		select {
		case <-ctx.Done():
			return Measurement{}, ctx.Err()
		case <-time.After(collPoll):
		}
	}
	res.OutOfRostersS = 0
	for i := range s.relays {
		if i == victim {
			continue
		}
		d, ok := outAt[i]
		if !ok {
			res.OutOfRostersS = -1
			res.OutOfRosterEachS = append(res.OutOfRosterEachS, -1)
			continue
		}
		res.OutOfRosterEachS = append(res.OutOfRosterEachS, secs(d))
		if res.OutOfRostersS >= 0 {
			res.OutOfRostersS = max(res.OutOfRostersS, secs(d))
		}
	}
	for _, r := range affected {
		r.out.ReplacedS, r.out.VictimGoneS = fptr(-1), fptr(-1)
		if d, ok := replaced[r]; ok {
			r.out.ReplacedS = fptr(secs(d))
		}
		if d, ok := gone[r]; ok {
			r.out.VictimGoneS = fptr(secs(d))
		}
	}
	// Stop the agents (their logs complete) and read the times they logged.
	for _, r := range runs {
		r.conn.Close()
		r.conn = nil
		r.agent.stop()
	}
	fillLogTimes(tk, v.node, runs)
	for _, r := range affected {
		if r.out.DroppedS == nil {
			r.out.DroppedS = fptr(-1)
		}
	}
	res.DroppedByAgentsS = 0
	for _, r := range affected {
		if *r.out.DroppedS < 0 {
			res.DroppedByAgentsS = -1
			break
		}
		res.DroppedByAgentsS = max(res.DroppedByAgentsS, *r.out.DroppedS)
	}
	for _, r := range runs {
		res.Clients = append(res.Clients, r.out)
	}
	return Measurement{Collective: res}, nil
}

// discover waits for the agent's status socket, opens the MPTCP
// connection, and polls the client's subflows until they go through
// collWant relays and collWant discovered relays (or collLimit).
func (s *collSession) discover(ctx context.Context, c *collClient, agent *daemon, t0 time.Time, out *results.CollectiveClient, conn *net.Conn, write func(net.Conn)) error {
	err := agent.waitFor(ctx, "status socket", collLimit, func() bool {
		_, err := os.Stat(c.sock)
		return err == nil
	})
	if err != nil {
		return err
	}
	out.ConnectS = secs(time.Since(t0))
	var d net.Dialer
	d.SetMultipathTCP(true)
	d.Timeout = 5 * time.Second
	sink := netip.AddrPortFrom(s.env.Lab.Addr(s.env.Roles.Server), collSinkPort)
	err = s.env.Lab.Do(c.node, func() error {
		var err error
		*conn, err = d.DialContext(ctx, "tcp4", sink.String())
		return err
	})
	if err != nil {
		return fmt.Errorf("connecting to the sink %s: %w", sink, err)
	}
	write(*conn)
	for time.Since(t0) < collLimit {
		m, err := s.subflowRelays(c.node)
		if err != nil {
			return err
		}
		disc := 0
		for i := range m {
			if i != c.bootstrap {
				disc++
			}
		}
		at := secs(time.Since(t0))
		if out.DetoursS < 0 && len(m) >= collWant {
			out.DetoursS = at
		}
		if out.DiscoveredDetoursS < 0 && disc >= collWant {
			out.DiscoveredDetoursS = at
		}
		if out.DetoursS >= 0 && out.DiscoveredDetoursS >= 0 && disc >= min(s.max, len(s.relays)-1) {
			return nil // every discovered relay in use
		}
		if ok, _ := agent.exited(); ok {
			return agent.failure()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(collPoll):
		}
	}
	return nil
}

var logTime = regexp.MustCompile(`^time=(\S+) `)

// collRun is one client's agent in a trial.
type collRun struct {
	c      *collClient
	agent  *daemon
	t0     time.Time
	conn   net.Conn
	out    results.CollectiveClient
	before map[int]bool
	err    error
}

// fillLogTimes reads the agents' logs: UsableS (the grant from the
// collWant-th distinct discovered relay, from the agent's start) and,
// for the killed relay victim (a node name), DroppedS (from tk) of the
// agents that dropped it.
func fillLogTimes(tk time.Time, victim string, runs []*collRun) {
	for _, r := range runs {
		grants, dropped, err := agentLogTimes(r.agent.logPath, victim)
		if err != nil {
			continue
		}
		var ts []time.Time
		for _, at := range grants {
			ts = append(ts, at)
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		if len(ts) >= collWant {
			r.out.UsableS = secs(ts[collWant-1].Sub(r.t0))
		}
		if victim != "" && !dropped.IsZero() {
			r.out.DroppedS = fptr(secs(dropped.Sub(tk)))
		}
	}
}

// agentLogTimes parses an agent log: when each discovered relay first
// granted, and when relay victim (a node name; "" none) was dropped.
func agentLogTimes(path, victim string) (grants map[string]time.Time, dropped time.Time, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer f.Close()
	grants = map[string]time.Time{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339, m[1])
		if err != nil {
			continue
		}
		rel := ""
		if i := strings.Index(line, " relay=roster:"); i >= 0 {
			rel = line[i+len(" relay=roster:"):]
			if j := strings.IndexByte(rel, ' '); j >= 0 {
				rel = rel[:j]
			}
		}
		switch {
		case rel != "" && strings.Contains(line, `msg="relay grant"`):
			if _, ok := grants[rel]; !ok {
				grants[rel] = at
			}
		case rel != "" && rel == victim && dropped.IsZero() && strings.Contains(line, `msg="roster: relay left the roster, dropped"`):
			dropped = at
		}
	}
	return grants, dropped, sc.Err()
}
