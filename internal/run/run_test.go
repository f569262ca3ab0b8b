package run_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"golang.org/x/sys/unix"
)

// Binaries built once by TestMain: the mpdetour command (only main.go and
// run.go, so other commands' work in progress cannot break these tests) and
// the statically linked probe.
var (
	mpdetour  string
	sockprobe string
	// sockprobe386 is the same probe for i386 (compat syscalls).
	sockprobe386 string
	probePy      string
	buildErr     error
	python       = "python3"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tu-mptcpize-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildErr = build(dir)
	// Debian's interpreter, not a version manager's shim script in PATH
	// (slow, and not what the tests mean by "python3").
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		python = "/usr/bin/python3"
	}
	_ = os.Chmod(dir, 0o755) // TestUnprivileged runs the binaries as nobody
	// Supervisors are detached (their starter exits), so they are re-parented
	// to the nearest subreaper: this test process, which reaps and checks them.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func build(dir string) error {
	sockprobe = filepath.Join(dir, "sockprobe")
	sockprobe386 = filepath.Join(dir, "sockprobe386")
	var err error
	if probePy, err = filepath.Abs("testdata/probe.py"); err != nil {
		return err
	}
	if mpdetour, err = testenv.BuildMpdetour(dir); err != nil {
		return err
	}
	for _, b := range []struct{ out, arch string }{{sockprobe, "amd64"}, {sockprobe386, "386"}} {
		cmd := exec.Command("go", "build", "-o", b.out, "./testdata/sockprobe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+b.arch)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build sockprobe (%s): %v\n%s", b.arch, err, out)
		}
	}
	return nil
}

// setup gates an integration test and registers the supervisor check, which
// runs after every other cleanup of the test.
func setup(t *testing.T, tools ...string) {
	t.Helper()
	testenv.MPTCP(t)
	testenv.Tools(t, append([]string{"ip", "python3"}, tools...)...)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	t.Cleanup(func() { supervisorsGone(t) })
}

// newNS creates a network namespace with loopback up.
func newNS(t *testing.T) string {
	t.Helper()
	return netnstest.New(t, "tun").Name
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNS builds a command running argv in ns; with run set it goes through
// "mpdetour run" (extra holds run's flags).
func inNS(ns string, run bool, extra []string, argv ...string) *exec.Cmd {
	a := []string{"netns", "exec", ns}
	if run {
		a = append(a, mpdetour, "run")
		a = append(a, extra...)
		a = append(a, "--")
	}
	return exec.Command("ip", append(a, argv...)...)
}

// output runs cmd and returns stdout, failing the test on error.
func output(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(cmd.Args, " "), err, out, stderr.String())
	}
	return string(out)
}

func decode(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
}

// background starts cmd and kills it at cleanup.
func background(t *testing.T, cmd *exec.Cmd) *bufio.Reader {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return bufio.NewReader(stdout)
}

// mptcpCounters reads the MPTcpExt counters of a namespace.
func mptcpCounters(t *testing.T, ns string) map[string]uint64 {
	t.Helper()
	out := mustRun(t, "ip", "netns", "exec", ns, "cat", "/proc/net/netstat")
	var names []string
	res := map[string]uint64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "MPTcpExt:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			res[names[i]] = n
		}
	}
	if names == nil {
		t.Fatal("no MPTcpExt counters in /proc/net/netstat")
	}
	return res
}

// waitMPTCPListener waits until ss -M shows an MPTCP listener on port in ns:
// the kernel's own view that the server's socket is MPTCP.
func waitMPTCPListener(t *testing.T, ns string, port int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-HMln", "sport", "=", ":"+strconv.Itoa(port)).Output()
		if strings.TrimSpace(string(out)) != "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-Hltn").Output()
	t.Fatalf("no MPTCP listener on port %d in %s (TCP listeners: %s)", port, ns, out)
}

