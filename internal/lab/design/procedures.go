package design

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// Procedure names of a design:
//
//   - tcp-path1: plain TCP over the default path (bench procedure tcp);
//   - tcp-pathK, K >= 2: plain TCP through the NAT relay of detourK-1
//     (bench procedure tcp-nat at that detour);
//   - mptcp: MPTCP with the agent adding one NAT detour subflow per detour
//     (bench procedure mptcp-nat), the agent's default policy;
//   - mptcp-POLICY: the same with `policy: POLICY` in the agent's
//     configuration: any policy the agent accepts (static, adaptive,
//     backup-first, guard, and every policy added to the agent later,
//     without a change here; mptcp-guard is issue 26's harm rule);
//   - mptcp-1sf: MPTCP over the point's best path alone, no agent
//     (mptcp-1sf-pathK: over path K);
//   - converted: the same paths, but the server does not speak MPTCP: a
//     plain TCP program under "mpdetour run --convert" goes through the
//     converter on r2 and the agent adds one NAT detour subflow per detour
//     to the converter (bench procedure converted, docs/convert.md). It runs in
//     its own bench run with net.mptcp.enabled=0 in the server node;
//   - mptcp+MECH, mptcp-POLICY+MECH[+MECH...]: the same MPTCP procedure with
//     agent mechanisms switched on in the agent's configuration (Mechanisms:
//     buffers = buffer_sizing (the default), nobuffers = without it,
//     staleN = stale_loss_cnt N, ALGO = the congestion control of detour
//     subflows, e.g. +bbr; starveN / starveoff = guard.starve N/100 / 1,
//     shareN = guard.share N/100, rttoff = guard.rtt 0, outageoff = guard.outage 0, policy guard only; lowat = subflow_lowat 128 KiB (the agent's
//     default, written out), lowatN = N KiB, lowatrtt = subflow_lowat
//     128 KiB scaled to the subflows' RTTs (subflow_lowat_scale: rtt),
//     nolowat = subflow_lowat 0, the agent without the limit (its default
//     before the limit was turned on); pace = subflow_pacing: true, TCP's own
//     pacing of every subflow; probeN = probe_interval N ms),
//     so that a
//     mechanism is measured beside the procedure without it in one paired
//     run (issue 26).
const (
	tcpPathPrefix = "tcp-path"
	mptcpName     = MPTCPProcedure
)

// MPTCPProcedure names the MPTCP procedure; "mptcp-POLICY" names a policy.
const MPTCPProcedure = "mptcp"

// ConvertedProcedure names the procedure through the converter, to a
// server that does not speak MPTCP.
const ConvertedProcedure = "converted"

// ConverterNode runs the converter: r2, the router in front of the
// server's network, where the default path and every detour meet after
// their emulated core links (docs/design.md).
const ConverterNode = "r2"

// OneSubflowProcedure names MPTCP over one path alone, without an agent:
// "mptcp-1sf" over the path the model expects to be the best
// (Point.BestPath), "mptcp-1sf-pathK" over path K. Beside the single paths
// it separates the kernel's own MPTCP cost from path-management harm.
const OneSubflowProcedure = "mptcp-1sf"

// Proc is a parsed design procedure.
type Proc struct {
	Name   string
	Path   int    // 1-based path of a single-path procedure; 0 for MPTCP
	Policy string // MPTCP: agent policy, "" = the agent's default
	// Converted: through the converter to a server without MPTCP (the
	// agent's default policy).
	Converted bool
	// OneSubflow: MPTCP over one path, no agent; OnePath is that path
	// (0 = the point's BestPath).
	OneSubflow bool
	OnePath    int
	// Mechanisms: agent mechanisms the procedure switches on (mptcp and
	// mptcp-POLICY only), in the order named.
	Mechanisms []Mechanism
}

// Mechanism is an agent mechanism a procedure name switches on after a
// "+": Name as written, Config the agent configuration lines it adds, or
// Guard a line of the guard: block (starveN, shareN: the block is written
// once for all of them, so that they combine).
type Mechanism struct {
	Name   string
	Config string
	Guard  string
}

