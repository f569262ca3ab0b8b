package breaks

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// InPlaceCases are the cases that can attack a running deployment in
// place (mpdetour-lab soak --attacks), in the order they take turns.
func InPlaceCases() []string {
	return []string{SpoofedJunk, ForgedGossip, ConvertSocket, RotationQuota, RevokedConv, SubflowChurn}
}

// ParseInPlace parses a comma-separated list of in-place case names
// ("all": every one); duplicates are refused.
func ParseInPlace(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if s == "all" {
		return InPlaceCases(), nil
	}
	known := map[string]bool{}
	for _, c := range InPlaceCases() {
		known[c] = true
	}
	seen := map[string]bool{}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			return nil, fmt.Errorf("empty case name in %q", s)
		case !known[f]:
			return nil, fmt.Errorf("unknown case %q (known: %s, or all)", f, strings.Join(InPlaceCases(), ", "))
		case seen[f]:
			return nil, fmt.Errorf("case %q named twice", f)
		}
		seen[f] = true
		out = append(out, f)
	}
	return out, nil
}

// In-place settings: what the deployment's relays must be configured with
// (InPlace.RelayConfig) for the cases to attack them.
const (
	// InPlaceQuota is the relays' quota.per_member: rotation-quota's bound.
	// It applies to the deployment's own member too, which holds one NAT
	// mapping per relay and server port.
	InPlaceQuota = 4
	// inPlaceChurnRate and inPlaceChurnFor: subflow-churn's connections
	// in place (the issue's rate, for a tenth of the suite's minute).
	inPlaceChurnRate  = 200
	inPlaceChurnFor   = 10 * time.Second
	inPlaceStreamPort = 5300 // revoked-conversion's stream server
)

// InPlace attacks a running deployment: relays in two or more lab nodes
// and an agent in the client node, started by someone else (the soak)
// with the members and configuration sections InPlace gives them. Make
// one with NewInPlace, put RelayMembers, RelayConfig and AgentConfig into
// the daemons' configurations, fill in the fields the deployment knows,
// then Run cases, one at a time, while nothing else changes the relays
// (no restart, no link fault).
type InPlace struct {
	Lab    *lab.Lab
	Binary string // the deployment's mpdetour
	// Self and PeerCommand: this lab binary and its hidden command that
	// runs the other local user's side (convert-socket).
	Self, PeerCommand string
	// Relays are the relay nodes, the first two attacked (forged-gossip
	// needs two); RelayAddr and RelayKey are their addresses and keys.
	Relays    []string
	RelayAddr map[string]netip.AddrPort
	RelayKey  map[string]proto.Key
	// Server is a destination every relay allows; Echo the deployment's
	// echo server (on Server) whose connections the agent detours.
	Server netip.Addr
	Echo   netip.AddrPort
	// AgentLog and AgentMetrics: the agent's log file and its metrics
	// endpoint in the client node (subflow-churn); Subflows its detour
	// subflows per connection.
	AgentLog     string
	AgentMetrics string
	Subflows     int
	// Conns is how many connections the deployment itself has opened so
	// far (subflow-churn counts creates over its connections and these).
	Conns func() int64
	// Reload rewrites node's relay configuration with edit and makes the
	// relay reload it (SIGHUP) (revoked-conversion).
	Reload func(node string, edit func(string) string) error

	dir              string
	auth             *collective.Authority
	secret           string
	attacker, revoke proto.Key
	members          map[string]string // node -> gossip member name
}

// NewInPlace makes the cases' authority, gossip secret and member keys;
// dir (which must be traversable by PeerUID for convert-socket) holds
// their files.
func NewInPlace(dir string) (*InPlace, error) {
	p := &InPlace{dir: dir, members: map[string]string{}}
	var err error
	if p.auth, p.secret, err = authority(Options{Dir: dir}); err != nil {
		return nil, err
	}
	if p.attacker, err = proto.GenerateKey(); err != nil {
		return nil, err
	}
	if p.revoke, err = proto.GenerateKey(); err != nil {
		return nil, err
	}
	return p, nil
}

// RelayMembers are the lines the relays' members list needs (YAML list
// items, indented two spaces): the attacker's member (spoofed-junk's new
// session) and the one revoked-conversion removes and puts back.
func (p *InPlace) RelayMembers() string {
	return fmt.Sprintf("  - {name: attacker, public_key: %s}\n%s", p.attacker.Public(), p.revokedLine())
}

func (p *InPlace) revokedLine() string {
	return fmt.Sprintf("  - {name: revoked, public_key: %s}\n", p.revoke.Public())
}

