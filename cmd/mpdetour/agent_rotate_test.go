package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// The agent binary rotates its member key on SIGHUP: it re-reads key_file
// and certificate_file and the relay (a process of the same binary) carries
// the NAT mapping of a running MPTCP connection over to the new key.
func TestAgentSIGHUPRotatesKey(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft")
	dir := t.TempDir()
	bin := mpdetourBin(t)
	c, r, v := netnstest.New(t, "mkrc"), netnstest.New(t, "mkrr"), netnstest.New(t, "mkrs")
	netnstest.LinkNamed(t, c, "r0", "192.0.2.2/24", r, "c0", "192.0.2.1/24")
	netnstest.LinkNamed(t, r, "s0", "203.0.113.1/24", v, "r0", "203.0.113.10/24")
	c.Route(t, "0.0.0.0/0", "192.0.2.1")
	v.Route(t, "192.0.2.0/24", "203.0.113.1")
	if err := r.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	v.Run("ip", "mptcp", "limits", "set", "subflows", "4")

	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	relayKey, _ := proto.GenerateKey()
	oldKey, _ := proto.GenerateKey()
	newKey, _ := proto.GenerateKey()
	now := time.Now()
	oldCert, _ := auth.Issue(oldKey.Public(), "alice", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	newCert, _ := auth.Issue(newKey.Public(), "alice", collective.RoleClient, now.Add(-time.Minute), now.Add(time.Hour))
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p+".tmp", []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	relayCfg := write("relay.yaml", fmt.Sprintf("listen: 192.0.2.1:45673\nprivate_key: %s\nports: 40000-40100\nmembers: []\ncollective: {authority: %s}\nallow_destinations: [203.0.113.10/32]\n",
		relayKey, auth.Public()))
	keyFile := write("member.key", oldKey.String())
	certFile := write("member.cert", oldCert.String())
	sock := filepath.Join(dir, "agent.sock")
	agentCfg := write("agent.yaml", fmt.Sprintf("socket: %s\nsubflow_lowat: 0\nsubflows: 1\nbackoff: 300ms\nrelays:\n  key_file: %s\n  certificate_file: %s\n  servers:\n    - {name: r1, address: '192.0.2.1:45673', public_key: %s}\n",
		sock, keyFile, certFile, relayKey.Public()))

	_, relayLogs, _ := startIn(t, bin, r, "relay", "--config", relayCfg)
	agentCmd, agentLogs, _ := startIn(t, bin, c, "agent", "--config", agentCfg)
	defer func() {
		if t.Failed() {
			t.Logf("relay log:\n%s\nagent log:\n%s", relayLogs.String(), agentLogs.String())
		}
	}()
	waitUntil := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitUntil("the agent's status socket", 10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })

	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := v.Listen(lc, "tcp4", "203.0.113.10:5201")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
	d := &net.Dialer{Timeout: 5 * time.Second}
	d.SetMultipathTCP(true)
	conn, err := c.Dial(d, "tcp4", "203.0.113.10:5201")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer netnstest.KeepWriting(conn)()

	holder := func() (key string, port string) {
		var st *relay.Status
		if err := r.Do(func() (err error) { st, err = relay.QueryStatus(3 * time.Second); return err }); err != nil {
			return "", ""
		}
		for _, m := range st.Members {
			for _, mp := range m.Mappings {
				if strings.HasPrefix(mp.Client, "192.0.2.2:") {
					return m.Key, mp.Client
				}
			}
		}
		return "", ""
	}
	var port string
	waitUntil("a mapping of the old key", 15*time.Second, func() bool {
		k, p := holder()
		port = p
		return k == oldKey.Public().String()
	})

	write("member.key", newKey.String())
	write("member.cert", newCert.String())
	if err := agentCmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil("the mapping to move to the new key", 10*time.Second, func() bool {
		k, p := holder()
		return k == newKey.Public().String() && p == port
	})
	waitUntil("the agent's log line", 5*time.Second, func() bool {
		return strings.Contains(agentLogs.String(), "member key rotated: every relay carried the detours over")
	})
	if agentCmd.ProcessState != nil {
		t.Fatal("the agent exited on SIGHUP")
	}
}

// An agent without relays (nothing to rotate) keeps running on SIGHUP:
// systemd's ExecReload sends it, and Go's default action would end the
// agent (a clean exit for systemd: no restart).
func TestAgentSIGHUPWithoutRelays(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip")
	dir := t.TempDir()
	bin := mpdetourBin(t)
	c := netnstest.New(t, "mkrh")
	sock := filepath.Join(dir, "agent.sock")
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte("socket: "+sock+"\nsubflow_lowat: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, logs, exited := startIn(t, bin, c, "agent", "--config", cfg)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status socket after 10 s; agent log:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 0; i < 2; i++ {
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	select {
	case <-exited:
		t.Fatalf("the agent exited on SIGHUP; log:\n%s", logs.String())
	case <-time.After(500 * time.Millisecond):
	}
	if n := strings.Count(logs.String(), "SIGHUP: no relays section"); n != 2 {
		t.Fatalf("%d log lines for 2 SIGHUPs; log:\n%s", n, logs.String())
	}
}

// startIn starts the mpdetour binary bin with args in namespace ns; it is
// stopped (SIGTERM, then SIGKILL after 10 s) when the test ends. exited is
// closed when the process has ended.
func startIn(t *testing.T, bin string, ns *netnstest.NS, args ...string) (cmd *exec.Cmd, logs *syncBuf, exited <-chan struct{}) {
	t.Helper()
	cmd = exec.Command("ip", append([]string{"netns", "exec", ns.Name, bin}, args...)...)
	logs = &syncBuf{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return cmd, logs, done
}

// syncBuf is a bytes.Buffer a process writes while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