// MechanismNames says which mechanisms a procedure may name (for errors
// and --help).
const MechanismNames = "buffers (buffer_sizing: true, the agent's default), nobuffers (buffer_sizing: false), staleN (stale_loss_cnt: N, 1-255), " +
	"ALGO (subflow_congestion: {detour: ALGO}: a congestion control the kernel offers, e.g. bbr), " +
	"starveN (policy guard: guard.starve N/100, N 1-99) or starveoff (guard.starve: 1, the shed rule without the starvation condition), " +
	"shareN (policy guard: guard.share N/100, N 1-99: a slower subflow delivering below this share of the bytes is shed), " +
	"rttoff (policy guard: guard.rtt: 0, the shed rule without its RTT condition), " +
	"outageoff (policy guard: guard.outage: 0, the shed rule judging subflows in an outage too, the rule before the condition), " +
	"lowat (subflow_lowat: 131072: every subflow keeps at most 128 KiB unsent, the agent's default written out) or lowatN (N KiB, 16-65536), " +
	"lowatrtt (subflow_lowat: 131072 with subflow_lowat_scale: rtt: the limit scaled to the subflows' RTTs, 128 KiB its floor; it also sets probe_interval 100ms where static's default is 1s), " +
	"nolowat (subflow_lowat: 0: the agent without the limit, its default before the limit was turned on), " +
	"pace (subflow_pacing: true: every subflow paces itself at TCP's own rate), " +
	"probeN (probe_interval: N ms, 10-10000: the agent's measurements every N ms; static's default is 1s)"

