// Package config is the one way mpdetour reads its YAML files (relay,
// agent, tunnel section, lab topologies, bench scenarios): strict (a key the
// target does not know is an error), and every error names
// file:line:column of the whole file, also for sections decoded later by
// another package (Doc.Sub keeps the positions of the file it came from).
//
// go.yaml.in/yaml/v3 is the maintained continuation of gopkg.in/yaml.v3; it
// reports type errors as "line N: ..." strings without a column, and its
// KnownFields check exists only on a Decoder, not on a Node. Strictness and
// positions are therefore done here, by walking the parsed node tree against
// the target type once (unknownKeys) and mapping the library's line-only
// messages back to nodes (locate).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Node is a parsed YAML node (re-exported so packages that keep a section
// for later do not import the YAML library themselves).
type Node = yaml.Node

// Error is a configuration error at a position of a file.
type Error struct {
	File      string // as given to Load or Parse
	Line, Col int    // 1-based; 0 when unknown
	Msg       string // starts with the field path when known
}

func (e *Error) Error() string {
	switch {
	case e.Line > 0 && e.Col > 0:
		return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Doc is a parsed file (or a section of one) that positions errors.
type Doc struct {
	file string
	root *yaml.Node // a mapping, sequence or scalar node; nil for an empty file
	path string     // field path of root inside the file ("" = top)
}

// Load reads path and decodes it strictly into v (a pointer to a struct).
func Load(path string, v any) (*Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b, v)
}

// Parse decodes b strictly into v; name is used in error positions.
// An empty document decodes to the zero value without error (callers
// that need content check for it).
func Parse(name string, b []byte, v any) (*Doc, error) {
	var top yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	err := dec.Decode(&top)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(name, err)
	}
	if err == nil {
		var extra yaml.Node
		if dec.Decode(&extra) == nil {
			return nil, &Error{File: name, Line: extra.Line, Col: extra.Column, Msg: "more than one YAML document; want exactly one"}
		}
	}
	d := &Doc{file: name}
	if len(top.Content) > 0 {
		d.root = top.Content[0]
	}
	return d, d.Decode(v)
}

// NewDoc wraps a node kept from an earlier Parse (for instance a section
// typed config.Node) so that its errors carry file positions. path is the
// node's field path in the file ("tunnel").
func NewDoc(file, path string, n *yaml.Node) *Doc {
	if n != nil && n.Kind == 0 {
		n = nil
	}
	return &Doc{file: file, root: n, path: path}
}

// Same says whether two documents (or sections) have the same content,
// positions and comments aside: what a reload compares.
func (d *Doc) Same(o *Doc) bool {
	if d == nil || o == nil || d.root == nil || o.root == nil {
		return (d == nil || d.root == nil) == (o == nil || o.root == nil)
	}
	a, errA := yaml.Marshal(stripped(d.root))
	b, errB := yaml.Marshal(stripped(o.root))
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// stripped copies a node tree without comments, positions and styles
// (flow or block, quoting): the tag says what a scalar is.
func stripped(n *yaml.Node) *yaml.Node {
	c := &yaml.Node{Kind: n.Kind, Tag: n.ShortTag(), Value: n.Value}
	if n.Alias != nil {
		c.Alias = stripped(n.Alias)
	}
	for _, x := range n.Content {
		c.Content = append(c.Content, stripped(x))
	}
	return c
}

// File is the file name errors carry.
func (d *Doc) File() string { return d.file }

// Empty says whether the document (or section) has no content.
func (d *Doc) Empty() bool { return d.root == nil }

// Sub is the section at field path p ("tunnel", "relays.servers[0]"); nil
// when absent.
func (d *Doc) Sub(p string) *Doc {
	n := d.lookup(p)
	if n == nil {
		return nil
	}
	return &Doc{file: d.file, root: n, path: join(d.path, p)}
}

// Decode decodes the document strictly into v: unknown keys and type
// mismatches are errors with positions; a decoded value's UnmarshalYAML may
// return an *Error (Duration does) which gets the file name.
func (d *Doc) Decode(v any) error {
	if d.root == nil {
		return nil
	}
	if err := unknownKeys(d, d.root, reflect.TypeOf(v), d.path); err != nil {
		return err
	}
	if err := d.root.Decode(v); err != nil {
		return d.decodeError(err, reflect.TypeOf(v))
	}
	return nil
}

// Errorf is an error at field path p (relative to this Doc, e.g.
// "detours[2].address"), positioned at that field's value; when the field is
// absent, at the nearest enclosing field that exists. The message is
// prefixed with the full field path.
func (d *Doc) Errorf(p, format string, args ...any) error {
	return d.at(p, fmt.Sprintf(format, args...))
}

// Locate positions an error whose message starts with a field path
// ("detours[2].kind: missing"), as the validation code of every config
// writes them; other errors are positioned at the document.
func (d *Doc) Locate(err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		if ce.File == "" {
			ce.File = d.file
		}
		return ce
	}
	msg := err.Error()
	if m := pathPrefix.FindStringSubmatch(msg); m != nil && d.lookupPartial(m[1]) != d.root {
		return d.at(m[1], strings.TrimPrefix(msg[len(m[0]):], " "))
	}
	line, col := 0, 0
	if d.root != nil {
		line, col = d.root.Line, d.root.Column
	}
	if d.path != "" {
		msg = d.path + ": " + msg
	}
	return &Error{File: d.file, Line: line, Col: col, Msg: msg}
}

