package breaks

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// The subflow-churn case (break 7, and break 6's "0 wrongly learned
// limits" under churn): the issue's load, 200 short MPTCP connections/s
// for 60 s through 4 NAT detours.
const (
	churnDetours  = 4
	churnRate     = 200 // connections per second
	churnFor      = 60 * time.Second
	churnSettle   = 10 * time.Second // retries after the last connection are counted too
	churnPort     = 5201
	churnMetrics  = "127.0.0.1:9467"
	churnMaxHold  = 200 * time.Millisecond
	churnSendSize = 4 << 10
	// subflow-churn-mixed: the port whose server answers and closes first.
	churnClosePort = 5202
)

// subflowChurn (break 7): relays in 4 detour nodes grant NAT detours to the
// agent in the client (subflows: 4); the client opens 200 MPTCP
// connections/s for 60 s to an echo server that accepts every join (MPTCP
// limits 8), each sends 4 KiB, reads it back and stays open 0-200 ms. The
// agent runs at log level debug: its log names every SUBFLOW_CREATE it
// decided (with the token) and every refusal (with the errno) in any
// build, so a build from before the fix is counted the same way. Target:
// SUBFLOW_CREATE <= 2 x the subflows that can exist (connections x 4
// detours), and no join limit learned (the server accepts all joins, so
// every learned "extra_subflows" is wrong).
func subflowChurn(ctx context.Context, o Options) Result {
	return churnCase(ctx, o, false)
}

// subflowChurnMixed is subflow-churn with the conditions under which a
// connection stays known to the kernel but refuses new subflows for
// seconds (ENOTCONN), and detours that make the agent retry:
//   - a mix of connections (by number, of 8): 3 where the server answers
//     and closes first and the client keeps its end open 1-5 s (the
//     connection is half closed: SUBFLOW_CREATE gets ENOTCONN, no CLOSED
//     event yet); 1 that writes and closes at once (closed while the
//     agent's creates are in flight: "invalid token"); 2 short ones as in
//     subflow-churn; 2 idle ones held open 10-20 s;
//   - after the warm-up, detour3 drops half of the joins' SYNs (slow
//     joins) and detour4 answers half of them with a reset (refused
//     joins, errno 111), so connections keep waiting for a fourth detour;
//   - the agent is stopped (SIGSTOP) for 5 s at 20 s and 40 s (churnStalls);
//   - the client's namespace can sustain the load: ephemeral ports
//     1024-65000, tcp_tw_reuse 1 and at most 8192 TIME_WAIT sockets
//     (subflow-churn ran out of ports at ~170 connections/s).
//
// Same counting and target as subflow-churn. Seen in its first runs: the
// kernel sends a connection's ESTABLISHED event after its CLOSED (the
// application closed before the connection was fully established; the
// token stays valid while the socket closes), and every SUBFLOW_CREATE
// for it is refused with ENOTCONN.
func subflowChurnMixed(ctx context.Context, o Options) Result {
	return churnCase(ctx, o, true)
}

