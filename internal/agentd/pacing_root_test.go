package agentd

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// The real program through the agent's path: an MPTCP connection made in
// a cgroup, its subflow reported after it connected (as the agent does),
// gets the largest maximum pacing rate at an RTT callback (tcp_info of
// the MPTCP socket is its first subflow's: tcpi_max_pacing_rate, no
// longer the kernel's ~0 = never set, so the subflow's pacing status is
// SK_PACING_NEEDED); a plain TCP socket connected outside the cgroup
// keeps ~0; after close nothing is attached.
func TestPacingRealProgram(t *testing.T) {
	testenv.MPTCP(t)
	root, err := bpfclamp.Cgroup2Root()
	if err != nil {
		t.Skip(err)
	}
	back, err := bpfclamp.OwnCgroup(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("mpd-agentd-pace-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	prog := openBPF(dir, func(cg string) (clampMap, error) { return attachClamp(cg, "", bpfclamp.Options{}) })
	t.Cleanup(func() { prog.close() })
	opts := agent.Options{}
	wirePacing(&opts, prog, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if st := opts.SubflowPacing(); st.State != "active" {
		t.Fatalf("status %+v", st)
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	// The MPTCP connection in the cgroup (sockets stay in the cgroup of
	// the thread that made them), then back.
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{}
	d.SetMultipathTCP(true)
	c, err := d.Dial("tcp", ln.Addr().String())
	if err2 := os.WriteFile(filepath.Join(back, "cgroup.procs"), pid, 0o644); err2 != nil {
		t.Fatal(err2)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Plain TCP between the same addresses, outside the cgroup.
	plain, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	opts.OnSubflows(1, []agent.SubflowPair{{Local: c.LocalAddr().(*net.TCPAddr).AddrPort(), Remote: c.RemoteAddr().(*net.TCPAddr).AddrPort()}})
	var rate uint64
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && rate != bpfclamp.MaxPacingRate; {
		if _, err := c.Write(make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
		rate = maxPacingRate(t, c.(syscall.Conn))
	}
	if rate != bpfclamp.MaxPacingRate {
		t.Errorf("subflow tcpi_max_pacing_rate %d, want %d (pacing on)", rate, uint64(bpfclamp.MaxPacingRate))
	}
	if _, err := plain.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if r := maxPacingRate(t, plain.(syscall.Conn)); r != ^uint64(0) {
		t.Errorf("plain TCP outside the cgroup: max pacing rate %d, want ~0 (never set)", r)
	}
	if st := opts.SubflowPacing(); st.State != "active" || st.Pairs != 1 || st.Refused != "" {
		t.Errorf("status %+v, want active with one pair", st)
	}
	opts.OnSubflows(1, nil)
	if st := opts.SubflowPacing(); st.Pairs != 0 {
		t.Errorf("status after the connection %+v, want no pairs", st)
	}
	if err := prog.close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.Programs); n != 0 {
		t.Errorf("%d programs attached after close, want 0", n)
	}
}

// maxPacingRate is c's tcpi_max_pacing_rate (an MPTCP socket's: its first
// subflow's).
func maxPacingRate(t *testing.T, c syscall.Conn) uint64 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var rate uint64
	err = rc.Control(func(fd uintptr) {
		var ti *unix.TCPInfo
		if ti, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			rate = ti.Max_pacing_rate
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return rate
}