// parseMechanism reads one mechanism of a procedure name.
func parseMechanism(f, m string) (Mechanism, error) {
	switch {
	case m == "buffers":
		return Mechanism{Name: m, Config: "buffer_sizing: true\n"}, nil
	case m == "nobuffers":
		// buffer_sizing is on by default: this measures the agent without it.
		return Mechanism{Name: m, Config: "buffer_sizing: false\n"}, nil
	case strings.HasPrefix(m, "stale"):
		n, ok := numbered(m, "stale", 1, 255)
		if !ok {
			return Mechanism{}, fmt.Errorf("procedure %q: mechanism %q: want staleN with N 1-255 (net.mptcp.stale_loss_cnt; the kernel's default is 4)", f, m)
		}
		return Mechanism{Name: m, Config: fmt.Sprintf("stale_loss_cnt: %d\n", n)}, nil
	case subflowcc.Check(m) == nil:
		// Detour subflows run ALGO; the default path keeps the trial's
		// congestion control (the design's, cubic by default).
		return Mechanism{Name: m, Config: fmt.Sprintf("subflow_congestion:\n  detour: %s\n", m)}, nil
	case m == "starveoff":
		// guard's shed rule without its starvation condition (the rule
		// measured in docs/results/design/harm and guard-fresh).
		return Mechanism{Name: m, Guard: "  starve: 1\n"}, nil
	case strings.HasPrefix(m, "starve"):
		n, ok := numbered(m, "starve", 1, 99)
		if !ok {
			return Mechanism{}, fmt.Errorf("procedure %q: mechanism %q: want starveN with N 1-99 (guard.starve N/100) or starveoff (guard.starve: 1)", f, m)
		}
		return Mechanism{Name: m, Guard: fmt.Sprintf("  starve: %g\n", float64(n)/100)}, nil
	case m == "rttoff":
		// guard's shed rule without its RTT condition (guard.rtt: 0): a
		// tiny path slow from loss, not length, is judged too
		// (docs/results/design/tinypath-fresh).
		return Mechanism{Name: m, Guard: "  rtt: 0\n"}, nil
	case m == "outageoff":
		// guard's shed rule judging a subflow in an outage too (the rule
		// before guard.outage; docs/results/current-build/guard-failover).
		return Mechanism{Name: m, Guard: "  outage: 0\n"}, nil
	case strings.HasPrefix(m, "share"):
		n, ok := numbered(m, "share", 1, 99)
		if !ok {
			return Mechanism{}, fmt.Errorf("procedure %q: mechanism %q: want shareN with N 1-99 (guard.share N/100)", f, m)
		}
		return Mechanism{Name: m, Guard: fmt.Sprintf("  share: %g\n", float64(n)/100)}, nil
	case m == "nolowat":
		// subflow_lowat is on by default: this measures the agent
		// without it (what mptcp-static measured before the default
		// changed).
		return Mechanism{Name: m, Config: "subflow_lowat: 0\n"}, nil
	case m == "lowat":
		// The agent's default, written out (as +buffers).
		// 128 KiB: what the bench sets on its own socket
		// (TCP_NOTSENT_LOWAT) and what OpenMPTCProuter uses.
		return Mechanism{Name: m, Config: fmt.Sprintf("subflow_lowat: %d\n", DefaultLowat)}, nil
	case m == "lowatrtt":
		// The limit scaled to the subflows' RTTs, 128 KiB its floor
		// (docs/results/design/lowat-p149, docs/agent.md).
		return Mechanism{Name: m, Config: fmt.Sprintf("subflow_lowat: %d\nsubflow_lowat_scale: rtt\n", DefaultLowat)}, nil
	case strings.HasPrefix(m, "lowat"):
		n, ok := numbered(m, "lowat", 16, 65536)
		if !ok {
			return Mechanism{}, fmt.Errorf("procedure %q: mechanism %q: want lowat (128 KiB) or lowatN with N 16-65536 KiB (subflow_lowat)", f, m)
		}
		return Mechanism{Name: m, Config: fmt.Sprintf("subflow_lowat: %d\n", n<<10)}, nil
	case strings.HasPrefix(m, "probe"):
		// The agent's probe interval alone: lowatrtt also sets 100 ms
		// where static's default is 1 s, so +lowat+probe100 beside
		// +lowatrtt separates the scaling from the faster probing.
		n, ok := numbered(m, "probe", 10, 10000)
		if !ok {
			return Mechanism{}, fmt.Errorf("procedure %q: mechanism %q: want probeN with N 10-10000 (probe_interval N ms)", f, m)
		}
		return Mechanism{Name: m, Config: fmt.Sprintf("probe_interval: %dms\n", n)}, nil
	case m == "pace":
		// TCP's internal pacing on every subflow of the managed
		// connections, at its own rate (docs/agent.md, "Subflow pacing").
		return Mechanism{Name: m, Config: "subflow_pacing: true\n"}, nil
	case m == "clamp" || m == "cwnd-clamp" || m == "cwnd_clamp":
		// policy.Clamps clamps tunnel detour subflows only; a design's
		// detours are NAT detours, where the clamp would be a no-op.
		return Mechanism{}, fmt.Errorf("procedure %q: mechanism %q: the cwnd clamp acts on tunnel detour subflows only, and a design's detours are NAT detours (valid mechanisms: %s)", f, m, MechanismNames)
	}
	return Mechanism{}, fmt.Errorf("procedure %q: unknown mechanism %q (valid mechanisms: %s)", f, m, MechanismNames)
}

// DefaultLowat is the subflow_lowat of mechanism lowat (bytes), the
// agent's default (agentd.DefaultSubflowLowat).
const DefaultLowat = agentd.DefaultSubflowLowat

// numbered reads the N of a mechanism named prefix+N, N in lo..hi and
// written without leading zeros.
func numbered(m, prefix string, lo, hi int) (int, bool) {
	rest := m[len(prefix):]
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= lo && n <= hi && rest == strconv.Itoa(n)
}

// agentConfig is the agent configuration of an MPTCP procedure: its
// policy, then its mechanisms ("" = the agent's defaults).
func (p Proc) agentConfig() (string, error) {
	cfg, err := policyConfig(p.Policy)
	if err != nil {
		return "", err
	}
	if len(p.Mechanisms) == 0 {
		return cfg, nil
	}
	guard := ""
	for _, m := range p.Mechanisms {
		cfg += m.Config
		guard += m.Guard
	}
	if guard != "" {
		cfg += "guard:\n" + guard
	}
	// This build's agent must accept them, before any lab is built.
	if _, err := agentd.ParseFragment(cfg); err != nil {
		return "", fmt.Errorf("procedure %s: this agent does not accept its mechanisms: %v", p.Name, err)
	}
	return cfg, nil
}

