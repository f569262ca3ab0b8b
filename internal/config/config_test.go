package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Address string   `yaml:"address"`
	Every   Duration `yaml:"every"`
}

type sample struct {
	Name    string   `yaml:"name"`
	Count   int      `yaml:"count"`
	Lease   Duration `yaml:"lease"`
	Level   LogLevel `yaml:"log_level"`
	Items   []inner  `yaml:"items"`
	Nested  inner    `yaml:"nested"`
	Section Node     `yaml:"section"`
	Map     map[string]inner
	Small   uint16 `yaml:"small"`
	Flag    bool   `yaml:"flag"`
	Skip    string `yaml:"-"`
}

func TestParseValid(t *testing.T) {
	src := "name: a\ncount: 3\nlease: 90s\nlog_level: debug\nitems:\n  - address: x\n    every: 250ms\nmap:\n  k: {address: y}\nsection:\n  free: form\n"
	var s sample
	d, err := Parse("a.yaml", []byte(src), &s)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "a" || s.Count != 3 || s.Lease.D() != 90*time.Second || s.Level.Level != slog.LevelDebug || !s.Level.Set ||
		len(s.Items) != 1 || s.Items[0].Every.D() != 250*time.Millisecond || s.Map["k"].Address != "y" {
		t.Fatalf("decoded %+v", s)
	}
	sec := NewDoc(d.File(), "section", &s.Section)
	var free struct {
		Other string `yaml:"other"`
	}
	err = sec.Decode(&free)
	assertErr(t, err, "a.yaml:11:3: section.free: unknown key")
}

func assertErr(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want it to contain %q", err, want)
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %T is not *config.Error", err)
	}
}

func TestErrorsArePositioned(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"name: a\nbogus: 1\n", "f.yaml:2:1: bogus: unknown key \"bogus\" (known here: count, flag, items, lease, log_level, map, name, nested, section, small)"},
		{"items:\n  - address: x\n    typo: 1\n", "f.yaml:3:5: items[0].typo: unknown key"},
		{"nested:\n  every: soon\n", "f.yaml:2:10: nested.every: \"soon\" is not a duration"},
		{"count: many\n", "f.yaml:1:8: count: want a whole number, got text \"many\""},
		{"count: [1, 2]\n", "f.yaml:1:8: count: want a whole number, got a list"},
		{"name: {a: 1}\n", "f.yaml:1:7: name: want text (put it in quotes if it looks like something else), got a mapping"},
		{"items: {address: x}\n", "f.yaml:1:8: items: want a list (\"- item\" lines, or [a, b]), got a mapping"},
		{"items:\n  - address: [x]\n", "f.yaml:2:14: items[0].address: want text"},
		{"nested: 3\n", "f.yaml:1:9: nested: want a mapping (key: value lines, or {key: value}), got the number 3"},
		{"map:\n  k: [1]\n", "f.yaml:2:6: map.k: want a mapping"},
		{"small: 70000\n", "f.yaml:1:8: small: want a whole number 0..65535, got the number 70000"},
		{"flag: maybe-not-a-boolean-at-all\n", "f.yaml:1:7: flag: want true or false, got text \"maybe-not-a-boolean-at-all\""},
		{"name: a\nname: b\n", "f.yaml:2:7: name: key \"name\" is given twice (first at line 1); keep one"},
		{"log_level: loud\n", "f.yaml:1:12: log_level: log level \"loud\" is not debug"},
		{"name: [\n", "f.yaml:1: YAML syntax"},
		{"map:\n  k:\n    nope: 1\n", "f.yaml:3:5: map.k.nope: unknown key"},
	} {
		var s sample
		_, err := Parse("f.yaml", []byte(tc.src), &s)
		assertErr(t, err, tc.want)
	}
}

func TestLocateAndErrorf(t *testing.T) {
	src := "name: a\nitems:\n  - address: x\n  - address: bad\n"
	var s sample
	d, err := Parse("g.yaml", []byte(src), &s)
	if err != nil {
		t.Fatal(err)
	}
	assertErr(t, d.Errorf("items[1].address", "%q is no address", "bad"), "g.yaml:4:14: items[1].address: \"bad\" is no address")
	// Absent field: positioned at the nearest ancestor.
	assertErr(t, d.Errorf("items[1].every", "missing"), "g.yaml:4:5: items[1].every: missing")
	assertErr(t, d.Locate(fmt.Errorf("items[0].address: %s", "wrong")), "g.yaml:3:14: items[0].address: wrong")
	assertErr(t, d.Locate(errors.New("needs at least one item")), "g.yaml:1:1: needs at least one item")
	sub := d.Sub("items[1]")
	if sub == nil {
		t.Fatal("Sub(items[1]) = nil")
	}
	assertErr(t, sub.Errorf("address", "no"), "g.yaml:4:14: items[1].address: no")
	if d.Sub("nested") != nil {
		t.Fatal("Sub of an absent section is not nil")
	}
}

