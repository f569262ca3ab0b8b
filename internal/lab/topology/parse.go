package topology

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is a problem with a topology, located in its source: a file line
// and field, or a field path for built-ins and --set.
type Error struct {
	Source string // file path or "builtin:NAME"
	Line   int    // 0 when unknown
	Col    int    // 0 when unknown
	Field  string // e.g. "links[1].rate" or "link L2"
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Source)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// MaxFileSize bounds topology files; they are small by nature.
const MaxFileSize = 1 << 20

// LoadFile reads and validates a YAML topology file.
func LoadFile(path string) (*Topology, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Parse parses and validates a YAML topology; source names it in errors.
func Parse(source string, data []byte) (*Topology, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{Source: source, Msg: fmt.Sprintf("file larger than %d bytes", MaxFileSize)}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{Source: source, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	p := &parser{src: source}
	t := &Topology{Source: source, Name: strings.TrimSuffix(filepath.Base(source), filepath.Ext(source))}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &Error{Source: source, Msg: "empty topology"}
	}
	root := doc.Content[0]
	err := p.mapping(root, "", map[string]func(k, v *yaml.Node) error{
		"name": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, "name")
			if err == nil {
				if err2 := checkName("topology", s, 40); err2 != nil {
					return p.errf(v, "name", "%v", err2)
				}
				t.Name = s
			}
			return err
		},
		"nodes": func(_, v *yaml.Node) error {
			return p.sequence(v, "nodes", func(i int, n *yaml.Node) error {
				node, err := p.node(n, fmt.Sprintf("nodes[%d]", i))
				if err == nil {
					t.Nodes = append(t.Nodes, node)
				}
				return err
			})
		},
		"links": func(_, v *yaml.Node) error {
			return p.sequence(v, "links", func(i int, n *yaml.Node) error {
				l, err := p.link(n, fmt.Sprintf("links[%d]", i))
				if err == nil {
					t.Links = append(t.Links, l)
				}
				return err
			})
		},
	})
	if err != nil {
		return nil, err
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

type parser struct{ src string }

func (p *parser) errf(n *yaml.Node, field, format string, a ...any) error {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	return &Error{Source: p.src, Line: line, Col: col, Field: field, Msg: fmt.Sprintf(format, a...)}
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// mapping walks a YAML mapping, refusing unknown and repeated keys.
func (p *parser) mapping(n *yaml.Node, field string, keys map[string]func(k, v *yaml.Node) error) error {
	if n.Kind == yaml.AliasNode {
		return p.errf(n, field, "aliases are not supported")
	}
	if n.Kind != yaml.MappingNode {
		what := field
		if what == "" {
			what = "the document"
		}
		return p.errf(n, "", "%s must be a mapping", what)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return p.errf(k, field, "keys must be plain strings")
		}
		f, ok := keys[k.Value]
		if !ok {
			known := make([]string, 0, len(keys))
			for kk := range keys {
				known = append(known, kk)
			}
			sort.Strings(known)
			return p.errf(k, join(field, k.Value), "unknown field (known: %s)", strings.Join(known, ", "))
		}
		if seen[k.Value] {
			return p.errf(k, join(field, k.Value), "repeated field")
		}
		seen[k.Value] = true
		if err := f(k, v); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) sequence(n *yaml.Node, field string, each func(i int, n *yaml.Node) error) error {
	if n.Kind != yaml.SequenceNode {
		return p.errf(n, field, "must be a list")
	}
	for i, c := range n.Content {
		if err := each(i, c); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) scalar(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", p.errf(n, field, "must be a single value")
	}
	return n.Value, nil
}

func (p *parser) bool(n *yaml.Node, field string) (bool, error) {
	s, err := p.scalar(n, field)
	if err != nil {
		return false, err
	}
	switch strings.ToLower(s) {
	case "true", "yes", "on":
		return true, nil
	case "false", "no", "off":
		return false, nil
	}
	return false, p.errf(n, field, "want true or false, not %q", s)
}

func (p *parser) node(n *yaml.Node, field string) (*Node, error) {
	node := &Node{pos: pos{line: n.Line, col: n.Column, field: field}}
	err := p.mapping(n, field, map[string]func(k, v *yaml.Node) error{
		"name": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, field+".name")
			node.Name = s
			return err
		},
		"forward": func(_, v *yaml.Node) error {
			b, err := p.bool(v, field+".forward")
			node.Forward = b
			return err
		},
		"sysctls": func(_, v *yaml.Node) error {
			if v.Kind != yaml.MappingNode {
				return p.errf(v, field+".sysctls", "must be a mapping of key: value")
			}
			for i := 0; i+1 < len(v.Content); i += 2 {
				k, val := v.Content[i], v.Content[i+1]
				f := field + ".sysctls." + k.Value
				s, err := p.scalar(val, f)
				if err != nil {
					return err
				}
				node.Sysctls = append(node.Sysctls, Sysctl{Key: k.Value, Value: s, pos: pos{line: k.Line, col: k.Column, field: f}})
			}
			return nil
		},
		"routes": func(_, v *yaml.Node) error {
			return p.sequence(v, field+".routes", func(i int, rn *yaml.Node) error {
				rf := fmt.Sprintf("%s.routes[%d]", field, i)
				r := Route{pos: pos{line: rn.Line, col: rn.Column, field: rf}}
				var haveTo, haveVia bool
				err := p.mapping(rn, rf, map[string]func(k, v *yaml.Node) error{
					"to": func(_, v *yaml.Node) error {
						s, err := p.scalar(v, rf+".to")
						if err != nil {
							return err
						}
						if r.Dst, err = parseDst(s); err != nil {
							return p.errf(v, rf+".to", "%v", err)
						}
						haveTo = true
						return nil
					},
					"via": func(_, v *yaml.Node) error {
						s, err := p.scalar(v, rf+".via")
						if err != nil {
							return err
						}
						if r.Via, err = netip.ParseAddr(s); err != nil || !r.Via.Is4() {
							return p.errf(v, rf+".via", "bad IPv4 address %q", s)
						}
						haveVia = true
						return nil
					},
				})
				if err != nil {
					return err
				}
				if !haveTo || !haveVia {
					return p.errf(rn, rf, "a route needs both to: and via:")
				}
				node.Routes = append(node.Routes, r)
				return nil
			})
		},
	})
	if err != nil {
		return nil, err
	}
	if node.Name == "" {
		return nil, p.errf(n, field, "node without a name")
	}
	node.pos.field = "node " + node.Name
	for i := range node.Routes {
		node.Routes[i].pos.field = strings.Replace(node.Routes[i].pos.field, field, node.pos.field, 1)
	}
	for i := range node.Sysctls {
		node.Sysctls[i].pos.field = strings.Replace(node.Sysctls[i].pos.field, field, node.pos.field, 1)
	}
	return node, nil
}

