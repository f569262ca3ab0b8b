// Package metricsrv opens the daemons' Prometheus endpoints so that they are
// not readable by every local user (docs/security.md,
// "Metrics"): an endpoint listens on a TCP address (loopback, for
// Prometheus) with an optional bearer token, or on a unix socket of mode
// 0600 (root's tools, a local proxy).
package metricsrv

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// UnixPrefix marks a unix socket path in a listen setting.
const UnixPrefix = "unix:"

// Check validates a listen setting: ADDRESS:PORT or unix:/ABSOLUTE/PATH.
func Check(listen string) error {
	if path, ok := strings.CutPrefix(listen, UnixPrefix); ok {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("%q: the unix socket path must be absolute (e.g. unix:/run/mpdetour/agent-metrics.sock)", listen)
		}
		return nil
	}
	if _, err := netip.ParseAddrPort(listen); err != nil {
		return fmt.Errorf("%q is not ADDRESS:PORT (e.g. 127.0.0.1:9465) or unix:/PATH", listen)
	}
	return nil
}

// Listen opens the endpoint's listener: a unix socket is created with mode
// 0600 (a stale socket file is replaced; a live one refused).
func Listen(listen string) (net.Listener, error) {
	path, ok := strings.CutPrefix(listen, UnixPrefix)
	if !ok {
		return net.Listen("tcp", listen)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s: another process serves it", path)
	}
	_ = os.Remove(path)
	// The socket is created with the umask's mode: open it under a
	// private one so that it is never readable by others, even briefly.
	l, err := listenPrivate(path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// ReadToken reads a bearer token file: one line, at least 16 characters,
// not readable by others than its owner and group (it is a secret).
func ReadToken(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return "", fmt.Errorf("%s is readable by every user (mode %04o): chmod 0640 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%s: the token must be one word of at least 16 characters (e.g. head -c 24 /dev/urandom | base64 > %s)", path, path)
	}
	return tok, nil
}

// Protect answers 401 to requests without "Authorization: Bearer TOKEN"
// (token "" serves h as it is).
func Protect(h http.Handler, token string) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mpdetour metrics"`)
			http.Error(w, "metrics: bearer token required (the daemon's metrics.token_file)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Exposed says why an endpoint without a token is readable by other local
// users ("" when it is not: a unix socket, or a token is set).
func Exposed(listen, token string) string {
	if token != "" || strings.HasPrefix(listen, UnixPrefix) {
		return ""
	}
	return "metrics on " + listen + " are readable by every local user (and beyond loopback by the network): set metrics.token_file, or listen on unix:/PATH (docs/security.md, Metrics)"
}
