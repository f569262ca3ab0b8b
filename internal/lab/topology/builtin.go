package topology

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"
)

// builtin generates a topology from named parameters.
type builtin struct {
	name     string
	defaults map[string]string
	// check validates one parameter value.
	check func(key, value string) error
	// checkAll, if set, validates the parameters together (after check).
	checkAll func(p map[string]string) error
	gen      func(p map[string]string) *Topology
}

var builtins = map[string]*builtin{
	"brennan2017": {
		name:     "brennan2017",
		defaults: map[string]string{"profile": "core-limited", "variant": "none"},
		check: func(key, value string) error {
			switch key {
			case "profile":
				if value != "symmetric" && value != "core-limited" {
					return fmt.Errorf("profile must be symmetric or core-limited, not %q", value)
				}
			case "variant":
				if value != "none" && value != "lossy" && value != "delayed" {
					return fmt.Errorf("variant must be none, lossy (L2 1%% loss) or delayed (L2 100ms), not %q", value)
				}
			}
			return nil
		},
		gen: genBrennan,
	},
	"detours": {
		name:     "detours",
		defaults: map[string]string{"detours": "2", "shared": "none"},
		check: func(key, value string) error {
			switch key {
			case "detours":
				k, err := strconv.Atoi(value)
				if err != nil || k < 1 || k > MaxDetours {
					return fmt.Errorf("detours must be a number from 1 to %d, not %q", MaxDetours, value)
				}
			case "shared":
				_, err := sharedDetours(value)
				return err
			}
			return nil
		},
		checkAll: func(p map[string]string) error {
			k, _ := strconv.Atoi(p["detours"])
			shared, _ := sharedDetours(p["shared"])
			for i := range shared {
				if i > k {
					return fmt.Errorf("shared names detour%d but the topology has %d detours", i, k)
				}
			}
			return nil
		},
		gen: genDetours,
	},
	"loadbalancer": {
		name:     "loadbalancer",
		defaults: map[string]string{},
		check:    func(key, value string) error { return fmt.Errorf("loadbalancer has no parameters") },
		gen:      genLoadBalancer,
	},
	"collective": {
		name:     "collective",
		defaults: map[string]string{"relays": "20", "clients": "5"},
		check:    checkCollective,
		gen:      genCollective,
	},
	"rack": {
		name:     "rack",
		defaults: map[string]string{"degree": "4"},
		check: func(key, value string) error {
			switch key {
			case "degree":
				d, err := strconv.Atoi(value)
				if err != nil || d < 1 || d > MaxRackDegree {
					return fmt.Errorf("degree must be a number from 1 to %d, not %q", MaxRackDegree, value)
				}
			default:
				return fmt.Errorf("rack has one parameter, degree, not %q", key)
			}
			return nil
		},
		gen: genRack,
	},
	"line": {
		name:     "line",
		defaults: map[string]string{},
		check:    func(key, value string) error { return fmt.Errorf("line has no parameters") },
		gen:      genLine,
	},
}

// MaxDetours bounds the detours topology's K.
const MaxDetours = 8

