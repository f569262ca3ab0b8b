package tunnel

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

type helper struct {
	cmd    *exec.Cmd
	allocs map[string]netip.Prefix
}

func startHelper(t *testing.T, ns string, key wgtypes.Key, state string, restore bool, peers ...wgtypes.Key) *helper {
	t.Helper()
	var ps []string
	for _, p := range peers {
		ps = append(ps, p.String())
	}
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TW_HELPER=server", "TW_KEY="+key.String(), "TW_SUBNET="+tunSubnet.String(),
		fmt.Sprintf("TW_PORT=%d", relayPort), "TW_STATE="+state, "TW_PEERS="+strings.Join(ps, " "))
	if restore {
		cmd.Env = append(cmd.Env, "TW_RESTORE=1")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, allocs: map[string]netip.Prefix{}}
	t.Cleanup(func() { h.cmd.Process.Kill(); h.cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "alloc" {
			h.allocs[f[1]] = netip.MustParsePrefix(f[2])
		}
		if len(f) == 1 && f[0] == "ready" {
			go func() {
				for sc.Scan() {
				}
			}()
			return h
		}
	}
	cmd.Wait()
	t.Fatalf("relay helper exited before ready")
	return nil
}

// TestRelayCrashRestart: the relay process is killed (no cleanup) and
// started again with the same key and state file. The restart removes the
// crashed run's nftables table, the client keeps its address and the
// tunnel carries traffic again through WireGuard's own handshake retry,
// with no help from the client. SIGTERM then leaves nothing behind.
func TestRelayCrashRestart(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	relayKey, k1 := genKey(t), genKey(t)
	state := filepath.Join(t.TempDir(), "tunnel.json")
	h := startHelper(t, tp.relay, relayKey, state, true, k1.PublicKey())
	addr, ok := h.allocs[k1.PublicKey().String()]
	if !ok {
		t.Fatalf("helper allocated nothing: %v", h.allocs)
	}
	c1 := newClient(t, tp.c1, 0, k1, Allocation{Address: addr, Endpoint: tp.relayEndpoint(1), RelayKey: relayKey.PublicKey()})
	echo := echoServer(t, tp.server, serverAddr, false)
	if _, _, err := retryExchange(t, tp.c1, c1.Address(), echo, 10*time.Second); err != nil {
		t.Fatalf("before crash: %v", err)
	}

	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	if out := nsRun(t, tp.relay, "nft", "list", "tables"); !strings.Contains(out, TableName) {
		t.Fatalf("expected the crashed relay's table to remain (test premise), got:\n%s", out)
	}
	h = startHelper(t, tp.relay, relayKey, state, true) // peers come from the state file
	_, took, err := retryExchange(t, tp.c1, c1.Address(), echo, 40*time.Second)
	if err != nil {
		t.Fatalf("tunnel not restored after relay restart: %v", err)
	}
	t.Logf("tunnel restored %v after the relay restarted (WireGuard retry timer, client watchdog Reconnect)", took.Round(100*time.Millisecond))
	if c1.Address() != addr.Addr() {
		t.Errorf("client address changed to %s", c1.Address())
	}

	h.cmd.Process.Signal(syscall.SIGTERM)
	if err := h.cmd.Wait(); err != nil {
		t.Errorf("relay helper exit: %v", err)
	}
	c1.Close()
	assertClean(t, tp.relay)
	assertClean(t, tp.c1)
}
