package detourtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/agenttest"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"golang.org/x/sys/unix"
)

var mpdetour string

func TestMain(m *testing.M) {
	lab.Reexec()
	dir, err := os.MkdirTemp("", "tu-detourtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if mpdetour, err = testenv.BuildMpdetour(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Detached supervisors are re-parented here; reapZombies collects them.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	labtest.DownOnInterrupt() // the labs this process built go with it on Ctrl-C or SIGTERM
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// reapZombies waits for every supervisor re-parented to this process to
// exit by itself, and reaps it.
func reapZombies(t *testing.T) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		alive := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			i := bytes.LastIndexByte(st, ')')
			if err != nil || i < 0 {
				continue
			}
			f := strings.Fields(string(st[i+1:]))
			if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
				continue
			}
			if f[0] == "Z" {
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WNOHANG, nil)
				continue
			}
			if cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); bytes.HasPrefix(cl, []byte("mpdetour-run-supervisor\x00")) {
				alive++
				if time.Now().After(deadline) {
					unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if alive == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d supervisors still running after their programs ended", alive)
			deadline = deadline.Add(time.Hour)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Unmodified iperf3 on both ends, started with "mpdetour run", while the
// agent runs in the client's namespace with one static NAT detour: the
// kernel shows a subflow of iperf3's connection going through the detour
// and carrying data.
func TestRunWithAgentGetsDetourSubflow(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "nft", "ip", "iperf3")
	t.Cleanup(func() { reapZombies(t) })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	l := labtest.UpDetours(ctx, t, fmt.Sprintf("tu%de", os.Getpid()), 1)
	cancel()
	server := netip.AddrPortFrom(l.Addr("server"), 5201)
	relay := netip.AddrPortFrom(l.Addr("detour1"), 4000)
	in := func(node string, argv ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", l.NetnsName(node)}, argv...)...)
	}
	must := func(cmd *exec.Cmd) {
		t.Helper()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", cmd.Args, err, out)
		}
	}
	// The detour: relay:4000 is DNATed to the server and masqueraded.
	nft := in("detour1", "nft", "-f", "-")
	nft.Stdin = strings.NewReader(fmt.Sprintf(`table ip tunat {
	chain pre { type nat hook prerouting priority -100; tcp dport 4000 dnat to %s; }
	chain post { type nat hook postrouting priority 100; ip daddr %s tcp dport %d masquerade; }
}`, server, server.Addr(), server.Port()))
	must(nft)
	must(in("server", "ip", "mptcp", "limits", "set", "subflows", "8"))

	cfg := agent.DefaultOptions()
	cfg.Subflows, cfg.Backoff = 1, 300*time.Millisecond
	cfg.NetNS = l.NetnsName("client")
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	detours := static.New([]static.Entry{{
		Detour:  detour.Detour{Kind: detour.NAT, Relay: "d1", Remote: relay},
		Servers: []netip.Prefix{netip.PrefixFrom(server.Addr(), 32)}, Port: server.Port(),
	}})
	a := agenttest.Start(context.Background(), t, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), detours)
	t.Cleanup(func() { a.Stop(t) })

	srv := in("server", mpdetour, "run", "--", "iperf3", "-s", "-1", "-B", server.Addr().String(), "-p", "5201")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _ := in("server", "ss", "-HMln", "sport", "=", ":5201").Output()
		if len(bytes.TrimSpace(out)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no MPTCP listener on the server")
		}
	}
	cl := in("client", mpdetour, "run", "--", "iperf3", "-c", server.Addr().String(), "-p", "5201", "-t", "4", "-J")
	var stdout bytes.Buffer
	cl.Stdout = &stdout
	if err := cl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Process.Kill(); cl.Wait() })

	var found *mptcppm.Subflow
	var last []mptcppm.Connection
	var err error
	for deadline := time.Now().Add(10 * time.Second); found == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if last, err = mptcppm.Dump(mptcppm.Options{NetNS: l.NetnsName("client")}); err != nil {
			t.Fatal(err)
		}
		for _, c := range last {
			for i, s := range c.Subflows {
				if c.Remote == server && s.Remote == relay && s.BytesSent > 0 {
					found = &c.Subflows[i]
				}
			}
		}
	}
	if found == nil {
		t.Fatalf("no subflow via the detour %s carrying data; connections: %+v", relay, last)
	}
	if err := cl.Wait(); err != nil {
		t.Fatalf("iperf3 client: %v %s", err, stdout.String())
	}
	var res struct {
		End struct {
			SumReceived struct {
				Bps float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || res.End.SumReceived.Bps <= 0 {
		t.Fatalf("iperf3 result: %v %s", err, stdout.String())
	}
	t.Logf("detour subflow %s -> %s sent %d bytes; iperf3 %.0f Mbit/s", found.Local, found.Remote, found.BytesSent, res.End.SumReceived.Bps/1e6)
}