// RelayConfig is the configuration text the relay in node (key pub,
// listening on addr) needs besides its own: the collective (authority,
// its certificate, gossip with the secret, joining the relay at join
// unless that is addr's own), the quota, and the converter.
func (p *InPlace) RelayConfig(node string, pub proto.Key, addr, join netip.Addr) (string, error) {
	now := time.Now()
	c, err := p.auth.Issue(pub, node, collective.RoleRelay, now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		return "", err
	}
	cert := filepath.Join(p.dir, node+".cert")
	if err := os.WriteFile(cert, []byte(c.String()+"\n"), 0o600); err != nil {
		return "", err
	}
	p.members[node] = roster.NodeName(pub)
	joinLine := ""
	if join != addr {
		joinLine = fmt.Sprintf("    join: [%s]\n", netip.AddrPortFrom(join, gossipPort))
	}
	return fmt.Sprintf("quota: {per_member: %d}\ncollective:\n  authority: %s\n  certificate_file: %s\n  gossip:\n    bind: %s\n    secret_file: %s\n%sconvert:\n  enabled: true\n  listen: %s\n",
		InPlaceQuota, p.auth.Public(), cert, netip.AddrPortFrom(addr, gossipPort), p.secret, joinLine, netip.AddrPortFrom(addr, 45674)), nil
}

// ConvertSocket is the agent's conversion socket (in dir).
func (p *InPlace) ConvertSocket() string { return filepath.Join(p.dir, "convert.sock") }

// AgentConfig is the agent's configuration text for the cases: its
// conversion socket.
func (p *InPlace) AgentConfig() string {
	return fmt.Sprintf("convert:\n  enabled: true\n  socket: %s\n", p.ConvertSocket())
}

// Run attacks the deployment with case name and judges it as the suite
// does (the figure in Value, the target in Target). Cases take the
// second relay where they need one: in the soak the first one's link is
// the one faulted.
func (p *InPlace) Run(ctx context.Context, name string) Result {
	t0 := time.Now()
	r := p.run(ctx, name)
	r.Case, r.Binary, r.Seconds = name, p.Binary, time.Since(t0).Seconds()
	return r
}

func (p *InPlace) run(ctx context.Context, name string) Result {
	l := &caseLab{Lab: p.Lab} // not closed: the lab is the deployment's
	if len(p.Relays) < 2 {
		return Result{Error: "in place: two relays needed"}
	}
	node := p.Relays[1]
	relay := relayconn.Relay{Name: node, Addr: p.RelayAddr[node], PublicKey: p.RelayKey[node]}
	var (
		r      Result
		v      float64
		pass   bool
		detail string
		err    error
	)
	switch name {
	case SpoofedJunk:
		r = Result{Break: 1, Metric: "new session's handshake+grant after the junk, s", Target: "<= 1"}
		v, pass, detail, err = junkAttack(ctx, l, node, relay, p.attacker, p.Echo, "the attacker member on a new session from the client node (an address the relay knows: the agent's)")
	case ForgedGossip:
		r = Result{Break: 2, Metric: "relays removing the live relay", Target: "0"}
		nodes := p.Relays[:2]
		full, counts := false, map[string]int{}
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end) && !full; time.Sleep(200 * time.Millisecond) {
			full, counts = rostersFull(ctx, l, p.Binary, nodes)
		}
		if !full {
			err = fmt.Errorf("the relays did not list each other within 20 s before the forgeries (roster sizes %v)", counts)
			break
		}
		v, pass, detail, err = gossipAttack(ctx, l, p.Binary, nodes, nodes[1], nodes[:1], p.members, "with gossip.secret_file")
	case ConvertSocket:
		r = Result{Break: 3, Metric: "cross-user effects", Target: "0"}
		var before rootView
		if before, err = convertReady(p.ConvertSocket(), 10*time.Second); err != nil {
			break
		}
		v, pass, detail, err = convertAttack(ctx, Options{Self: p.Self, PeerCommand: p.PeerCommand}, p.ConvertSocket(), netip.AddrPortFrom(p.Server, convertDstPort).String(), node, before)
	case RotationQuota:
		r = Result{Break: 4, Metric: "mappings one member holds over its keys", Target: fmt.Sprintf("<= %d (quota)", InPlaceQuota)}
		v, pass, detail, err = rotationAttack(ctx, l, p.auth, relay, p.Server, InPlaceQuota)
	case RevokedConv:
		r = Result{Break: 4, Metric: "bytes moved 2-4 s after the revocation", Target: "0"}
		line := p.revokedLine()
		revoke := func() error {
			return p.Reload(node, func(s string) string { return strings.Replace(s, line, "", 1) })
		}
		v, pass, detail, err = revokeAttack(ctx, l, netip.AddrPortFrom(p.Server, inPlaceStreamPort), relay, p.revoke, revoke)
		// The member comes back for the next run.
		if rerr := p.Reload(node, func(s string) string {
			if strings.Contains(s, line) {
				return s
			}
			return strings.Replace(s, "members:\n", "members:\n"+line, 1)
		}); rerr != nil && err == nil {
			err = fmt.Errorf("putting the member back: %w", rerr)
		}
	case SubflowChurn:
		r = Result{Break: 7, Metric: "SUBFLOW_CREATE / (connections x subflows)", Target: "<= 2, 0 limits learned"}
		v, pass, detail, err = p.churn(ctx, l)
	default:
		return Result{Error: fmt.Sprintf("unknown in-place case %q (known: %s)", name, strings.Join(InPlaceCases(), ", "))}
	}
	return r.judge(v, pass, detail, err)
}