func parseDst(s string) (netip.Prefix, error) {
	if s == "default" {
		return netip.MustParsePrefix("0.0.0.0/0"), nil
	}
	pfx, err := netip.ParsePrefix(s)
	if err != nil || !pfx.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("bad destination %q: want an IPv4 prefix such as 10.0.0.0/8, or default", s)
	}
	if pfx.Masked() != pfx {
		return netip.Prefix{}, fmt.Errorf("bad destination %q: host bits set (did you mean %s?)", s, pfx.Masked())
	}
	return pfx, nil
}

// shapeFields parses rate/delay/loss/queue keys into the given shapes.
func (p *parser) shapeFields(field string, shapes []*Shape, set map[string]bool) map[string]func(k, v *yaml.Node) error {
	apply := func(key string, parse func(string) error) func(k, v *yaml.Node) error {
		return func(_, v *yaml.Node) error {
			s, err := p.scalar(v, join(field, key))
			if err != nil {
				return err
			}
			if err := parse(s); err != nil {
				return p.errf(v, join(field, key), "%v", err)
			}
			if set != nil {
				set[key] = true
			}
			return nil
		}
	}
	return map[string]func(k, v *yaml.Node) error{
		"rate": apply("rate", func(s string) error {
			r, err := ParseRate(s)
			for _, sh := range shapes {
				sh.Rate = r
			}
			return err
		}),
		"delay": apply("delay", func(s string) error {
			d, err := ParseDelay(s)
			for _, sh := range shapes {
				sh.Delay = d
			}
			return err
		}),
		"loss": apply("loss", func(s string) error {
			l, err := ParseLoss(s)
			for _, sh := range shapes {
				sh.Loss = l
			}
			return err
		}),
		"queue": apply("queue", func(s string) error {
			q, err := ParseQueue(s)
			for _, sh := range shapes {
				sh.Queue = q
			}
			return err
		}),
	}
}