func churnCase(ctx context.Context, o Options, mixed bool) Result {
	r := Result{Break: 7, Metric: "SUBFLOW_CREATE / (connections x 4 detours)", Target: "<= 2 (and <= 8 for every token), 0 limits learned"}
	cl, relayKeys, member, err := churnLab(ctx, o)
	if err != nil {
		return r.failed(err)
	}
	defer cl.close()
	server := netip.AddrPortFrom(cl.Addr("server"), churnPort)
	if out, err := cl.run(ctx, "server", "ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8"); err != nil {
		return r.failed(fmt.Errorf("server MPTCP limits: %v: %s", err, out))
	}
	ports := []uint16{churnPort}
	if mixed {
		ports = append(ports, churnClosePort)
		if err := churnClientSysctls(cl); err != nil {
			return r.failed(err)
		}
	}
	for _, port := range ports {
		var ln net.Listener
		if err := cl.do("server", func() (err error) {
			var lc net.ListenConfig
			lc.SetMultipathTCP(true)
			ln, err = lc.Listen(ctx, "tcp4", netip.AddrPortFrom(server.Addr(), port).String())
			return err
		}); err != nil {
			return r.failed(fmt.Errorf("server sink: %w", err))
		}
		defer ln.Close()
		go churnEcho(ln, port == churnClosePort)
	}
	var relays strings.Builder
	for i, k := range relayKeys {
		node := fmt.Sprintf("detour%d", i+1)
		addr := netip.AddrPortFrom(cl.Addr(node), relayPort)
		if err := cl.do(node, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
			return r.failed(fmt.Errorf("ip_forward in %s: %w", node, err))
		}
		if _, err := cl.startRelay(ctx, o, node, "relay-"+node, fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 10m\nmembers:\n  - {name: churn, public_key: %s}\nallow_destinations: [%s/32]\n",
			addr, k, member.Public(), server.Addr())); err != nil {
			return r.failed(err)
		}
		fmt.Fprintf(&relays, "    - {name: %s, address: '%s', public_key: %s}\n", node, addr, k.Public())
	}
	sock := filepath.Join(o.Dir, "agent.sock")
	agentCfg := filepath.Join(o.Dir, "agent.yaml")
	agentLog := filepath.Join(o.Dir, "agent.log")
	quoted := make([]string, len(ports))
	for i, p := range ports {
		quoted[i] = strconv.Quote(strconv.Itoa(int(p)))
	}
	// subflow_lowat: 0: this case is not about the limit, and its BPF
	// program would attach to the cgroup v2 root (other labs' sockets);
	// the bench's per-runner cgroup (bench.withLabCgroup) is not
	// reachable from here (bench imports this package).
	if err := os.WriteFile(agentCfg, []byte(fmt.Sprintf("socket: %s\nsubflows: %d\nlog_level: debug\nsubflow_lowat: 0\nselectors:\n  - {prefixes: [%s/32], ports: [%s]}\nmetrics: {listen: %s}\nrelays:\n  key: %s\n  servers:\n%s",
		sock, churnDetours, server.Addr(), strings.Join(quoted, ", "), churnMetrics, member, relays.String())), 0o600); err != nil {
		return r.failed(err)
	}
	if err := cl.start(ctx, "client", agentLog, o.Binary, "agent", "--config", agentCfg); err != nil {
		return r.failed(err)
	}
	agentProc := cl.procs[len(cl.procs)-1]
	// Ready: one connection held open gets all 4 detour subflows (else the
	// case would count creates for detours that never worked).
	if err := churnWarm(ctx, cl, o.Binary, sock, server); err != nil {
		r.Error = fmt.Sprintf("%v; the agent's log ends: %s", err, tail(agentLog, 600))
		return r
	}
	if mixed {
		if err := churnFaults(ctx, cl, server.Addr()); err != nil {
			return r.failed(err)
		}
	}
	load0 := loadAvg()
	logFrom := fileSize(agentLog)
	t0 := time.Now()
	stalls := make(chan struct{})
	if mixed {
		go churnStalls(ctx, agentProc, t0, stalls)
	} else {
		close(stalls)
	}
	tally := churnDrive(ctx, cl, server, mixed, churnRate, churnFor)
	<-stalls
	driven := time.Since(t0)
	time.Sleep(churnSettle)
	load1 := loadAvg()
	metric, _ := scrapeCounter(cl.Lab, "client", churnMetrics, "mpdetour_agent_subflow_creates_total")
	// Stop the agent (SIGTERM) so that its log is complete, then read it.
	stopProc(agentProc)
	st, err := countAgentLog(agentLog, logFrom)
	if err != nil {
		return r.failed(err)
	}
	possible := tally.ok * churnDetours
	if possible == 0 {
		r.Error = fmt.Sprintf("no connection of %d succeeded (%s)", tally.started, tally.failures())
		return r
	}
	r.Value = float64(st.creates) / float64(possible)
	r.Value = float64(int(r.Value*1000+0.5)) / 1000
	// The target read for the whole run and for each connection: a
	// storm can hide in the total (most connections get fewer than 4
	// detour subflows when detours fail) but not in its tokens.
	over := st.tokensOver(2 * churnDetours)
	r.Pass = r.Value <= 2 && over == 0 && st.learned == 0
	metricText := "no subflow_creates_total metric in this build"
	if metric >= 0 {
		metricText = fmt.Sprintf("metric subflow_creates_total %d", int64(metric))
	}
	r.Detail = fmt.Sprintf("%d connections in %.1f s (%d ok, %s), 4 detours: %d creates in the log (%s) for %d possible subflows; "+
		"refused: %s; max %d creates for one token (%s; %d tokens > %d, %d tokens > %d); busiest second %d creates; %d subflows established; %d event losses; %d limits learned%s; load %s -> %s",
		tally.started, driven.Seconds(), tally.ok, tally.failures(), st.creates, metricText, possible,
		st.refusedText(), st.maxPerToken, st.maxTokenSpan(), st.tokensOver(churnDetours), churnDetours, over, 2*churnDetours, st.busiestSecond, st.established, st.lost, st.learned, st.learnedText(), load0, load1)
	return r
}

