package relay

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// An unprivileged local user who binds the relay's lock and status names
// first neither keeps the relay from starting nor answers `relay status`
// in its place (the names were an abstract socket anyone could bind).
func TestLockCannotBeSquatted(t *testing.T) {
	testenv.Root(t)
	ns := netnstest.New(t, "trl")
	// The squatter is this test binary as user nobody, which must be able
	// to read it: a copy in a directory everyone can enter.
	dir, err := os.MkdirTemp("", "mpdetour-squat-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "relay.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "MPDETOUR_TEST_SQUATTER=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Started from a thread in the namespace: the squatter lives there.
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-ready:
		if strings.TrimSpace(line) != "ready" {
			t.Fatalf("squatter: %q\n%s", line, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("squatter did not start\n%s", stderr.String())
	}
	t.Logf("squatter (uid 65534): %s", strings.TrimSpace(stderr.String()))
	err = ns.Do(func() error {
		if st, err := QueryStatus(2 * time.Second); err == nil {
			t.Errorf("relay status believed a squatter: %+v", st)
		}
		l, err := Lock()
		if err != nil {
			return err
		}
		return l.Close()
	})
	if err != nil {
		t.Fatalf("the relay's lock with a squatter in the namespace: %v", err)
	}
}

// A relay that stops leaves nothing in RunDir (files of relays of every
// namespace that ever ran piled up there), and the lock still excludes a
// second relay while the first one runs, also across a stop and a new start.
func TestLockLeavesNothingBehind(t *testing.T) {
	testenv.Root(t)
	ns := netnstest.New(t, "trk")
	err := ns.Do(func() error {
		lockPath, sockPath, err := lockPaths()
		if err != nil {
			return err
		}
		for round := range 2 {
			l, err := Lock()
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if _, err := Lock(); err == nil || !strings.Contains(err.Error(), "another mpdetour relay is running") {
				t.Errorf("round %d: a second lock while the first is held: %v", round, err)
			}
			for _, p := range []string{lockPath, sockPath} {
				if _, err := os.Lstat(p); err != nil {
					t.Errorf("round %d: while held: %v", round, err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatalf("round %d: close: %v", round, err)
			}
			for _, p := range []string{lockPath, sockPath} {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("round %d: %s still there after the relay stopped (%v)", round, p, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
