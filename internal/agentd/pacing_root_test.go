package agentd

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

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
	cg := cgroupProgram(t, "pace", "")
	opts := agent.Options{}
	wirePacing(&opts, cg.prog, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
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
	c := cg.dial(t, "", ln.Addr().String())
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
	cg.closeDetached(t)
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