// churnLab is the detours topology with 4 detours and no delay (the churn
// is about the agent's handling of kernel refusals, not path delay), plus
// a key per relay and the member's key.
func churnLab(ctx context.Context, o Options) (*caseLab, []proto.Key, proto.Key, error) {
	var member proto.Key
	keys := make([]proto.Key, churnDetours)
	for i := range keys {
		var err error
		if keys[i], err = proto.GenerateKey(); err != nil {
			return nil, nil, member, err
		}
	}
	member, err := proto.GenerateKey()
	if err != nil {
		return nil, nil, member, err
	}
	t, err := topology.Builtin("detours")
	if err != nil {
		return nil, nil, member, err
	}
	if err := t.Set("detours", strconv.Itoa(churnDetours)); err != nil {
		return nil, nil, member, err
	}
	if err := t.Set("all.delay", "0"); err != nil {
		return nil, nil, member, err
	}
	l, err := lab.Up(ctx, t, o.LabName+"n")
	if err != nil {
		return nil, nil, member, err
	}
	return &caseLab{Lab: l}, keys, member, nil
}

// churnEcho echoes each connection and closes it when the client has; with
// closeFirst it reads churnSendSize bytes, writes them back and closes
// first (the client's end stays open as long as the client keeps it).
func churnEcho(ln net.Listener, closeFirst bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if !closeFirst {
				io.Copy(c, c)
				return
			}
			c.SetDeadline(time.Now().Add(15 * time.Second))
			buf := make([]byte, churnSendSize)
			if _, err := io.ReadFull(c, buf); err == nil {
				c.Write(buf)
			}
		}()
	}
}

// subflow-churn-mixed stops the agent (SIGSTOP) for churnStall at each of
// churnStallAt into the churn: an agent starved of CPU on a loaded host
// (the runs had load averages above 20 on 2 cores). Its event
// socket overflows, it loses events (some CLOSED among them) and
// resynchronises from inet_diag.
var churnStallAt = []time.Duration{20 * time.Second, 40 * time.Second}

const churnStall = 5 * time.Second

// churnStalls stops and continues p on churnStallAt's schedule from t0
// and closes done when p runs again for good; when ctx ends (Ctrl-C) it
// continues p at once and returns, so the case's cleanup does not wait
// for the schedule.
func churnStalls(ctx context.Context, p *exec.Cmd, t0 time.Time, done chan<- struct{}) {
	defer close(done)
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for _, at := range churnStallAt {
		if !wait(time.Until(t0.Add(at))) {
			return
		}
		if p.Process.Signal(syscall.SIGSTOP) != nil {
			return
		}
		ok := wait(churnStall)
		p.Process.Signal(syscall.SIGCONT)
		if !ok {
			return
		}
	}
}

