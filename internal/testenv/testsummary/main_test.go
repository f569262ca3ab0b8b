package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"    a_test.go:1: noise of a passing test\n"}
{"Action":"pass","Package":"p","Test":"TestOK"}
{"Action":"run","Package":"p","Test":"TestBad"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"    a_test.go:9: wrong answer\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBad"}
{"Action":"run","Package":"p","Test":"TestTool"}
{"Action":"output","Package":"p","Test":"TestTool","Output":"=== RUN   TestTool\n"}
{"Action":"output","Package":"p","Test":"TestTool","Output":"    a_test.go:20: prerequisite missing: systemd-analyze not installed (run scripts/setup.sh)\n"}
{"Action":"output","Package":"p","Test":"TestTool","Output":"--- SKIP: TestTool (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestTool"}
{"Action":"run","Package":"p","Test":"TestMeasure"}
{"Action":"output","Package":"p","Test":"TestMeasure","Output":"    a_test.go:30: measurement: set X=DIR\n"}
{"Action":"skip","Package":"p","Test":"TestMeasure"}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}
{"ImportPath":"q [q.test]","Action":"build-output","Output":"q/x.go:1:1: syntax error\n"}
not json: passed through
`

func TestSummary(t *testing.T) {
	var s summary
	var w bytes.Buffer
	if err := s.read(strings.NewReader(sample), &w); err != nil {
		t.Fatal(err)
	}
	bad := s.report(&w, true)
	out := w.String()
	for _, want := range []string{
		"a_test.go:9: wrong answer\n--- FAIL: TestBad", "FAIL\tp\t0.01s", "q/x.go:1:1: syntax error", "not json: passed through",
		"skipped tests (2):\n  p TestMeasure: a_test.go:30: measurement: set X=DIR\n  p TestTool: a_test.go:20: prerequisite missing: systemd-analyze not installed (run scripts/setup.sh)  [missing prerequisite]\n",
		"CI=true: p TestTool skipped for a missing prerequisite",
		"tests: 1 passed, 1 failed, 2 skipped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{"noise of a passing test", "=== RUN", "PASS\n"} {
		if strings.Contains(out, not) {
			t.Errorf("output has %q:\n%s", not, out)
		}
	}
	if len(bad) != 1 || bad[0].test != "TestTool" {
		t.Errorf("CI refuses %v, want TestTool only", bad)
	}
	var s2 summary
	s2.read(strings.NewReader(sample), &bytes.Buffer{})
	if bad := s2.report(&bytes.Buffer{}, false); len(bad) != 0 {
		t.Errorf("outside CI, skips are listed, not refused: %v", bad)
	}
}