func (p *parser) link(n *yaml.Node, field string) (*Link, error) {
	l := &Link{pos: pos{line: n.Line, col: n.Column, field: field}}
	var subnet netip.Prefix
	var subnetNode, aAddrNode, bAddrNode *yaml.Node
	// Both-direction fields are applied first, per-direction blocks after,
	// whatever their order in the file.
	both := p.shapeFields(field, []*Shape{&l.AB, &l.BA}, nil)
	var dirBlocks [][2]*yaml.Node
	keys := map[string]func(k, v *yaml.Node) error{
		"name": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, field+".name")
			l.Name = s
			return err
		},
		"class": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, field+".class")
			l.Class = s
			return err
		},
		"a": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, field+".a")
			l.A.Node = s
			l.endPos[0].line = v.Line
			return err
		},
		"b": func(_, v *yaml.Node) error {
			s, err := p.scalar(v, field+".b")
			l.B.Node = s
			l.endPos[1].line = v.Line
			return err
		},
		"subnet": func(_, v *yaml.Node) error { subnetNode = v; return nil },
		"a_addr": func(_, v *yaml.Node) error { aAddrNode = v; return nil },
		"b_addr": func(_, v *yaml.Node) error { bAddrNode = v; return nil },
		"ab":     func(k, v *yaml.Node) error { dirBlocks = append(dirBlocks, [2]*yaml.Node{k, v}); return nil },
		"ba":     func(k, v *yaml.Node) error { dirBlocks = append(dirBlocks, [2]*yaml.Node{k, v}); return nil },
	}
	for k, f := range both {
		keys[k] = f
	}
	if err := p.mapping(n, field, keys); err != nil {
		return nil, err
	}
	if l.Name != "" {
		field = "link " + l.Name
		l.pos.field = field
	}
	for i, k := range []string{".a", ".b"} {
		l.endPos[i].field = field + k
	}
	if subnetNode != nil {
		l.addrPos[0] = pos{line: subnetNode.Line, col: subnetNode.Column, field: field + ".subnet"}
		l.addrPos[1] = l.addrPos[0]
	}
	if aAddrNode != nil {
		l.addrPos[0] = pos{line: aAddrNode.Line, col: aAddrNode.Column, field: field + ".a_addr"}
	}
	if bAddrNode != nil {
		l.addrPos[1] = pos{line: bAddrNode.Line, col: bAddrNode.Column, field: field + ".b_addr"}
	}
	for _, kv := range dirBlocks {
		sh := &l.AB
		if kv[0].Value == "ba" {
			sh = &l.BA
		}
		df := field + "." + kv[0].Value
		if err := p.mapping(kv[1], df, p.shapeFields(df, []*Shape{sh}, nil)); err != nil {
			return nil, err
		}
	}
	if subnetNode != nil {
		s, err := p.scalar(subnetNode, field+".subnet")
		if err != nil {
			return nil, err
		}
		subnet, err = netip.ParsePrefix(s)
		if err != nil || !subnet.Addr().Is4() || subnet.Bits() > 30 || subnet.Masked() != subnet {
			return nil, p.errf(subnetNode, field+".subnet", "bad subnet %q: want an IPv4 network of /30 or larger, e.g. 10.0.1.0/24", s)
		}
		l.A.Addr = netip.PrefixFrom(subnet.Addr().Next(), subnet.Bits())
		l.B.Addr = netip.PrefixFrom(subnet.Addr().Next().Next(), subnet.Bits())
	}
	for _, x := range []struct {
		n   *yaml.Node
		key string
		dst *netip.Prefix
	}{{aAddrNode, "a_addr", &l.A.Addr}, {bAddrNode, "b_addr", &l.B.Addr}} {
		if x.n == nil {
			continue
		}
		s, err := p.scalar(x.n, field+"."+x.key)
		if err != nil {
			return nil, err
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil || !pfx.Addr().Is4() || pfx.Bits() > 30 {
			return nil, p.errf(x.n, field+"."+x.key, "bad address %q: want an IPv4 address with prefix length, e.g. 10.0.1.1/24", s)
		}
		*x.dst = pfx
	}
	if !l.A.Addr.IsValid() || !l.B.Addr.IsValid() {
		return nil, p.errf(n, field, "link needs subnet: or both a_addr: and b_addr:")
	}
	return l, nil
}