// churnClientSysctls lets the client's namespace sustain 200 connections/s
// with 4 detour subflows each (about 1,000 local ports/s, each bound for
// 60 s in TIME_WAIT by default): ports 1024-65000, TIME_WAIT reuse for
// connects and at most 8192 TIME_WAIT sockets (beyond that the kernel
// closes without TIME_WAIT). Load generator settings: the agent is not
// told.
func churnClientSysctls(cl *caseLab) error {
	for _, kv := range [][2]string{
		{"ip_local_port_range", "1024 65000"},
		{"tcp_tw_reuse", "1"},
		{"tcp_max_tw_buckets", "8192"},
	} {
		if err := cl.do("client", func() error {
			return os.WriteFile("/proc/sys/net/ipv4/"+kv[0], []byte(kv[1]), 0o644)
		}); err != nil {
			return fmt.Errorf("client sysctl %s: %w", kv[0], err)
		}
	}
	return nil
}

// churnFaults makes two detours unreliable for joins (forwarded SYNs
// toward the server, i.e. after the relay's DNAT): detour3 drops half of
// them (the join's SYN is retransmitted after 1 s: slow joins), detour4
// answers half of them with a TCP reset (refused joins, errno 111).
// The rules live in the detours' namespaces and go with the lab.
func churnFaults(ctx context.Context, cl *caseLab, server netip.Addr) error {
	for node, verdict := range map[string]string{"detour3": "drop", "detour4": "reject with tcp reset"} {
		rules := fmt.Sprintf("table inet churnfault {\n chain churn {\n  type filter hook forward priority filter; policy accept;\n"+
			"  ip daddr %s tcp flags & (syn | ack) == syn numgen random mod 2 == 0 %s\n }\n}\n", server, verdict)
		path := filepath.Join(os.TempDir(), fmt.Sprintf("churnfault-%s-%d.nft", node, os.Getpid()))
		if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
			return err
		}
		out, err := cl.run(ctx, node, "nft", "-f", path)
		os.Remove(path)
		if err != nil {
			return fmt.Errorf("fault rules in %s: %v: %s", node, err, out)
		}
	}
	return nil
}

