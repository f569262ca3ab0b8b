package scenario

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/mpdetour/mpdetour/lab/scenarios"
)

// maxFileSize bounds what Load reads: scenario files are small.
const maxFileSize = 1 << 20

// Builtins lists the built-in scenario names.
func Builtins() []string {
	ents, _ := fs.ReadDir(scenarios.FS, ".")
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// Builtin returns the named built-in scenario.
func Builtin(name string) (*Scenario, error) {
	if !FileSafe(name) {
		return nil, fmt.Errorf("no built-in scenario %q (built-in: %s)", name, strings.Join(Builtins(), ", "))
	}
	b, err := scenarios.FS.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("no built-in scenario %q (built-in: %s)", name, strings.Join(Builtins(), ", "))
	}
	return Parse("builtin:"+name, b)
}

// Load reads a scenario file, or a built-in scenario when arg names no
// file and contains no '/'.
func Load(arg string) (*Scenario, error) {
	f, err := os.Open(arg)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !strings.ContainsAny(arg, "/.") {
			return Builtin(arg)
		}
		return nil, fmt.Errorf("scenario %s: %w", arg, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", arg, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("scenario %s: is a directory", arg)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", arg, err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("scenario %s: larger than %d bytes", arg, maxFileSize)
	}
	return Parse(arg, b)
}
