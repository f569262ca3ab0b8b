package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// proc is a process of the real binary started by startIn.
type proc struct {
	cmd    *exec.Cmd
	logs   *syncBuf
	exited <-chan struct{}
}

func startProc(t *testing.T, bin string, ns *netnstest.NS, args ...string) *proc {
	t.Helper()
	cmd, logs, exited := startIn(t, bin, ns, args...)
	return &proc{cmd, logs, exited}
}

// stop ends the process with SIGTERM (startIn's cleanup kills a hung one).
func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// TestClientSaysWhatIsWrong (issue 29 item 2, on the real binaries): one
// agent with three relays, a right one, one whose public key is wrong in
// the agent's config and one on a port where nothing listens; then the
// relay drops the member (SIGHUP); then an agent whose key the relay does
// not list. Each relay's state in `status --json`, the text and the log.
func TestClientSaysWhatIsWrong(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "nft")
	dir := t.TempDir()
	bin := mpdetourBin(t)
	cl, rl := netnstest.New(t, "csw"), netnstest.New(t, "csr")
	netnstest.Link(t, cl, "10.93.0.1/24", rl, "10.93.0.2/24")
	relayKey, _ := proto.GenerateKey()
	member, _ := proto.GenerateKey()
	stranger, _ := proto.GenerateKey()
	other, _ := proto.GenerateKey()
	relayCfg := filepath.Join(dir, "relay.yaml")
	writeRelay := func(members string) {
		os.WriteFile(relayCfg, []byte(fmt.Sprintf("listen: 10.93.0.2:45673\nprivate_key: %s\nports: 30000-30999\nlease: 1m\nmembers:\n%s", relayKey, members)), 0o600)
	}
	writeRelay(fmt.Sprintf("  - {name: alice, public_key: %s}\n  - {name: carol, public_key: %s}\n", member.Public(), other.Public()))
	relay := startProc(t, bin, rl, "relay", "--config", relayCfg)
	time.Sleep(500 * time.Millisecond)

	agentRun := func(key proto.Key) (string, *proc) {
		sock := filepath.Join(t.TempDir(), "agent.sock")
		cfg := filepath.Join(dir, "agent.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf(`socket: %s
subflow_lowat: 0
relay_ping: 1s
relays:
  key: %s
  servers:
    - {name: good, address: 10.93.0.2:45673, public_key: %s}
    - {name: wrongkey, address: 10.93.0.2:45673, public_key: %s}
    - {name: closed, address: 10.93.0.2:45999, public_key: %s}
`, sock, key, relayKey.Public(), other.Public(), relayKey.Public())), 0o600)
		return sock, startProc(t, bin, cl, "agent", "--config", cfg)
	}
	states := func(sock string) (map[string]agent.RelayStatus, error) {
		out, err := exec.Command(bin, "status", "--json", "--socket", sock).Output()
		if err != nil {
			return nil, err
		}
		var st agent.Status
		if err := json.Unmarshal(out, &st); err != nil {
			return nil, err
		}
		m := map[string]agent.RelayStatus{}
		for _, r := range st.Relays {
			m[r.Name] = r
		}
		return m, nil
	}
	waitStates := func(sock string, want map[string]string, ag *proc) map[string]agent.RelayStatus {
		t.Helper()
		var got map[string]agent.RelayStatus
		var err error
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got, err = states(sock)
			ok := err == nil
			for name, s := range want {
				ok = ok && got[name].State == s
			}
			if ok {
				return got
			}
		}
		t.Fatalf("relay states %+v (err %v), want %v\nagent log:\n%s\nrelay log:\n%s", got, err, want, ag.logs.String(), relay.logs.String())
		return nil
	}

	sock, ag := agentRun(member)
	got := waitStates(sock, map[string]string{"good": agent.RelayOK, "wrongkey": agent.RelayNoAnswer, "closed": agent.RelayNoAnswer}, ag)
	if got["good"].LastSuccess.IsZero() || !strings.Contains(got["closed"].Detail, "UDP port") || !strings.Contains(got["wrongkey"].Detail, "public_key") {
		t.Fatalf("details: %+v", got)
	}
	text, _ := exec.Command(bin, "status", "--socket", sock).CombinedOutput()
	if !strings.Contains(string(text), "RELAY") || !strings.Contains(string(text), "closed: no-answer:") {
		t.Fatalf("status text:\n%s", text)
	}
	// The member is removed from the relay: revoked.
	writeRelay(fmt.Sprintf("  - {name: carol, public_key: %s}\n", other.Public()))
	relay.cmd.Process.Signal(syscall.SIGHUP)
	waitStates(sock, map[string]string{"good": agent.RelayRevoked}, ag)
	// The agent logs a change as it makes it, but its stderr reaches
	// ag.logs through a pipe: the status can show the change first.
	for _, want := range []string{"relay trouble", "state=no-answer", "state=revoked"} {
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(ag.logs.String(), want) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(ag.logs.String(), want) {
			t.Errorf("agent log lacks %q:\n%s", want, ag.logs.String())
		}
	}
	ag.stop()
	// A key the relay never listed: unauthorized.
	sock, ag = agentRun(stranger)
	waitStates(sock, map[string]string{"good": agent.RelayUnauthorized}, ag)
}