// Builtins lists the built-in topology names.
func Builtins() []string {
	var s []string
	for k := range builtins {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Builtin returns a built-in topology with its default parameters.
func Builtin(name string) (*Topology, error) {
	b := builtins[name]
	if b == nil {
		return nil, fmt.Errorf("unknown topology %q (built-ins: %s; or give a file path)", name, strings.Join(Builtins(), ", "))
	}
	params := map[string]string{}
	for k, v := range b.defaults {
		params[k] = v
	}
	return b.instantiate(params), nil
}

func (b *builtin) instantiate(params map[string]string) *Topology {
	t := b.gen(params)
	t.Name = b.name
	t.Source = "builtin:" + b.name
	t.builtin = b
	t.params = params
	return t
}

// Restored rebuilds a topology recorded in a lab's state file (its nodes,
// links and the built-in parameters it was made with).
func Restored(name, source string, nodes []*Node, links []*Link, params map[string]string) *Topology {
	return &Topology{Name: name, Source: source, Nodes: nodes, Links: links, params: params}
}

// Params returns a built-in's parameters (nil for files).
func (t *Topology) Params() map[string]string {
	if t.params == nil {
		return nil
	}
	m := map[string]string{}
	for k, v := range t.params {
		m[k] = v
	}
	return m
}

// topoBuilder keeps the built-in generators short.
type topoBuilder struct{ t *Topology }

func (b *topoBuilder) node(name string, forward bool, routes ...string) {
	n := &Node{Name: name, Forward: forward, pos: pos{field: "node " + name}}
	for i := 0; i+1 < len(routes); i += 2 {
		dst, err := parseDst(routes[i])
		if err != nil {
			panic(err) // built-ins are constants
		}
		n.Routes = append(n.Routes, Route{Dst: dst, Via: netip.MustParseAddr(routes[i+1]), pos: pos{field: "node " + name + " route " + routes[i]}})
	}
	b.t.Nodes = append(b.t.Nodes, n)
}

func (b *topoBuilder) link(name, class, a, bnode, subnet string, rate Rate, delay time.Duration) *Link {
	s := netip.MustParsePrefix(subnet)
	sh := Shape{Rate: rate, Delay: delay}
	l := &Link{
		Name: name, Class: class,
		A:  End{Node: a, Addr: netip.PrefixFrom(s.Addr().Next(), s.Bits())},
		B:  End{Node: bnode, Addr: netip.PrefixFrom(s.Addr().Next().Next(), s.Bits())},
		AB: sh, BA: sh,
		pos: pos{field: "link " + name},
	}
	b.t.Links = append(b.t.Links, l)
	return l
}

const mbit = Rate(1_000_000)

// genBrennan builds the reference topology (see docs/lab.md and
// /work/shared/reference/detour-evaluation.md).
func genBrennan(p map[string]string) *Topology {
	b := &topoBuilder{t: &Topology{}}
	access, core := 10*mbit, 10*mbit
	if p["profile"] == "core-limited" {
		access = 20 * mbit
	}
	const d = 5 * time.Millisecond
	b.node("client", false, "default", "10.0.1.2")
	b.node("r1", true, "10.0.0.0/8", "10.0.2.2", "10.0.6.0/24", "10.0.4.2")
	b.node("r2", true, "10.0.0.0/8", "10.0.2.1", "10.0.6.0/24", "10.0.5.1")
	b.node("r3", true, "10.0.0.0/8", "10.0.5.2", "10.0.1.0/24", "10.0.4.1")
	b.node("server", false, "default", "10.0.3.1")
	b.node("detour", false, "default", "10.0.6.1")
	b.link("L1", "access", "client", "r1", "10.0.1.0/24", access, d)
	l2 := b.link("L2", "core", "r1", "r2", "10.0.2.0/24", core, d)
	b.link("L3", "access", "r2", "server", "10.0.3.0/24", access, d)
	b.link("L4", "core", "r1", "r3", "10.0.4.0/24", core, d)
	b.link("L5", "core", "r3", "r2", "10.0.5.0/24", core, d)
	b.link("L6", "access", "r3", "detour", "10.0.6.0/24", access, d)
	switch p["variant"] {
	case "lossy":
		l2.AB.Loss, l2.BA.Loss = 0.01, 0.01
	case "delayed":
		l2.AB.Delay, l2.BA.Delay = 100*time.Millisecond, 100*time.Millisecond
	}
	return b.t
}

// sharedDetours parses the detours topology's `shared` parameter: "none"
// or detour numbers joined by '+' ("3+5"), the detours whose traffic to
// the server crosses the default path's bottleneck C0.
func sharedDetours(value string) (map[int]bool, error) {
	m := map[int]bool{}
	if value == "none" || value == "" {
		return m, nil
	}
	for _, f := range strings.Split(value, "+") {
		i, err := strconv.Atoi(f)
		if err != nil || i < 1 || i > MaxDetours {
			return nil, fmt.Errorf("shared must be none or detour numbers 1..%d joined by '+' (e.g. 3+5), not %q", MaxDetours, value)
		}
		if m[i] {
			return nil, fmt.Errorf("shared names detour%d twice", i)
		}
		m[i] = true
	}
	return m, nil
}

// genDetours builds one client, one server, a default path and K detour
// relays, each reached over its own core link (see docs/lab.md). A shared
// detour has no egress link of its own: it reaches the server back through
// r1 and the default path's core link C0, so it shares that bottleneck.
func genDetours(p map[string]string) *Topology {
	k, _ := strconv.Atoi(p["detours"])
	shared, _ := sharedDetours(p["shared"])
	b := &topoBuilder{t: &Topology{}}
	const d = 5 * time.Millisecond
	accessRate := Rate(k+1) * 10 * mbit
	b.node("client", false, "default", "10.0.1.2")
	b.node("r1", true, "10.0.0.0/8", "10.0.2.2")
	r2routes := []string{"10.0.0.0/8", "10.0.2.1"}
	for i := 1; i <= k; i++ {
		if !shared[i] {
			r2routes = append(r2routes, fmt.Sprintf("10.1.%d.0/24", i), fmt.Sprintf("10.2.%d.1", i))
		}
	}
	b.node("r2", true, r2routes...)
	b.node("server", false, "default", "10.0.3.1")
	b.link("A1", "access", "client", "r1", "10.0.1.0/24", accessRate, d)
	b.link("C0", "core", "r1", "r2", "10.0.2.0/24", 10*mbit, d)
	b.link("A2", "access", "r2", "server", "10.0.3.0/24", accessRate, d)
	for i := 1; i <= k; i++ {
		name := fmt.Sprintf("detour%d", i)
		if shared[i] {
			b.node(name, true, "default", fmt.Sprintf("10.1.%d.1", i))
			b.link(fmt.Sprintf("C%d", i), "core", "r1", name, fmt.Sprintf("10.1.%d.0/24", i), 10*mbit, d)
			continue
		}
		b.node(name, true, "default", fmt.Sprintf("10.1.%d.1", i), "10.0.3.0/24", fmt.Sprintf("10.2.%d.2", i))
		b.link(fmt.Sprintf("C%d", i), "core", "r1", name, fmt.Sprintf("10.1.%d.0/24", i), 10*mbit, d)
		b.link(fmt.Sprintf("E%d", i), "egress", name, "r2", fmt.Sprintf("10.2.%d.0/24", i), 20*mbit, d)
	}
	return b.t
}

// genLine builds client -- relay -- server over two unshaped links (no
// rate, delay or loss, so offloads stay on): plain routing and every
// detour kind through the same middle node, for data-plane speed (issue
// 18). The relay node forwards, so plain TCP takes the same path as a
// detour.
func genLine(map[string]string) *Topology {
	b := &topoBuilder{t: &Topology{}}
	b.node("client", false, "default", "10.0.1.2")
	b.node("relay", true)
	b.node("server", false, "default", "10.0.2.1")
	b.link("A", "access", "client", "relay", "10.0.1.0/24", 0, 0)
	b.link("B", "access", "relay", "server", "10.0.2.0/24", 0, 0)
	return b.t
}