// churn drives inPlaceChurnRate connections/s for inPlaceChurnFor at the
// deployment's echo server and counts the agent's SUBFLOW_CREATE calls
// (its metric) over them and the deployment's own connections of the
// window, and the join limits it learned (its log).
func (p *InPlace) churn(ctx context.Context, l *caseLab) (float64, bool, string, error) {
	m0, err := scrapeCounter(p.Lab, "client", p.AgentMetrics, "mpdetour_agent_subflow_creates_total")
	if err != nil || m0 < 0 {
		return 0, false, "", fmt.Errorf("the agent's subflow_creates_total: %v (value %v)", err, m0)
	}
	// The soak's default-path faults can trip the kernel's MPTCP blackhole
	// detection: new connections are then plain TCP and get no detours,
	// and a churn would count nothing. Re-enable MPTCP first (writing the
	// sysctl clears the disable, as the agent's doctor says) and say so.
	reenabled, err := p.mptcpEnabled(ctx, l)
	if err != nil {
		return 0, false, "", err
	}
	fb0, _ := scrapeCounter(p.Lab, "client", p.AgentMetrics, "mpdetour_agent_mptcp_blackhole_fallbacks_total")
	logFrom := fileSize(p.AgentLog)
	own0 := p.Conns()
	load0 := loadAvg()
	t0 := time.Now()
	tally := churnDrive(ctx, l, p.Echo, false, inPlaceChurnRate, inPlaceChurnFor)
	driven := time.Since(t0)
	time.Sleep(churnSettle)
	m1, err := scrapeCounter(p.Lab, "client", p.AgentMetrics, "mpdetour_agent_subflow_creates_total")
	if err != nil || m1 < 0 {
		return 0, false, "", fmt.Errorf("the agent's subflow_creates_total: %v", err)
	}
	own := p.Conns() - own0
	st, err := countAgentLog(p.AgentLog, logFrom)
	if err != nil {
		return 0, false, "", err
	}
	possible := (tally.ok + own) * int64(p.Subflows)
	if tally.ok == 0 {
		return 0, false, "", fmt.Errorf("no connection of %d succeeded (%s)", tally.started, tally.failures())
	}
	creates := m1 - m0
	fb1, _ := scrapeCounter(p.Lab, "client", p.AgentMetrics, "mpdetour_agent_mptcp_blackhole_fallbacks_total")
	v := float64(int(creates/float64(possible)*1000+0.5)) / 1000
	detail := fmt.Sprintf("%d connections in %.1f s (%d ok, %s) beside the soak's own %d, %d detour subflows each: %.0f creates (metric subflow_creates_total, %.0f s window with %s settling) for %d possible subflows; %d limits learned%s; load %s -> %s",
		tally.started, driven.Seconds(), tally.ok, tally.failures(), own, p.Subflows, creates, driven.Seconds()+churnSettle.Seconds(), churnSettle, possible, st.learned, st.learnedText(), load0, loadAvg())
	if reenabled {
		detail += "; MPTCP had been disabled by the kernel's blackhole detection before the churn: re-enabled (net.mptcp.blackhole_timeout rewritten)"
	}
	switch {
	case fb1 > fb0:
		return 0, false, "", fmt.Errorf("the kernel's MPTCP blackhole detection made %.0f connections plain TCP during the churn: nothing to count (%s)", fb1-fb0, detail)
	case creates == 0:
		return 0, false, "", fmt.Errorf("the agent created no subflow: nothing churned (%s)", detail)
	}
	return v, v <= 2 && st.learned == 0 && tally.ok == tally.started, detail, nil
}

// mptcpEnabled makes sure the client's kernel makes new connections
// MPTCP: while the agent reports the blackhole disable, it rewrites
// net.mptcp.blackhole_timeout (its value) in the client node, which ends
// the disable (connections whose MP_CAPABLE SYNs were dropped by a fault
// just before may trip it again), every 4 s for 30 s at most, until the
// agent reports it ended (it looks every 5 s and needs an MPTCP SYN sent:
// the soak opens 5 connections/s). It reports whether it had to.
func (p *InPlace) mptcpEnabled(ctx context.Context, l *caseLab) (bool, error) {
	const metric = "mpdetour_agent_mptcp_blackhole_disabled"
	d, err := scrapeCounter(p.Lab, "client", p.AgentMetrics, metric)
	if err != nil || d <= 0 {
		return false, err
	}
	const sysctl = "/proc/sys/net/mptcp/blackhole_timeout"
	rewrite := func() error {
		return l.do("client", func() error {
			b, err := os.ReadFile(sysctl)
			if err != nil {
				return err
			}
			return os.WriteFile(sysctl, b, 0o644)
		})
	}
	for start := time.Now(); time.Since(start) < 30*time.Second; {
		if err := rewrite(); err != nil {
			return true, fmt.Errorf("re-enabling MPTCP in the client: %w", err)
		}
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
			if d, err := scrapeCounter(p.Lab, "client", p.AgentMetrics, metric); err == nil && d == 0 {
				return true, nil
			}
		}
	}
	return true, fmt.Errorf("MPTCP disabled by the kernel's blackhole detection; the agent still reported it after %s was rewritten every 4 s for 30 s", sysctl)
}
