package netnstest

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/vishvananda/netns"
)

// A test binary stopped by Ctrl-C (SIGINT) or a CI's SIGTERM runs no
// t.Cleanup: the namespaces New made are deleted by its signal handler,
// and the process still dies of the signal.
func TestInterruptRemovesNamespaces(t *testing.T) {
	if os.Getenv("NETNSTEST_SIGNAL_CHILD") != "" {
		ns := New(t, "nsig")
		os.Stdout.WriteString("namespace " + ns.Name + "\n")
		time.Sleep(30 * time.Second) // the parent interrupts us first
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptRemovesNamespaces$", "-test.count=1")
		cmd.Env = append(os.Environ(), "NETNSTEST_SIGNAL_CHILD=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		name := ""
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if n, ok := strings.CutPrefix(sc.Text(), "namespace "); ok {
				name = n
				break
			}
		}
		if name == "" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%v: the child printed no namespace", sig)
		}
		t.Cleanup(func() { _ = netns.DeleteNamed(name) }) // if the handler failed
		if _, err := os.Stat("/run/netns/" + name); err != nil {
			t.Fatalf("%v: namespace %s not there before the signal: %v", sig, name, err)
		}
		testenv.InterruptChild(t, cmd, sig)
		if _, err := os.Stat("/run/netns/" + name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%v: namespace %s still there after the signal (%v)", sig, name, err)
		}
	}
}