var pathPrefix = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_\-]*(?:\[\d+\])*(?:\.[A-Za-z_][A-Za-z0-9_\-]*(?:\[\d+\])*)*):`)

func (d *Doc) at(p, msg string) error {
	n := d.lookupPartial(p)
	e := &Error{File: d.file, Msg: join(d.path, p) + ": " + msg}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	return e
}

// lookup finds the node at path p or nil.
func (d *Doc) lookup(p string) *yaml.Node {
	n, ok := walk(d.root, p)
	if !ok {
		return nil
	}
	return n
}

// lookupPartial finds the node at p or the deepest existing ancestor.
func (d *Doc) lookupPartial(p string) *yaml.Node {
	n, _ := walk(d.root, p)
	return n
}

// walk follows "a.b[2].c" from n; it returns the deepest node reached and
// whether the whole path was found.
func walk(n *yaml.Node, p string) (*yaml.Node, bool) {
	if n == nil {
		return nil, false
	}
	if p == "" {
		return n, true
	}
	for _, part := range strings.Split(p, ".") {
		name, idx := part, []int(nil)
		if i := strings.IndexByte(part, '['); i >= 0 {
			name = part[:i]
			for _, s := range strings.Split(strings.TrimSuffix(part[i+1:], "]"), "][") {
				k, err := strconv.Atoi(s)
				if err != nil {
					return n, false
				}
				idx = append(idx, k)
			}
		}
		if name != "" {
			v := mapValue(n, name)
			if v == nil {
				return n, false
			}
			n = v
		}
		for _, k := range idx {
			if n.Kind == yaml.AliasNode {
				n = n.Alias
			}
			if n.Kind != yaml.SequenceNode || k < 0 || k >= len(n.Content) {
				return n, false
			}
			n = n.Content[k]
		}
	}
	return n, true
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	case strings.HasPrefix(b, "["):
		return a + b
	}
	return a + "." + b
}

var lineMsg = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

func syntaxError(name string, err error) error {
	msg := err.Error()
	if m := lineMsg.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: name, Line: line, Msg: "YAML syntax: " + m[2]}
	}
	return &Error{File: name, Msg: strings.TrimPrefix(msg, "yaml: ")}
}

// decodeError maps the library's "line N: cannot unmarshal ..." to the node
// at that line (first error only: one clear error beats a list of echoes)
// and says in our words what the field of t wants (typeMessage).
func (d *Doc) decodeError(err error, t reflect.Type) error {
	var ce *Error
	if errors.As(err, &ce) {
		if ce.File == "" {
			ce.File = d.file
		}
		if ce.Line > 0 {
			if p, _ := fieldAtLine(d.root, ce.Line, d.path); p != "" && !strings.HasPrefix(ce.Msg, p) {
				ce.Msg = p + ": " + ce.Msg
			}
		}
		return ce
	}
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg := te.Errors[0]
		if m := lineMsg.FindStringSubmatch(msg); m != nil {
			line, _ := strconv.Atoi(m[1])
			p, n := fieldAtLine(d.root, line, d.path)
			if strings.HasPrefix(m[2], "cannot unmarshal !!seq ") {
				if cp, cn := collectionAtLine(d.root, line, d.path, yaml.SequenceNode); cn != nil {
					p, n = cp, cn
				}
			} else if strings.HasPrefix(m[2], "cannot unmarshal !!map ") {
				if cp, cn := collectionAtLine(d.root, line, d.path, yaml.MappingNode); cn != nil {
					p, n = cp, cn
				}
			}
			var ft reflect.Type
			if p != "" {
				ft = typeAt(t, strings.TrimPrefix(strings.TrimPrefix(p, d.path), "."))
			}
			e := &Error{File: d.file, Line: line, Msg: typeMessage(m[2], n, ft)}
			if n != nil {
				e.Col = n.Column
			}
			if p != "" {
				e.Msg = p + ": " + e.Msg
			}
			return e
		}
		return &Error{File: d.file, Msg: typeMessage(msg, nil, nil)}
	}
	// A custom unmarshaler's "line N: ..." (the library gives them no
	// column): position it at that line's field.
	if m := lineMsg.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		p, n := fieldAtLine(d.root, line, d.path)
		e := &Error{File: d.file, Line: line, Msg: m[2]}
		if n != nil {
			e.Col = n.Column
		}
		if p != "" && !strings.HasPrefix(m[2], p) {
			e.Msg = p + ": " + m[2]
		}
		return e
	}
	return d.Locate(err)
}

// fieldAtLine finds the innermost value node on line and its field path.
func fieldAtLine(n *yaml.Node, line int, path string) (string, *yaml.Node) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if f, fn := fieldAtLine(v, line, p); fn != nil {
				return f, fn
			}
			if v.Line == line && v.Kind == yaml.ScalarNode || k.Line == line {
				return p, v
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if f, fn := fieldAtLine(c, line, p); fn != nil {
				return f, fn
			}
			if c.Line == line && c.Kind == yaml.ScalarNode {
				return p, c
			}
		}
	}
	return "", nil
}

var (
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
	nodeType        = reflect.TypeOf(yaml.Node{})
)

// unknownKeys reports the first mapping key that t has no field for, and
// the first number with a fraction given for a whole-number field (the
// YAML library truncates 1.5 into 1 without a word).
func unknownKeys(d *Doc, n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		if t.Implements(unmarshalerType) {
			return nil
		}
		t = t.Elem()
	}
	if t == nodeType || reflect.PointerTo(t).Implements(unmarshalerType) || t.Kind() == reflect.Interface {
		return nil
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" {
			return &Error{File: d.file, Line: n.Line, Col: n.Column,
				Msg: fmt.Sprintf("%s: want %s, got %s", path, describeType(t), describeNode("!!float", n))}
		}
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil // the decoder reports the type mismatch
		}
		fields := structFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				return &Error{File: d.file, Line: k.Line, Col: k.Column,
					Msg: fmt.Sprintf("%s: unknown key %q (known here: %s)", join(path, k.Value), k.Value, knownList(fields))}
			}
			if err := unknownKeys(d, v, ft, join(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return nil
		}
		for i, c := range n.Content {
			if err := unknownKeys(d, c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := unknownKeys(d, n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

// structFields maps YAML keys to field types, following yaml's rules
// (lower-cased field name by default, "-" skipped, ",inline" flattened).
func structFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.PkgPath != "" && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range structFields(ft) {
					out[k] = v
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

func knownList(m map[string]reflect.Type) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// Duration is the one duration type of every config: "90s", "2m", "250ms".
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (x *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return &Error{Line: n.Line, Col: n.Column, Msg: fmt.Sprintf("%q is not a duration (e.g. 250ms, 90s, 2m)", n.Value)}
	}
	*x = Duration(v)
	return nil
}

// MarshalYAML writes the duration as time.Duration prints it.
func (x Duration) MarshalYAML() (any, error) { return time.Duration(x).String(), nil }

// MarshalJSON writes the duration as a string ("5ms"), so state files stay
// readable.
func (x Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(x).String()) }

// UnmarshalJSON accepts a duration string; bare numbers are refused (the
// nanoseconds-or-milliseconds ambiguity is the mistake this type prevents).
func (x *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"5ms\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("bad duration %q: %v", s, err)
	}
	*x = Duration(v)
	return nil
}

// D is the value as a time.Duration.
func (x Duration) D() time.Duration { return time.Duration(x) }

func (x Duration) String() string { return time.Duration(x).String() }

// LogLevel is the one log-level setting: debug, info, warn or error.
type LogLevel struct {
	slog.Level
	Set bool // written in the file
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (l *LogLevel) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseLogLevel(n.Value)
	if err != nil {
		return &Error{Line: n.Line, Col: n.Column, Msg: err.Error()}
	}
	*l = LogLevel{Level: v, Set: true}
	return nil
}

// ParseLogLevel parses debug, info, warn (warning) or error; "" is info.
func ParseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q is not debug, info, warn or error", s)
}
