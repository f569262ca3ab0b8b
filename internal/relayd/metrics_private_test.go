package relayd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 28, break 9: the relay's metrics (member names, bytes per member)
// can listen on a unix socket of mode 0600 or require a bearer token.
func TestMetricsPrivateConfig(t *testing.T) {
	good := "private_key: " + testKey(t).String() + "\nmembers:\n  - {name: a, public_key: " + testKey(t).Public().String() + "}\n"
	s, err := ParseConfig([]byte(good + "metrics: {listen: 'unix:/run/mpdetour/relay-metrics.sock'}\n"))
	if err != nil || s.MetricsListen != "unix:/run/mpdetour/relay-metrics.sock" {
		t.Fatalf("unix listen: %+v %v", s, err)
	}
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("0123456789abcdefXYZ\n"), 0o640)
	s, err = ParseConfig([]byte(good + "metrics: {listen: 127.0.0.1:9464, token_file: " + tok + "}\n"))
	if err != nil || s.MetricsToken != "0123456789abcdefXYZ" {
		t.Fatalf("token: %+v %v", s, err)
	}
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte("0123456789abcdefXYZ\n"), 0o644)
	os.Chmod(open, 0o644)
	for in, want := range map[string]string{
		"metrics: {listen: 'unix:rel.sock'}\n":                          "metrics.listen",
		"metrics: {token_file: " + tok + "}\n":                          "metrics.token_file: set without metrics.listen",
		"metrics: {listen: 127.0.0.1:9464, token_file: " + open + "}\n": "chmod 0640",
	} {
		if _, err := ParseConfig([]byte(good + in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}