// EqualArms lists the pairs of multipath procedures among procs that
// give the agent the same configuration as this build parses it (the
// same policy and mechanisms once the agent's defaults are applied), e.g.
// mptcp-static and mptcp-static+lowat since the limit is on by default:
// a paired comparison of such a pair compares two equal arms (ratios
// near 1). The arm without the limit is +nolowat.
func EqualArms(procs []Proc) []string {
	type arm struct {
		name string
		cfg  agentd.Config
	}
	var arms []arm
	var out []string
	for _, p := range procs {
		if !p.Multipath() || p.Converted {
			continue
		}
		text, err := p.agentConfig()
		if err != nil {
			continue
		}
		c, err := agentd.ParseFragment(text)
		if err != nil {
			continue
		}
		// Whether the file wrote the value out does not change what
		// the agent does.
		c.SubflowLowatDefault = false
		for _, a := range arms {
			if reflect.DeepEqual(a.cfg, c) {
				out = append(out, fmt.Sprintf("%s and %s give the agent the same configuration (e.g. subflow_lowat %d is the default: +nolowat runs without it)", a.name, p.Name, agentd.DefaultSubflowLowat))
				break
			}
		}
		arms = append(arms, arm{p.Name, c})
	}
	return out
}

// MPTCP says whether the procedure is an MPTCP one (mptcp-1sf included).
func (p Proc) MPTCP() bool { return p.Path == 0 }

// Multipath says whether the procedure pools paths (an agent adds detour
// subflows): the procedures Ben and the harmed rule judge.
func (p Proc) Multipath() bool { return p.Path == 0 && !p.OneSubflow }

// ParseProcedures reads a comma-separated procedure list for a space of
// the given number of paths. Empty = every single path and mptcp.
func ParseProcedures(s string, paths int) ([]Proc, error) {
	if strings.TrimSpace(s) == "" {
		var ps []Proc
		for i := 1; i <= paths; i++ {
			ps = append(ps, Proc{Name: tcpPathPrefix + strconv.Itoa(i), Path: i})
		}
		return append(ps, Proc{Name: mptcpName}), nil
	}
	var ps []Proc
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		p, err := parseProc(f, paths)
		if err != nil {
			return nil, err
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("procedure %q listed twice", f)
		}
		seen[p.Name] = true
		ps = append(ps, p)
	}
	return ps, nil
}

