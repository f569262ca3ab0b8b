package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The YAML library's type errors ("cannot unmarshal !!str `many` into
// int", Go type names, values cut to 7 characters) are rewritten into what
// the field wants and what the file gave, from the node and the target's
// Go type.
var unmarshalMsg = regexp.MustCompile("^cannot unmarshal (!!\\w+)(?: `.*`)? into (.+)$")
var duplicateMsg = regexp.MustCompile(`^mapping key "(.*)" already defined at line (\d+)$`)

// typeMessage translates one library message about node n (nil when not
// found) into a field of type ft (nil when unknown).
func typeMessage(msg string, n *yaml.Node, ft reflect.Type) string {
	if m := duplicateMsg.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("key %q is given twice (first at line %s); keep one", m[1], m[2])
	}
	m := unmarshalMsg.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := "a " + m[2]
	if ft != nil {
		want = describeType(ft)
	}
	return fmt.Sprintf("want %s, got %s", want, describeNode(m[1], n))
}

// describeNode says what a node of tag holds: "text \"many\"", "a list".
func describeNode(tag string, n *yaml.Node) string {
	val := ""
	if n != nil && n.Kind == yaml.ScalarNode {
		val = n.Value
		if len(val) > 40 {
			val = val[:37] + "..."
		}
	}
	switch tag {
	case "!!str":
		return "text " + strconv.Quote(val)
	case "!!int", "!!float":
		return "the number " + val
	case "!!bool":
		return "the boolean " + val
	case "!!null":
		return "nothing (an empty value)"
	case "!!map":
		return "a mapping (key: value)"
	case "!!seq":
		return "a list"
	case "!!timestamp":
		return "the date " + val
	}
	return tag + " " + strconv.Quote(val)
}

// describeType says what a Go field type accepts, in YAML terms.
func describeType(t reflect.Type) string {
	if t == reflect.TypeOf(Duration(0)) {
		return "a duration (e.g. 250ms, 90s, 2m)"
	}
	switch t.Kind() {
	case reflect.String:
		return "text (put it in quotes if it looks like something else)"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		if t.String() == "time.Duration" {
			return "a duration (e.g. 250ms, 90s, 2m)"
		}
		return "a whole number"
	case reflect.Int8, reflect.Int16, reflect.Int32:
		bits := t.Bits()
		return fmt.Sprintf("a whole number %d..%d", -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return fmt.Sprintf("a whole number 0..%d", uint64(1)<<t.Bits()-1)
	case reflect.Uint, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list (\"- item\" lines, or [a, b])"
	case reflect.Map, reflect.Struct:
		return "a mapping (key: value lines, or {key: value})"
	}
	return "a " + t.String()
}

// typeAt is the Go type of field path p ("relays.servers[0].port") in t,
// following yaml's field names; nil when the path leaves the known types.
func typeAt(t reflect.Type, p string) reflect.Type {
	if t == nil {
		return nil
	}
	deref := func(t reflect.Type) reflect.Type {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		return t
	}
	t = deref(t)
	if p == "" {
		return t
	}
	for _, part := range strings.Split(p, ".") {
		name, idx := part, ""
		if i := strings.IndexByte(part, '['); i >= 0 {
			name, idx = part[:i], part[i:]
		}
		if name != "" {
			switch t.Kind() {
			case reflect.Struct:
				ft, ok := structFields(t)[name]
				if !ok {
					return nil
				}
				t = deref(ft)
			case reflect.Map:
				t = deref(t.Elem())
			default:
				return nil
			}
		}
		for range strings.Count(idx, "[") {
			if t.Kind() != reflect.Slice && t.Kind() != reflect.Array {
				return nil
			}
			t = deref(t.Elem())
		}
	}
	return t
}

// collectionAtLine finds the innermost mapping or sequence (kind) that
// starts on line, and its field path: the node a "cannot unmarshal !!seq"
// is about (fieldAtLine would find a scalar inside it).
func collectionAtLine(n *yaml.Node, line int, path string, kind yaml.Kind) (string, *yaml.Node) {
	var bestPath string
	var best *yaml.Node
	var visit func(n *yaml.Node, p string)
	visit = func(n *yaml.Node, p string) {
		if n.Kind == kind && n.Line == line {
			bestPath, best = p, n
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				visit(n.Content[i+1], join(p, n.Content[i].Value))
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				visit(c, fmt.Sprintf("%s[%d]", p, i))
			}
		}
	}
	if n != nil {
		visit(n, path)
	}
	return bestPath, best
}