// supervisorsGone reaps every zombie child (orphans re-parented to us) and
// waits until no supervisor is left: each must exit by itself once the last
// process using its filter is gone.
func supervisorsGone(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		alive := reapAndListSupervisors()
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, pid := range alive {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(100 * time.Millisecond)
			reapAndListSupervisors()
			t.Errorf("supervisors %v still running after their programs ended", alive)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func reapAndListSupervisors() []int {
	me := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	var alive []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		i := bytes.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(me) {
			continue
		}
		if f[0] == "Z" {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.HasPrefix(cmdline, []byte("mpdetour-run-supervisor\x00")) {
			alive = append(alive, pid)
		}
	}
	return alive
}

type sock struct {
	Proto    int    `json:"proto"`
	Domain   int    `json:"domain"`
	Type     int    `json:"type"`
	NonBlock bool   `json:"nonblock"`
	CloExec  bool   `json:"cloexec"`
	Errno    string `json:"errno"`
}

// The static Go binary reports every socket it creates; without run it is
// plain TCP, with run every TCP stream socket is MPTCP with its flags kept,
// and UDP, Unix, explicit MPTCP and invalid calls are untouched.
func TestStaticGoBinarySockets(t *testing.T) {
	setup(t)
	ns := newNS(t)
	var base, conv map[string]sock
	decode(t, output(t, inNS(ns, false, nil, sockprobe, "report")), &base)
	decode(t, output(t, inNS(ns, true, nil, sockprobe, "report")), &conv)
	for _, k := range []string{"tcp4", "tcp6", "tcp4_ipproto", "tcp4_flags", "tcp6_cloexec", "tcp4_direct"} {
		if base[k].Proto != unix.IPPROTO_TCP {
			t.Errorf("%s without run: protocol %d, want 6", k, base[k].Proto)
		}
		if conv[k].Proto != unix.IPPROTO_MPTCP {
			t.Errorf("%s under run: protocol %d, want 262", k, conv[k].Proto)
		}
		if b, c := base[k], conv[k]; b.Domain != c.Domain || b.Type != c.Type || b.NonBlock != c.NonBlock || b.CloExec != c.CloExec {
			t.Errorf("%s: run changed the socket: %+v -> %+v", k, b, c)
		}
	}
	if !conv["tcp4_flags"].NonBlock || !conv["tcp4_flags"].CloExec || conv["tcp4"].CloExec || conv["tcp4"].NonBlock {
		t.Errorf("SOCK_NONBLOCK/SOCK_CLOEXEC not carried over: %+v %+v", conv["tcp4_flags"], conv["tcp4"])
	}
	for _, k := range []string{"udp4", "udp6", "udp4_direct", "unix_stream", "unix_dgram", "explicit_mptcp", "tcp4_badflag"} {
		if base[k] != conv[k] {
			t.Errorf("%s: run changed an untouched socket: %+v -> %+v", k, base[k], conv[k])
		}
	}
	if conv["tcp4_badflag"].Errno == "" {
		t.Errorf("socket() with an invalid type flag succeeded under run")
	}
}

// A static Go server and client under run talk MPTCP; ss -M shows the
// server's MPTCP listener and the kernel's MPTcpExt counters the handshake.
func TestStaticGoClientServer(t *testing.T) {
	setup(t, "ss")
	ns := newNS(t)
	srv := background(t, inNS(ns, true, nil, sockprobe, "serve", "127.0.0.1:7001"))
	if line, err := srv.ReadString('\n'); err != nil || line != "listening 262\n" {
		t.Fatalf("server: %q %v", line, err)
	}
	waitMPTCPListener(t, ns, 7001)
	var r struct {
		Proto int
		Reply string
	}
	decode(t, output(t, inNS(ns, true, nil, sockprobe, "dial", "127.0.0.1:7001")), &r)
	if r.Proto != unix.IPPROTO_MPTCP || r.Reply != "pong 262\n" {
		t.Errorf("client got %+v, want protocol 262 and reply from an MPTCP accepted socket", r)
	}
	c := mptcpCounters(t, ns)
	if c["MPCapableSYNRX"] < 1 || c["MPCapableSYNACKRX"] < 1 {
		t.Errorf("kernel saw no MPTCP handshake: SYNRX %d SYNACKRX %d", c["MPCapableSYNRX"], c["MPCapableSYNACKRX"])
	}
}

func TestPythonSockets(t *testing.T) {
	setup(t)
	ns := newNS(t)
	type rep struct {
		TCP4       int  `json:"tcp4"`
		TCP6       int  `json:"tcp6"`
		UDP4       int  `json:"udp4"`
		UnixPairOK bool `json:"unix_pair_ok"`
		UnixFamily int  `json:"unix_stream_family"`
	}
	var base, conv rep
	decode(t, output(t, inNS(ns, false, nil, python, probePy, "report")), &base)
	decode(t, output(t, inNS(ns, true, nil, python, probePy, "report")), &conv)
	if base.TCP4 != 6 || base.TCP6 != 6 {
		t.Fatalf("baseline without run is not TCP: %+v", base)
	}
	want := rep{TCP4: 262, TCP6: 262, UDP4: 17, UnixPairOK: true, UnixFamily: unix.AF_UNIX}
	if conv != want {
		t.Errorf("under run: %+v, want %+v", conv, want)
	}
	// Children inherit the filter: a shell starting python is served too.
	var viaShell rep
	decode(t, output(t, inNS(ns, true, nil, "sh", "-c", python+" "+probePy+" report")), &viaShell)
	if viaShell != want {
		t.Errorf("child of CMD: %+v, want %+v", viaShell, want)
	}
}

// A background child that outlives CMD is still served: the supervisor
// stays until the whole tree is gone (then supervisorsGone sees it exit).
func TestDescendantOutlivesCommand(t *testing.T) {
	setup(t)
	ns := newNS(t)
	out := filepath.Join(t.TempDir(), "out")
	start := time.Now()
	output(t, inNS(ns, true, nil, "sh", "-c", "(sleep 1; "+python+" "+probePy+" report > "+out+".tmp; mv "+out+".tmp "+out+") >/dev/null 2>&1 &"))
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Logf("run returned after %v (expected at once)", d)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile(out)
		if err == nil {
			var r struct {
				TCP4 int `json:"tcp4"`
			}
			decode(t, string(b), &r)
			if r.TCP4 != 262 {
				t.Errorf("background descendant got protocol %d, want 262", r.TCP4)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("background descendant never reported")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Unmodified Debian iperf3 server and client both under run: the server's
// listener is MPTCP (ss -M) and both connections (control and data) do the
// MPTCP handshake, which needs both ends to be MPTCP.
func TestIperf3(t *testing.T) {
	setup(t, "iperf3", "ss")
	ns := newNS(t)
	before := mptcpCounters(t, ns)
	background(t, inNS(ns, true, nil, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", "7002"))
	waitMPTCPListener(t, ns, 7002)
	out := output(t, inNS(ns, true, nil, "iperf3", "-c", "127.0.0.1", "-p", "7002", "-t", "2", "-J"))
	var res struct {
		End struct {
			SumReceived struct {
				Bps float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	decode(t, out, &res)
	if res.End.SumReceived.Bps <= 0 {
		t.Errorf("no goodput: %s", out)
	}
	after := mptcpCounters(t, ns)
	for _, k := range []string{"MPCapableSYNRX", "MPCapableSYNACKRX", "MPCapableACKRX"} {
		if d := after[k] - before[k]; d < 2 {
			t.Errorf("%s rose by %d, want >= 2 (control and data connection)", k, d)
		}
	}
	t.Logf("iperf3 over MPTCP via mpdetour run: %.0f Mbit/s", res.End.SumReceived.Bps/1e6)
}

// curl against Python's http.server, both under run.
func TestCurlHTTPServer(t *testing.T) {
	setup(t, "curl", "ss")
	ns := newNS(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello over mptcp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := inNS(ns, true, nil, python, "-m", "http.server", "--bind", "127.0.0.1", "7003")
	srv.Dir = dir
	background(t, srv)
	waitMPTCPListener(t, ns, 7003)
	before := mptcpCounters(t, ns)
	body := output(t, inNS(ns, true, nil, "curl", "-sS", "--max-time", "10", "http://127.0.0.1:7003/hello.txt"))
	if body != "hello over mptcp\n" {
		t.Errorf("curl got %q", body)
	}
	after := mptcpCounters(t, ns)
	if after["MPCapableSYNACKRX"]-before["MPCapableSYNACKRX"] < 1 || after["MPCapableACKRX"]-before["MPCapableACKRX"] < 1 {
		t.Errorf("curl's connection was not MPTCP: %v -> %v", before, after)
	}
}

// Against a peer that does not speak MPTCP the converted client falls back
// to TCP transparently.
func TestFallbackNonMPTCPPeer(t *testing.T) {
	setup(t)
	ns := newNS(t)
	srv := background(t, inNS(ns, false, nil, python, probePy, "serve", "127.0.0.1", "7004"))
	if line, err := srv.ReadString('\n'); err != nil || line != "listening 6\n" {
		t.Fatalf("plain server: %q %v", line, err)
	}
	before := mptcpCounters(t, ns)
	var r struct {
		Proto int
		Reply string
	}
	decode(t, output(t, inNS(ns, true, nil, sockprobe, "dial", "127.0.0.1:7004")), &r)
	if r.Proto != unix.IPPROTO_MPTCP || r.Reply != "pong 6\n" {
		t.Errorf("client %+v, want an MPTCP socket served by the TCP peer", r)
	}
	after := mptcpCounters(t, ns)
	if after["MPCapableSYNTX"]-before["MPCapableSYNTX"] < 1 || after["MPCapableFallbackSYNACK"]-before["MPCapableFallbackSYNACK"] < 1 {
		t.Errorf("kernel did not record an MPTCP SYN falling back: %v -> %v", before, after)
	}
}

// With MPTCP disabled in the namespace the supervisor cannot create MPTCP
// sockets and lets the program's own TCP socket() through.
func TestFallbackMPTCPDisabled(t *testing.T) {
	setup(t)
	ns := newNS(t)
	mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.mptcp.enabled=0")
	logf := filepath.Join(t.TempDir(), "sup.log")
	var conv map[string]sock
	decode(t, output(t, inNS(ns, true, []string{"--log", logf}, sockprobe, "report")), &conv)
	if conv["tcp4"].Proto != unix.IPPROTO_TCP || conv["tcp4_flags"].Proto != unix.IPPROTO_TCP || !conv["tcp4_flags"].NonBlock {
		t.Errorf("with MPTCP disabled: %+v %+v, want plain TCP", conv["tcp4"], conv["tcp4_flags"])
	}
	// The supervisor logs its totals when the filter has no user left.
	var log []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if log, _ = os.ReadFile(logf); bytes.Contains(log, []byte("supervisor done")) {
			break
		}
	}
	// Every TCP socket the probe made went through the fallback.
	tcp := 0
	for _, s := range conv {
		if s.Proto == unix.IPPROTO_TCP {
			tcp++
		}
	}
	if want := fmt.Sprintf("mptcp=0 fallback=%d ", tcp); tcp < 5 || !bytes.Contains(log, []byte(want)) {
		t.Errorf("supervisor log does not show %q: %s", want, log)
	}
	// The supervisor follows the caller's namespace: a program that enters
	// another namespace gets its MPTCP socket there, not in the supervisor's.
	ns2 := newNS(t)
	decode(t, output(t, inNS(ns, true, nil, "ip", "netns", "exec", ns2, sockprobe, "report")), &conv)
	if conv["tcp4"].Proto != unix.IPPROTO_MPTCP {
		t.Errorf("program that switched to an MPTCP-enabled namespace got protocol %d, want 262", conv["tcp4"].Proto)
	}
}

func TestExitCodesAndSignals(t *testing.T) {
	setup(t)
	exitCode := func(cmd *exec.Cmd) (int, syscall.Signal) {
		t.Helper()
		cmd.Stderr = io.Discard
		err := cmd.Run()
		var ee *exec.ExitError
		if err == nil {
			return 0, 0
		}
		if !errors.As(err, &ee) {
			t.Fatalf("%v: %v", cmd.Args, err)
		}
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return -1, ws.Signal()
		}
		return ws.ExitStatus(), 0
	}
	for _, c := range []struct {
		args []string
		code int
		sig  syscall.Signal
	}{
		{[]string{"true"}, 0, 0},
		{[]string{"sh", "-c", "exit 42"}, 42, 0},
		{[]string{"sh", "-c", "exit 125"}, 125, 0},
		{[]string{"sh", "-c", "kill -TERM $$"}, -1, syscall.SIGTERM},
		{[]string{"sh", "-c", "kill -SEGV $$"}, -1, syscall.SIGSEGV},
		{[]string{"/nonexistent/tu-cmd"}, 127, 0},
		{[]string{"tu-no-such-command"}, 127, 0},
		{[]string{"/etc/hostname"}, 126, 0},
	} {
		code, sig := exitCode(exec.Command(mpdetour, append([]string{"run", "--"}, c.args...)...))
		if code != c.code || sig != c.sig {
			t.Errorf("%v: exit %d signal %v, want %d %v", c.args, code, sig, c.code, c.sig)
		}
	}
	// CMD keeps mpdetour's PID, so a signal sent to the process the caller
	// started reaches CMD's own handler.
	cmd := exec.Command(mpdetour, "run", "--", python, "-c",
		"import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\nprint('ready', flush=True)\ntime.sleep(30)")
	out := background(t, cmd)
	if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("python: %q %v", line, err)
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); !strings.HasPrefix(string(comm), "python3") {
		t.Errorf("started pid runs %q, want python3 itself", comm)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("python's SIGTERM handler did not decide the exit status: %v", err)
	}
	// Usage errors stay the framework's status 2.
	if code, _ := exitCode(exec.Command(mpdetour, "run")); code != 2 {
		t.Errorf("run without command: exit %d, want 2", code)
	}
	if code, _ := exitCode(exec.Command(mpdetour, "run", "--mechanism", "ebpf", "true")); code != 2 {
		t.Errorf("bad --mechanism: exit %d, want 2", code)
	}
}

// The LD_PRELOAD fallback converts a dynamically linked program and, as
// documented, leaves a static one on TCP with a warning.
func TestPreloadMechanism(t *testing.T) {
	setup(t)
	ns := newNS(t)
	var py struct {
		TCP4 int `json:"tcp4"`
		UDP4 int `json:"udp4"`
	}
	decode(t, output(t, inNS(ns, true, []string{"--mechanism", "preload"}, python, probePy, "report")), &py)
	if py.TCP4 != 262 || py.UDP4 != 17 {
		t.Errorf("python under preload: %+v, want tcp4 262 udp4 17", py)
	}
	cmd := inNS(ns, true, []string{"--mechanism", "preload"}, sockprobe, "report")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	var st map[string]sock
	decode(t, string(out), &st)
	if st["tcp4"].Proto != 6 || !strings.Contains(stderr.String(), "statically linked") {
		t.Errorf("static binary under preload: tcp4 %d, stderr %q; want 6 and a warning", st["tcp4"].Proto, stderr.String())
	}
}

func TestCheck(t *testing.T) {
	setup(t)
	ns := newNS(t)
	mustRun(t, "ip", "-n", ns, "mptcp", "limits", "set", "subflows", "3", "add_addr_accepted", "1")
	out := output(t, inNS(ns, false, nil, mpdetour, "run", "--check"))
	for _, want := range []string{"seccomp user notification: available", "SO_PROTOCOL 262", "mechanism: seccomp", "in-kernel PM limits: subflows 3, add_addr_accepted 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("--check output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "warning") {
		t.Errorf("warnings with MPTCP on and non-zero limits:\n%s", out)
	}
	mustRun(t, "ip", "-n", ns, "mptcp", "limits", "set", "subflows", "0", "add_addr_accepted", "0")
	out = output(t, inNS(ns, false, nil, mpdetour, "run", "--check"))
	if !strings.Contains(out, "warning: in-kernel PM limit subflows is 0") {
		t.Errorf("no warning for subflows 0:\n%s", out)
	}
	mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.mptcp.pm_type=1")
	out = output(t, inNS(ns, false, nil, mpdetour, "run", "--check"))
	if !strings.Contains(out, "path manager: userspace") || !strings.Contains(out, "reject MP_JOINs") {
		t.Errorf("no warning for the userspace PM:\n%s", out)
	}
	mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.mptcp.enabled=0")
	out = output(t, inNS(ns, false, nil, mpdetour, "run", "--check"))
	if !strings.Contains(out, "MPTCP is disabled") || !strings.Contains(out, "SO_PROTOCOL 6") {
		t.Errorf("--check with MPTCP disabled:\n%s", out)
	}
}

// Without CAP_SYS_ADMIN, run sets no_new_privs (the kernel's condition for
// an unprivileged seccomp filter) and still converts; as root it does not,
// so setuid programs inside CMD keep working.
func TestUnprivileged(t *testing.T) {
	setup(t, "setpriv")
	ns := newNS(t)
	nobody := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}
	var conv map[string]sock
	decode(t, output(t, inNS(ns, false, nil, append(nobody, mpdetour, "run", "--", sockprobe, "report")...)), &conv)
	if conv["tcp4"].Proto != unix.IPPROTO_TCP+256 || conv["udp4"].Proto != unix.IPPROTO_UDP {
		t.Errorf("unprivileged run: tcp4 %d udp4 %d, want 262 17", conv["tcp4"].Proto, conv["udp4"].Proto)
	}
	nnp := func(cmd *exec.Cmd) string {
		for _, l := range strings.Split(output(t, cmd), "\n") {
			if strings.HasPrefix(l, "NoNewPrivs:") {
				return strings.TrimSpace(strings.TrimPrefix(l, "NoNewPrivs:"))
			}
		}
		return "?"
	}
	if v := nnp(inNS(ns, false, nil, append(nobody, mpdetour, "run", "--", "cat", "/proc/self/status")...)); v != "1" {
		t.Errorf("unprivileged run: NoNewPrivs %s, want 1", v)
	}
	if v := nnp(inNS(ns, true, nil, "cat", "/proc/self/status")); v != "0" {
		t.Errorf("root run: NoNewPrivs %s, want 0", v)
	}
}

// The supervisor (root here) creates sockets with the caller's filesystem
// uid, so a server that dropped privileges owns its sockets as before.
func TestSocketOwner(t *testing.T) {
	setup(t, "setpriv", "ss")
	ns := newNS(t)
	srv := background(t, inNS(ns, true, nil, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sockprobe, "serve", "127.0.0.1:7006"))
	if line, err := srv.ReadString('\n'); err != nil || line != "listening 262\n" {
		t.Fatalf("server: %q %v", line, err)
	}
	out := mustRun(t, "ip", "netns", "exec", ns, "ss", "-HMlne", "sport", "=", ":7006")
	if !strings.Contains(out, "uid:65534") {
		t.Errorf("MPTCP listener of a uid-65534 server not owned by 65534: %q", out)
	}
	// Switching the supervisor thread's fsuid back and forth must not cost
	// it access to the next caller's /proc entries: nobody, root, nobody.
	logf := filepath.Join(t.TempDir(), "sup.log")
	nobody := "setpriv --reuid=65534 --regid=65534 --clear-groups -- " + sockprobe + " report"
	script := nobody + " && " + sockprobe + " report && " + nobody
	outs := output(t, inNS(ns, true, []string{"--log", logf}, "sh", "-c", script))
	for i, line := range strings.Split(strings.TrimSpace(outs), "\n") {
		var r map[string]sock
		decode(t, line, &r)
		if r["tcp4"].Proto != unix.IPPROTO_MPTCP {
			t.Errorf("report %d: tcp4 protocol %d, want 262", i, r["tcp4"].Proto)
		}
	}
	var log []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if log, _ = os.ReadFile(logf); bytes.Contains(log, []byte("supervisor done")) {
			break
		}
	}
	if !bytes.Contains(log, []byte("fallback=0")) || bytes.Contains(log, []byte("level=WARN")) {
		t.Errorf("supervisor log: %s", log)
	}
}

// The long-lived supervisor must not keep descriptors that mpdetour
// inherited: a caller reading a pipe to EOF would otherwise hang until the
// whole tree ends. CMD closes its copies and blocks on stdin; EOF must come
// while it is still blocked.
func TestSupervisorHoldsNoInheritedFDs(t *testing.T) {
	setup(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cmd := exec.Command(mpdetour, "run", "--", "sh", "-c", "exec 4>&- 3>&-; read x")
	cmd.ExtraFiles = []*os.File{pw, pw} // fds 3 and 4, without close-on-exec
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	eof := make(chan error, 1)
	go func() { _, err := io.ReadAll(pr); eof <- err }()
	select {
	case err := <-eof:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no EOF while CMD runs: a helper process holds the inherited pipe")
	}
	io.WriteString(stdin, "x\n")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("CMD: %v", err)
	}
}

// Dispositions a caller sets up for CMD survive mpdetour: SIGINT ignored in
// a shell's background job, SIGHUP ignored by nohup.
func TestInheritedIgnoredSignals(t *testing.T) {
	setup(t)
	py := "import signal; print(int(signal.getsignal(signal.SIGINT) == signal.SIG_IGN), int(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN))"
	for _, c := range []struct{ name, script, want string }{
		{"background job", "%s " + python + " -c '" + py + "' & wait", "1 0\n"},
		{"trap", "trap '' INT HUP; %s " + python + " -c '" + py + "'", "1 1\n"},
		{"default", "%s " + python + " -c '" + py + "'", "0 0\n"},
	} {
		// The unwrapped program is the reference: a test run under nohup
		// (or from a background job) inherits ignored signals itself.
		base, err := exec.Command("sh", "-c", fmt.Sprintf(c.script, "")).Output()
		if err != nil {
			t.Fatal(err)
		}
		want := c.want
		if string(base) != c.want {
			t.Logf("%s: the unwrapped program reports %q, not %q: this test inherited dispositions (nohup?); comparing with it", c.name, base, c.want)
			want = string(base)
		}
		for _, wrap := range []string{mpdetour + " run --", mpdetour + " run --mechanism preload --"} {
			out, err := exec.Command("sh", "-c", fmt.Sprintf(c.script, wrap)).Output()
			if err != nil || string(out) != want {
				t.Errorf("%s via %q: SIGINT/SIGHUP ignored = %q (%v), want %q", c.name, wrap, out, err, want)
			}
		}
	}
}

// A 32-bit (i386) static program: its direct socket syscall (359, what C
// libraries use) is converted, Go's own socketcall(2)-based socket() is not
// (documented limit), and nothing else changes.
func TestI386Program(t *testing.T) {
	setup(t)
	if err := exec.Command(sockprobe386, "report").Run(); err != nil {
		t.Skipf("kernel cannot run i386 programs (IA32 emulation): %v", err)
	}
	ns := newNS(t)
	var base, conv map[string]sock
	decode(t, output(t, inNS(ns, false, nil, sockprobe386, "report")), &base)
	decode(t, output(t, inNS(ns, true, nil, sockprobe386, "report")), &conv)
	if base["tcp4_direct"].Proto != unix.IPPROTO_TCP || conv["tcp4_direct"].Proto != unix.IPPROTO_MPTCP || !conv["tcp4_direct"].CloExec {
		t.Errorf("i386 socket(2): %+v without run, %+v with run; want 6, then 262 with FD_CLOEXEC", base["tcp4_direct"], conv["tcp4_direct"])
	}
	if conv["tcp4"].Proto != unix.IPPROTO_TCP {
		t.Errorf("i386 socketcall(2) socket: protocol %d, want 6 (not convertible)", conv["tcp4"].Proto)
	}
	for _, k := range []string{"udp4", "udp4_direct", "unix_stream", "explicit_mptcp", "tcp4_badflag"} {
		if base[k] != conv[k] {
			t.Errorf("i386 %s changed under run: %+v -> %+v", k, base[k], conv[k])
		}
	}
}

// Where seccomp() itself is refused (a container policy), --check says so
// and auto falls back to LD_PRELOAD with a warning; forcing seccomp fails
// with status 125.
func TestAutoFallsBackWhenSeccompRefused(t *testing.T) {
	setup(t)
	ns := newNS(t)
	deny := []string{sockprobe, "deny-seccomp"}
	cmd := inNS(ns, false, nil, append(deny, mpdetour, "run", "--check")...)
	out, _ := cmd.Output()
	if !strings.Contains(string(out), "seccomp user notification: unavailable") || !strings.Contains(string(out), "mechanism: preload") {
		t.Errorf("--check under a seccomp-denying policy:\n%s", out)
	}
	cmd = inNS(ns, false, nil, append(deny, mpdetour, "run", "--", python, probePy, "report")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var r struct {
		TCP4 int `json:"tcp4"`
	}
	decode(t, string(stdout), &r)
	if r.TCP4 != unix.IPPROTO_MPTCP || !strings.Contains(stderr.String(), "using LD_PRELOAD fallback") {
		t.Errorf("auto under a seccomp-denying policy: tcp4 %d, stderr %q; want 262 via preload and a warning", r.TCP4, stderr.String())
	}
	cmd = inNS(ns, false, nil, append(deny, mpdetour, "run", "--mechanism", "seccomp", "--", "true")...)
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 {
		t.Errorf("forced seccomp under a seccomp-denying policy: %v, want exit status 125", err)
	}
}
