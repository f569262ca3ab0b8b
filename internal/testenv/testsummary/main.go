// Command testsummary runs `go test -json ...` (the command after "--") and
// prints what a plain `go test` prints (package results, the output of
// failed tests, build errors), then the list of skipped tests with their
// reasons and a closing "tests: N passed, N failed, N skipped" line. With
// CI=true it fails when a test skipped because a tool or prerequisite was
// missing: scripts/setup.sh installs what the tests need, so such a skip is
// a missing install step, not a pass.
//
//	go run ./internal/testenv/testsummary -- go test -json ./...
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// event is one line of test2json (go doc test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

// missingTool matches skip reasons that mean "this machine lacks something
// setup installs" (testenv's "prerequisite missing", exec's "executable
// file not found", ...).
var missingTool = regexp.MustCompile(`(?i)not installed|executable file not found|command not found|prerequisite missing|unavailable|not available`)

type skip struct{ pkg, test, reason string }

// summary consumes test2json lines from r, writes the plain output to w and
// returns the counts and the skips.
type summary struct {
	passed, failed int
	skips          []skip
	buf            map[string][]string // package + test -> output lines
}

func (s *summary) read(r io.Reader, w io.Writer) error {
	s.buf = map[string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Test == "":
			if e.Action == "output" && e.Output != "PASS\n" {
				fmt.Fprint(w, e.Output)
			}
		case e.Action == "output":
			s.buf[key] = append(s.buf[key], e.Output)
		case e.Action == "pass":
			s.passed++
			delete(s.buf, key)
		case e.Action == "fail":
			s.failed++
			for _, l := range s.buf[key] {
				if !strings.HasPrefix(l, "=== ") {
					fmt.Fprint(w, l)
				}
			}
			delete(s.buf, key)
		case e.Action == "skip":
			var why []string
			for _, l := range s.buf[key] {
				l = strings.TrimSpace(l)
				if l != "" && !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(l, "--- SKIP") {
					why = append(why, l)
				}
			}
			s.skips = append(s.skips, skip{e.Package, e.Test, strings.Join(why, " | ")})
			delete(s.buf, key)
		}
	}
	return sc.Err()
}

// report prints the skips and the closing line; it returns the skips that
// CI must not accept.
func (s *summary) report(w io.Writer, ci bool) []skip {
	sort.Slice(s.skips, func(i, j int) bool {
		return s.skips[i].pkg+" "+s.skips[i].test < s.skips[j].pkg+" "+s.skips[j].test
	})
	var bad []skip
	if len(s.skips) > 0 {
		fmt.Fprintf(w, "skipped tests (%d):\n", len(s.skips))
		for _, k := range s.skips {
			mark := ""
			if missingTool.MatchString(k.reason) {
				bad = append(bad, k)
				mark = "  [missing prerequisite]"
			}
			fmt.Fprintf(w, "  %s %s: %s%s\n", k.pkg, k.test, k.reason, mark)
		}
	}
	if !ci {
		bad = nil
	}
	for _, k := range bad {
		fmt.Fprintf(w, "CI=true: %s %s skipped for a missing prerequisite (%s): scripts/setup.sh must install it\n", k.pkg, k.test, k.reason)
	}
	fmt.Fprintf(w, "tests: %d passed, %d failed, %d skipped\n", s.passed, s.failed, len(s.skips))
	return bad
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testsummary -- go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	var s summary
	readErr := s.read(out, os.Stdout)
	runErr := cmd.Wait()
	bad := s.report(os.Stdout, os.Getenv("CI") == "true")
	var ee *exec.ExitError
	switch {
	case errors.As(runErr, &ee):
		os.Exit(ee.ExitCode())
	case runErr != nil:
		fmt.Fprintln(os.Stderr, "testsummary:", runErr)
		os.Exit(1)
	case readErr != nil:
		fmt.Fprintln(os.Stderr, "testsummary: reading go test's output:", readErr)
		os.Exit(1)
	case len(bad) > 0:
		os.Exit(1)
	}
}