// policyName is what a policy may be called: lower-case letters, digits and
// inner dashes (the agent's `policy:` value).
func policyName(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' || len(s) > 40 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func parseProc(f string, paths int) (Proc, error) {
	if base, mechs, ok := strings.Cut(f, "+"); ok {
		p, err := parseProc(base, paths)
		if err != nil {
			return Proc{}, err
		}
		if !p.Multipath() || p.Converted {
			return Proc{}, fmt.Errorf("procedure %q: mechanisms go after mptcp or mptcp-POLICY (the procedures with an agent), not after %q", f, base)
		}
		seen := map[string]bool{}
		for _, m := range strings.Split(mechs, "+") {
			mech, err := parseMechanism(f, m)
			if err != nil {
				return Proc{}, err
			}
			key := mech.Name
			switch {
			case strings.HasPrefix(key, "stale"):
				key = "stale"
			case strings.HasPrefix(key, "probe"):
				key = "probe"
			case strings.HasPrefix(key, "lowat"):
				key = "lowat"
			case strings.HasPrefix(key, "starve"), strings.HasPrefix(key, "share"), key == "rttoff", key == "outageoff":
				key = strings.TrimRightFunc(strings.TrimSuffix(key, "off"), unicode.IsDigit)
				if p.Policy != policy.Guard.String() {
					return Proc{}, fmt.Errorf("procedure %q: mechanism %q tunes the guard policy's shed rule (guard.%s): mptcp-guard only", f, m, key)
				}
			case strings.HasPrefix(mech.Config, "subflow_congestion:"):
				key = "congestion control"
			}
			switch key {
			case "nobuffers":
				key = "buffers" // one buffer_sizing line
			case "nolowat":
				key = "lowat" // one subflow_lowat line
			}
			if seen[key] {
				return Proc{}, fmt.Errorf("procedure %q: mechanism %q named twice", f, key)
			}
			seen[key] = true
			p.Mechanisms = append(p.Mechanisms, mech)
		}
		p.Name = f
		if _, err := p.agentConfig(); err != nil {
			return Proc{}, err
		}
		return p, nil
	}
	if rest, ok := strings.CutPrefix(f, tcpPathPrefix); ok {
		k, err := strconv.Atoi(rest)
		if err != nil || k < 1 || k > paths || rest != strconv.Itoa(k) {
			return Proc{}, fmt.Errorf("procedure %q: want tcp-path1..tcp-path%d", f, paths)
		}
		return Proc{Name: f, Path: k}, nil
	}
	switch f {
	case mptcpName:
		return Proc{Name: f}, nil
	case ConvertedProcedure:
		return Proc{Name: f, Converted: true}, nil
	case OneSubflowProcedure:
		return Proc{Name: f, OneSubflow: true}, nil
	}
	if rest, ok := strings.CutPrefix(f, OneSubflowProcedure+"-path"); ok {
		k, err := strconv.Atoi(rest)
		if err != nil || k < 1 || k > paths || rest != strconv.Itoa(k) {
			return Proc{}, fmt.Errorf("procedure %q: want %s-path1..%s-path%d", f, OneSubflowProcedure, OneSubflowProcedure, paths)
		}
		return Proc{Name: f, OneSubflow: true, OnePath: k}, nil
	}
	if pol, ok := strings.CutPrefix(f, mptcpName+"-"); ok && policyName(pol) {
		// Any policy this build's agent accepts: a new policy is a new
		// procedure without a change here.
		if err := AgentHasPolicy(pol); err != nil {
			return Proc{}, err
		}
		return Proc{Name: f, Policy: pol}, nil
	}
	return Proc{}, fmt.Errorf("unknown procedure %q (want tcp-path1..tcp-path%d, mptcp, mptcp-POLICY for a policy of the agent (static, adaptive, ...), %s, %s-pathK or converted; MPTCP procedures may add +MECHANISM: %s)", f, paths, OneSubflowProcedure, OneSubflowProcedure, MechanismNames)
}

// detourNode is the detours topology's relay node of path k >= 2.
func detourNode(k int) string { return "detour" + strconv.Itoa(k-1) }

// spec is the bench procedure running p (mptcp-1sf: over the default
// path; cell gives the path of a point).
func (p Proc) spec() scenario.ProcedureSpec {
	switch {
	case p.OneSubflow && p.OnePath > 1:
		return scenario.ProcedureSpec{Procedure: scenario.MPTCP1NAT, Detour: detourNode(p.OnePath)}
	case p.OneSubflow:
		return scenario.ProcedureSpec{Procedure: scenario.MPTCP1}
	case p.Path == 1:
		return scenario.ProcedureSpec{Procedure: scenario.TCP}
	case p.Path > 1:
		return scenario.ProcedureSpec{Procedure: scenario.TCPNAT, Detour: detourNode(p.Path)}
	case p.Converted:
		return scenario.ProcedureSpec{Procedure: scenario.Converted, Detour: "all"}
	}
	return scenario.ProcedureSpec{Procedure: scenario.MPTCPNAT, Detour: "all"}
}

// cellID is the bench cell ID of p's spec.
func (p Proc) cellID() string {
	s := p.spec()
	if p.Path > 1 {
		return s.Procedure + "@" + s.Detour
	}
	return s.Procedure
}
