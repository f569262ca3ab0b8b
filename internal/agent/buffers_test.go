package agent_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// writeNSState writes the state file PREFIX.INODE a crashed agent would
// have left in dir for namespace ns.
func writeNSState(t *testing.T, ns *netnstest.NS, dir, prefix, data string) {
	t.Helper()
	var st syscall.Stat_t
	if err := ns.Do(func() error { return syscall.Stat("/proc/thread-self/ns/net", &st) }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s.%d", prefix, st.Ino)), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func bufferMax(t *testing.T, ns *netnstest.NS, name string) string {
	t.Helper()
	var v string
	if err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
		v = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// buffer_sizing: with a connection measured at 200 Mbit/s over paths whose
// largest RTT is 200 ms (2 x 25 MB/s x 0.2 s = 10 MB), the agent raises
// tcp_rmem/tcp_wmem's maximum in its namespace (kernel default 6 MiB and
// 4 MiB), keeps min and default, and puts back what it found when it
// stops; a state file left by an agent that did not stop makes the next
// one restore the originals first. The kernel is the fake; the sysctls are
// a real namespace's.
func TestAgentBufferSizingRaisesAndRestores(t *testing.T) {
	testenv.MPTCP(t)
	ns := netnstest.New(t, "bsz")
	// The kernel's own defaults (a host may have raised its own).
	for k, v := range map[string]string{"net/ipv4/tcp_rmem": "4096 131072 6291456", "net/ipv4/tcp_wmem": "4096 16384 4194304"} {
		if err := ns.Sysctl(k, v); err != nil {
			t.Fatal(err)
		}
	}
	rmem, wmem := bufferMax(t, ns, "tcp_rmem"), bufferMax(t, ns, "tcp_wmem")
	dir := t.TempDir()
	cfg := agent.Options{NetNS: ns.Name, Socket: filepath.Join(dir, "agent.sock"), Subflows: 1, MaxConnections: 10,
		CommandWorkers: 1, Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: policy.Static, BufferSizing: true}
	h := run(t, cfg, static.New([]static.Entry{natDetour("r1", relay1)}))
	h.connect(3)
	sub := netip.AddrPortFrom(client.Addr(), 50003)
	h.wait(0, "create via r1", creates(relay1))
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 3, Local: sub, Remote: relay1})
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	raised := ""
	for time.Now().Before(deadline) {
		n := uint64(time.Since(start).Seconds() * 12.5e6) // 100 Mbit/s on each path
		h.k.SetSubflows([]mptcppm.Subflow{
			{Token: 3, Local: client, Remote: server, State: 1, RTT: 50 * time.Millisecond, BytesAcked: n},
			{Token: 3, Local: sub, Remote: relay1, State: 1, RTT: 200 * time.Millisecond, BytesAcked: n},
		})
		time.Sleep(20 * time.Millisecond)
		if v := bufferMax(t, ns, "tcp_rmem"); v != rmem {
			raised = v
			break
		}
	}
	f := strings.Fields(raised)
	if len(f) != 3 || f[0]+" "+f[1] != strings.Join(strings.Fields(rmem)[:2], " ") {
		t.Fatalf("tcp_rmem %q (was %q): not raised, or min/default changed", raised, rmem)
	}
	t.Logf("tcp_rmem %q -> %q", rmem, raised)
	var max int64
	fmt.Sscan(f[2], &max)
	if max < 6<<20 || max > 64<<20 {
		t.Fatalf("tcp_rmem max %d, want between the default and 64 MiB (about 10 MB)", max)
	}
	if w := bufferMax(t, ns, "tcp_wmem"); w == wmem {
		t.Fatalf("tcp_wmem not raised: %q", w)
	}
	// The status shows it (the loop updates it after the write: poll).
	var bs *agent.BufferStatus
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if bs = h.a.Status().BufferSizing; bs != nil && bs.Max > 0 {
			break
		}
	}
	if bs == nil || bs.State != "on" || bs.Max < max || bs.Changes < 1 || bs.Found["net.ipv4.tcp_rmem"] != strings.Join(strings.Fields(rmem), " ") || bs.Found["net.ipv4.tcp_wmem"] != strings.Join(strings.Fields(wmem), " ") {
		t.Fatalf("status buffer_sizing %+v, want on, max >= %d, found %q / %q", bs, max, rmem, wmem)
	}
	h.stop()
	if r, w := bufferMax(t, ns, "tcp_rmem"), bufferMax(t, ns, "tcp_wmem"); r != rmem || w != wmem {
		t.Fatalf("after stop tcp_rmem %q tcp_wmem %q, want %q %q back", r, w, rmem, wmem)
	}
	states, _ := filepath.Glob(filepath.Join(dir, "buffers.*"))
	if len(states) != 0 {
		t.Fatalf("state files left: %v", states)
	}

	// An agent killed with the buffers raised left its state file: the
	// next one restores the originals it names.
	if err := ns.Sysctl("net/ipv4/tcp_rmem", "4096 131072 16777216"); err != nil {
		t.Fatal(err)
	}
	writeNSState(t, ns, dir, "buffers", fmt.Sprintf("net.ipv4.tcp_rmem=%s\nnet.ipv4.tcp_wmem=%s\n", rmem, wmem))
	h2 := run(t, cfg)
	for range 100 {
		if bufferMax(t, ns, "tcp_rmem") == rmem {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := bufferMax(t, ns, "tcp_rmem"); r != rmem {
		t.Fatalf("after a crashed agent's state file: tcp_rmem %q, want the original %q", r, rmem)
	}
	h2.stop()
}
