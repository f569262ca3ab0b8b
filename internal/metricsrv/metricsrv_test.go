package metricsrv

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:9465", "[::1]:9465", "unix:/run/mpdetour/m.sock"} {
		if err := Check(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"localhost:9465", "unix:rel.sock", "9465"} {
		if err := Check(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// A unix endpoint is root's alone.
func TestListenUnixPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.sock")
	l, err := Listen(UnixPrefix + path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v, want 0600", fi.Mode())
	}
	if _, err := Listen(UnixPrefix + path); err == nil {
		t.Fatal("a second listener on a live socket")
	}
	if Exposed(UnixPrefix+path, "") != "" || Exposed("127.0.0.1:9465", "x") != "" || Exposed("127.0.0.1:9465", "") == "" {
		t.Fatal("Exposed")
	}
}

func TestProtect(t *testing.T) {
	h := Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("series")) }), "0123456789abcdef")
	for _, tc := range []struct {
		auth string
		code int
	}{{"", 401}, {"Bearer wrong", 401}, {"Bearer 0123456789abcdeF", 401}, {"Bearer 0123456789abcdef", 200}} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/metrics", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		h.ServeHTTP(rec, req)
		if rec.Code != tc.code || (tc.code == 401) == strings.Contains(rec.Body.String(), "series") {
			t.Errorf("%q: %d %q, want %d", tc.auth, rec.Code, rec.Body.String(), tc.code)
		}
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	if tok, err := ReadToken(write("ok", "0123456789abcdefXYZ\n", 0o640)); err != nil || tok != "0123456789abcdefXYZ" {
		t.Fatalf("%q %v", tok, err)
	}
	if _, err := ReadToken(write("world", "0123456789abcdefXYZ\n", 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 0640") {
		t.Errorf("world-readable: %v", err)
	}
	if _, err := ReadToken(write("short", "abc\n", 0o600)); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("short: %v", err)
	}
	if _, err := ReadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}
