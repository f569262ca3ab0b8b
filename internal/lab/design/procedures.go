package design

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// Procedure names of a design:
//
//   - tcp-path1: plain TCP over the default path (bench procedure tcp);
//   - tcp-pathK, K >= 2: plain TCP through the NAT relay of detourK-1
//     (bench procedure tcp-nat at that detour);
//   - mptcp: MPTCP with the agent adding one NAT detour subflow per detour
//     (bench procedure mptcp-nat), the agent's default policy;
//   - mptcp-POLICY: the same with `policy: POLICY` in the agent's
//     configuration (static or adaptive), for agents that have the key;
//   - converted: the same paths, but the server does not speak MPTCP: a
//     plain TCP program under "mpdetour run --convert" goes through the
//     converter on r2 and the agent adds one NAT detour subflow per detour
//     to the converter (bench procedure converted, docs/convert.md). It runs in
//     its own bench run with net.mptcp.enabled=0 in the server node.
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

// Proc is a parsed design procedure.
type Proc struct {
	Name   string
	Path   int    // 1-based path of a single-path procedure; 0 for MPTCP
	Policy string // MPTCP: agent policy, "" = the agent's default
	// Converted: through the converter to a server without MPTCP (the
	// agent's default policy).
	Converted bool
}

// MPTCP says whether the procedure is a multipath one.
func (p Proc) MPTCP() bool { return p.Path == 0 }

// Policies are the agent policies a design can ask for.
var Policies = []string{"static", "adaptive"}

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

func parseProc(f string, paths int) (Proc, error) {
	if rest, ok := strings.CutPrefix(f, tcpPathPrefix); ok {
		k, err := strconv.Atoi(rest)
		if err != nil || k < 1 || k > paths || rest != strconv.Itoa(k) {
			return Proc{}, fmt.Errorf("procedure %q: want tcp-path1..tcp-path%d", f, paths)
		}
		return Proc{Name: f, Path: k}, nil
	}
	if f == mptcpName {
		return Proc{Name: f}, nil
	}
	if f == ConvertedProcedure {
		return Proc{Name: f, Converted: true}, nil
	}
	if pol, ok := strings.CutPrefix(f, mptcpName+"-"); ok {
		for _, p := range Policies {
			if pol == p {
				return Proc{Name: f, Policy: pol}, nil
			}
		}
	}
	return Proc{}, fmt.Errorf("unknown procedure %q (want tcp-path1..tcp-path%d, mptcp, mptcp-static, mptcp-adaptive or converted)", f, paths)
}

// detourNode is the detours topology's relay node of path k >= 2.
func detourNode(k int) string { return "detour" + strconv.Itoa(k-1) }

// spec is the bench procedure running p.
func (p Proc) spec() scenario.ProcedureSpec {
	switch {
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