func TestEmpty(t *testing.T) {
	var s sample
	d, err := Parse("e.yaml", []byte("# only a comment\n"), &s)
	if err != nil || !d.Empty() {
		t.Fatalf("empty doc: %v %v", d, err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	var s sample
	if _, err := Load("/nonexistent/x.yaml", &s); err == nil || !strings.Contains(err.Error(), "/nonexistent/x.yaml") {
		t.Fatalf("missing file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"name: a\n", "items:\n  - address: x\n", "lease: 1s\nlog_level: warn\n", "a: &x {b: 1}\nc: *x\n", "[", "map: {k: {address: 1}}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s sample
		d, err := Parse("fuzz.yaml", b, &s)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %T %v is not positioned", err, err)
			}
			return
		}
		_ = d.Locate(errors.New("items[0].address: x"))
	})
}

func TestSame(t *testing.T) {
	parse := func(src string) *Doc {
		var v struct {
			Section Node `yaml:"section"`
		}
		d, err := Parse("f.yaml", []byte(src), &v)
		if err != nil {
			t.Fatal(err)
		}
		return NewDoc(d.File(), "section", &v.Section)
	}
	a := parse("section: {a: 1, b: [x, y]}\n")
	b := parse("# moved and commented\n\nsection:\n  a: 1   # same\n  b: [x, y]\n")
	c := parse("section: {a: 2, b: [x, y]}\n")
	if !a.Same(b) || a.Same(c) || !(*Doc)(nil).Same(nil) || a.Same(nil) {
		t.Fatalf("Same: a~b %v a~c %v", a.Same(b), a.Same(c))
	}
}

// The library's own words never reach the user: every type error of a
// field says what the field wants.
func TestTypeErrorsInOurWords(t *testing.T) {
	for _, src := range []string{"count: x\n", "items: 1\n", "nested: [1]\n", "small: -1\n", "flag: 2\n", "lease: [1]\n", "map: 1\n"} {
		var s sample
		_, err := Parse("f.yaml", []byte(src), &s)
		if err == nil {
			t.Errorf("%q: no error", src)
			continue
		}
		for _, leak := range []string{"!!", "unmarshal", "cannot use", "config.", "[]config"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%q: error %q shows the YAML library's %q", src, err, leak)
			}
		}
	}
}

// The YAML library truncates a number with a fraction into a whole-number
// field (1.5 -> 1); the config layer refuses it at its line instead. A
// whole number written as such, and a float field, still take it.
func TestFractionForWholeNumber(t *testing.T) {
	for src, want := range map[string]string{
		"count: 1.5\n":                        "f.yaml:1:8: count: want a whole number, got the number 1.5",
		"name: x\nsmall: 2.0\n":               "f.yaml:2:8: small: want a whole number 0..65535, got the number 2.0",
		"count: 1e3\n":                        "count: want a whole number, got the number 1e3",
		"map: {a: {address: x}}\ncount: .5\n": "f.yaml:2:8: count",
	} {
		var s sample
		if _, err := Parse("f.yaml", []byte(src), &s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", src, err, want)
		}
	}
	var s sample
	if _, err := Parse("f.yaml", []byte("count: 3\nsmall: 0x10\n"), &s); err != nil || s.Count != 3 || s.Small != 16 {
		t.Errorf("whole numbers: %+v, %v", s, err)
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	parse := func(s string) (string, error) {
		if s != "GOODKEY" {
			return "", fmt.Errorf("key decodes to %d bytes, want 7", len(s))
		}
		return s, nil
	}
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // umask aside
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string // "" = accepted
	}{
		{"ok", "GOODKEY\n", 0o600, ""},
		{"readonly", "GOODKEY", 0o400, ""},
		{"world", "GOODKEY\n", 0o644, "readable or writable by group or others (mode 0644); run: chmod 600 " + filepath.Join(dir, "world")},
		{"group", "GOODKEY\n", 0o640, "(mode 0640); run: chmod 600 " + filepath.Join(dir, "group")},
		{"groupwrite", "GOODKEY\n", 0o620, "(mode 0620)"},
		{"empty", "\n", 0o600, filepath.Join(dir, "empty") + " is empty; create a key with"},
		{"bad", "nonsense\n", 0o600, filepath.Join(dir, "bad") + " does not hold a valid private key (key decodes to 8 bytes, want 7)"},
	} {
		p := write(tc.name, tc.content, tc.mode)
		k, err := ReadKeyFile(p, parse)
		switch {
		case tc.want == "" && (err != nil || k != "GOODKEY"):
			t.Errorf("%s: %q, %v; want the key", tc.name, k, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "missing"), parse); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "missing")) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := ReadKeyFile(dir, parse); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
}
