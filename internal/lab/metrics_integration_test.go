package lab

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// checkNoTCPMetrics asserts that every node of l has
// net.ipv4.tcp_no_metrics_save=1 and that a TCP transfer from client to
// server leaves no entry in either side's TCP metrics cache (a cached
// RTT would seed the next measurement's connection to the same
// address). As a control, the client is then switched to save metrics
// and the same transfer must leave an entry there: the check can see one.
func checkNoTCPMetrics(t *testing.T, l *Lab) {
	t.Helper()
	for _, n := range l.Nodes() {
		if v := strings.TrimSpace(run(t, l, n, "cat", "/proc/sys/net/ipv4/tcp_no_metrics_save")); v != "1" {
			t.Errorf("%s: net.ipv4.tcp_no_metrics_save = %q, want 1", n, v)
		}
	}
	server := l.Addr("server").String()
	transfer := func() {
		t.Helper()
		var ln net.Listener
		if err := l.Do("server", func() (err error) { ln, err = net.Listen("tcp4", server+":0"); return }); err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		got := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				_, err = io.Copy(io.Discard, c)
				c.Close()
			}
			got <- err
		}()
		var c net.Conn
		if err := l.Do("client", func() (err error) { c, err = net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second); return }); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		c.Close()
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the transfer did not end")
		}
	}
	metrics := func(node string) string {
		return strings.TrimSpace(run(t, l, node, "ip", "tcp_metrics", "show"))
	}
	transfer()
	// Both ends have closed (the server read EOF and closed); the kernel
	// updates the cache as each socket leaves the connection, and a
	// short wait covers the server's LAST_ACK.
	time.Sleep(200 * time.Millisecond)
	for _, n := range []string{"client", "server"} {
		if m := metrics(n); m != "" {
			t.Errorf("%s: TCP metrics cached after a transfer:\n%s", n, m)
		}
	}
	run(t, l, "client", "sh", "-c", "echo 0 > /proc/sys/net/ipv4/tcp_no_metrics_save")
	transfer()
	deadline := time.Now().Add(5 * time.Second)
	for metrics("client") == "" {
		if time.Now().After(deadline) {
			t.Fatal("control: with tcp_no_metrics_save=0 the client cached nothing; the check above proves nothing")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
