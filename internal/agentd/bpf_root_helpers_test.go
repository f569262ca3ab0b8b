package agentd

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// progCgroup is a cgroup v2 directory of a root test with the agent's
// BPF program attached to it, and the cgroup this process came from.
type progCgroup struct {
	dir, back string
	prog      *bpfProgram
}

// cgroupProgram makes the cgroup mpd-agentd-NAME-PID under the cgroup v2
// root (removed at cleanup) and opens the agent's program on it for an
// agent in netns ("" = this namespace; closed at cleanup). The test
// skips where there is no cgroup v2 or the directory cannot be made.
func cgroupProgram(t *testing.T, name, netns string) progCgroup {
	t.Helper()
	root, err := bpfclamp.Cgroup2Root()
	if err != nil {
		t.Skip(err)
	}
	back, err := bpfclamp.OwnCgroup(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("mpd-agentd-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	prog := openBPF(dir, func(cg string) (clampMap, error) { return attachClamp(cg, netns, bpfclamp.Options{}) })
	t.Cleanup(func() { prog.close() })
	return progCgroup{dir: dir, back: back, prog: prog}
}

// dial makes an MPTCP connection to addr from inside the cgroup (a
// socket stays in the cgroup of the thread that made it) in netns, then
// moves this process back; the connection is closed at cleanup.
func (cg progCgroup) dial(t *testing.T, netns, addr string) net.Conn {
	t.Helper()
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(cg.dir, "cgroup.procs"), pid, 0o644); err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	d.SetMultipathTCP(true)
	var c net.Conn
	err := netnsx.Do(netns, func() (err error) { c, err = d.Dial("tcp", addr); return err })
	if err2 := os.WriteFile(filepath.Join(cg.back, "cgroup.procs"), pid, 0o644); err2 != nil {
		if c != nil {
			c.Close()
		}
		t.Fatal(err2)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closeDetached closes the program and checks that nothing stays
// attached to the cgroup.
func (cg progCgroup) closeDetached(t *testing.T) {
	t.Helper()
	if err := cg.prog.close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(cg.dir)
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