// churnWarm holds one connection open until the agent's status shows it
// with churnDetours NAT subflows up (20 s at most).
func churnWarm(ctx context.Context, cl *caseLab, bin, sock string, server netip.AddrPort) error {
	// The status socket appears once the agent has switched the node to
	// the userspace path manager: a connection made before keeps the
	// in-kernel one ("userspace PM not selected").
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(end) {
			return fmt.Errorf("no agent status socket within 15 s")
		}
	}
	var c net.Conn
	if err := cl.do("client", func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(true)
		c, err = d.DialContext(ctx, "tcp4", server.String())
		return err
	}); err != nil {
		return fmt.Errorf("warm-up connection: %w", err)
	}
	defer c.Close()
	best, why := 0, ""
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		out, err := cl.output(ctx, "client", bin, "status", "--json", "--socket", sock)
		if err != nil {
			why = err.Error()
			continue
		}
		var st struct {
			Connections []struct {
				Subflows []struct {
					Path string `json:"path"`
					Role string `json:"role"`
				} `json:"subflows"`
			} `json:"connections"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			why = err.Error()
			continue
		}
		for _, cs := range st.Connections {
			n := 0
			for _, s := range cs.Subflows {
				if strings.HasPrefix(s.Path, "nat:") && s.Role == "active" {
					n++
				}
			}
			best = max(best, n)
		}
		if best >= churnDetours {
			return nil
		}
	}
	return fmt.Errorf("the warm-up connection got %d of %d NAT detour subflows within 20 s %s", best, churnDetours, why)
}

// churnTally counts the driven connections.
type churnTally struct {
	started, ok int64
	mu          sync.Mutex
	failed      map[string]int64
}

func (t *churnTally) fail(why string) {
	t.mu.Lock()
	t.failed[why]++
	t.mu.Unlock()
}

func (t *churnTally) failures() string {
	if len(t.failed) == 0 {
		return "0 failed"
	}
	return "failed: " + countsText(t.failed)
}

// churnDrive opens rate connections/s for dur (the cases: churnRate for
// churnFor) on a fixed schedule (late starts are caught up); each sends churnSendSize bytes,
// reads them back, stays open 0-200 ms (by its number) and closes. With
// mixed, connection i does what churnKind(i) says.
func churnDrive(ctx context.Context, cl *caseLab, server netip.AddrPort, mixed bool, rate int, dur time.Duration) *churnTally {
	t := &churnTally{failed: map[string]int64{}}
	var ok, started atomic.Int64
	var wg sync.WaitGroup
	n := int(dur.Seconds() * float64(rate))
	start := time.Now()
	payload := make([]byte, churnSendSize)
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			break
		}
		kind := churnShort
		if mixed {
			kind = churnKind(i)
		}
		dst := server
		if kind == churnLinger {
			dst = netip.AddrPortFrom(server.Addr(), churnClosePort)
		}
		started.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c net.Conn
			err := cl.do("client", func() (err error) {
				d := net.Dialer{Timeout: 10 * time.Second}
				d.SetMultipathTCP(true)
				c, err = d.Dial("tcp4", dst.String())
				return err
			})
			if err != nil {
				t.fail("dial: " + errClass(err))
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(15 * time.Second))
			if _, err := c.Write(payload); err != nil {
				t.fail("write: " + errClass(err))
				return
			}
			if kind == churnAbort {
				ok.Add(1)
				return
			}
			if _, err := io.ReadFull(c, make([]byte, len(payload))); err != nil {
				t.fail("read: " + errClass(err))
				return
			}
			switch kind {
			case churnLinger:
				// The server has closed: wait for its FIN, then keep our
				// end open (half closed).
				if _, err := c.Read(make([]byte, 1)); err != io.EOF {
					t.fail("linger: no EOF from the server")
					return
				}
				time.Sleep(time.Second + time.Duration(i%5)*time.Second)
			case churnIdle:
				c.SetDeadline(time.Time{})
				time.Sleep(10*time.Second + time.Duration(i%11)*time.Second)
			default:
				time.Sleep(time.Duration(i%11) * churnMaxHold / 10)
			}
			ok.Add(1)
		}()
	}
	wg.Wait()
	t.started, t.ok = started.Load(), ok.Load()
	return t
}

// What a driven connection does after its 4 KiB.
const (
	churnShort  = iota // echo, open 0-200 ms, close
	churnLinger        // the server answers and closes; the client stays half closed 1-5 s
	churnAbort         // close right after writing (the agent's creates still in flight)
	churnIdle          // echo, then idle 10-20 s
)

// churnKind is subflow-churn-mixed's connection i: of 8, 3 linger, 1
// aborts, 2 short, 2 idle.
func churnKind(i int) int {
	switch i % 8 {
	case 0, 3, 6:
		return churnLinger
	case 1:
		return churnAbort
	case 2, 5:
		return churnShort
	default:
		return churnIdle
	}
}

// errClass names an error without its addresses (a table key).
func errClass(err error) string {
	var se interface{ Timeout() bool }
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.As(err, &se) && se.Timeout():
		return "timeout"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// churnLog is what the agent's log says about the churn.
type churnLog struct {
	creates     int
	perToken    map[string]int
	maxPerToken int
	// first and last create of each token (the log's timestamps)
	firstAt, lastAt map[string]time.Time
	busiestSecond   int
	refused         map[string]int64 // by errno (and "invalid token")
	established     int              // SUB_ESTABLISHED events
	learned         int
	learnedLines    []string
	lost            int // "events lost" warnings (the agent resynchronised)
}

var (
	logIntent  = regexp.MustCompile(`msg"?[=:]"?intent\b.*\bcreate token ([0-9a-f]{8})`)
	logFailed  = regexp.MustCompile(`command failed.*\bcreate token ([0-9a-f]{8})`)
	logErrno   = regexp.MustCompile(`: ([a-z ]+) \(errno (\d+)\)`)
	logTime    = regexp.MustCompile(`time"?[=:]"?((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[^ "]*)`)
	logLearned = regexp.MustCompile(`server subflow limit learned.*`)
)

// countAgentLog reads the agent's log from byte offset from on.
func countAgentLog(path string, from int64) (*churnLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return nil, err
	}
	return parseChurnLog(f)
}

func parseChurnLog(rd io.Reader) (*churnLog, error) {
	st := &churnLog{perToken: map[string]int{}, refused: map[string]int64{}, firstAt: map[string]time.Time{}, lastAt: map[string]time.Time{}}
	perSecond := map[string]int{}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case logIntent.MatchString(line):
			m := logIntent.FindStringSubmatch(line)
			st.creates++
			st.perToken[m[1]]++
			if t := logTime.FindStringSubmatch(line); t != nil {
				perSecond[t[2]]++
				if at, err := time.Parse(time.RFC3339Nano, t[1]); err == nil {
					if f, ok := st.firstAt[m[1]]; !ok || at.Before(f) {
						st.firstAt[m[1]] = at
					}
					if at.After(st.lastAt[m[1]]) {
						st.lastAt[m[1]] = at
					}
				}
			}
		case logFailed.MatchString(line):
			why := "other"
			if e := logErrno.FindStringSubmatch(line); e != nil {
				why = fmt.Sprintf("%s (%s)", e[1], e[2])
			}
			if strings.Contains(line, "invalid token") {
				why += " invalid token"
			}
			st.refused[why]++
		case strings.Contains(line, "SUB_ESTABLISHED"):
			st.established++
		case strings.Contains(line, "events lost"):
			st.lost++
		case logLearned.MatchString(line):
			st.learned++
			if len(st.learnedLines) < 3 {
				st.learnedLines = append(st.learnedLines, logLearned.FindString(line))
			}
		}
	}
	for _, n := range st.perToken {
		st.maxPerToken = max(st.maxPerToken, n)
	}
	for _, n := range perSecond {
		st.busiestSecond = max(st.busiestSecond, n)
	}
	return st, sc.Err()
}

// maxTokenSpan says over how long the token with the most creates made
// them (its first to its last create).
func (st *churnLog) maxTokenSpan() string {
	best, span := "", time.Duration(0)
	for tok, n := range st.perToken {
		if n == st.maxPerToken {
			if d := st.lastAt[tok].Sub(st.firstAt[tok]); best == "" || d > span {
				best, span = tok, d
			}
		}
	}
	if best == "" {
		return "no token"
	}
	return fmt.Sprintf("token %s over %.1f s", best, span.Seconds())
}

func (st *churnLog) tokensOver(n int) int {
	k := 0
	for _, c := range st.perToken {
		if c > n {
			k++
		}
	}
	return k
}

func (st *churnLog) refusedText() string {
	if len(st.refused) == 0 {
		return "none"
	}
	return countsText(st.refused)
}

func (st *churnLog) learnedText() string {
	if st.learned == 0 {
		return ""
	}
	return " (" + strings.Join(st.learnedLines, "; ") + ")"
}

// countsText is "a 3, b 1" (largest first).
func countsText(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// scrapeCounter reads one unlabelled series from a Prometheus endpoint in
// node: -1 when the endpoint does not have it (an older build).
func scrapeCounter(l *lab.Lab, node, addr, name string) (float64, error) {
	var body []byte
	err := l.Do(node, func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
			return err
		}
		body, err = io.ReadAll(c)
		return err
	})
	if err != nil {
		return -1, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return -1, nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// tail is the end of a log file, on one line (for an error that the
// suite prints after the case's directory is gone).
func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", " | ")
}
