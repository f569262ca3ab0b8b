package labtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

func TestMain(m *testing.M) {
	lab.Reexec()
	DownOnInterrupt()
	os.Exit(m.Run())
}

// labLeft lists what of lab name is still there: its namespaces
// ("<name>-*" under /run/netns) and its state directory.
func labLeft(name string) []string {
	left, _ := filepath.Glob(filepath.Join(lab.NetnsDir, name+"-*"))
	if _, err := os.Stat(lab.StateDir(name)); !errors.Is(err, os.ErrNotExist) {
		left = append(left, lab.StateDir(name))
	}
	return left
}

// A test binary stopped by Ctrl-C (SIGINT) or a CI's SIGTERM runs no
// t.Cleanup: the labs it built are taken down by DownOnInterrupt's
// handler, labs other processes built stay, and the process still dies of
// the signal.
func TestInterruptTakesDownLabs(t *testing.T) {
	if name := os.Getenv("LABTEST_SIGNAL_CHILD"); name != "" {
		UpDetours(context.Background(), t, name, 1)
		os.Stdout.WriteString("lab up\n")
		time.Sleep(time.Minute) // the parent interrupts us first
		return
	}
	testenv.Root(t)
	mine := UpDetours(context.Background(), t, fmt.Sprintf("lts%d", os.Getpid()), 1)
	for i, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		name := fmt.Sprintf("ltc%d_%d", os.Getpid(), i)
		t.Cleanup(func() { _ = lab.Down(name) }) // if the handler failed
		cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptTakesDownLabs$", "-test.count=1")
		cmd.Env = append(os.Environ(), "LABTEST_SIGNAL_CHILD="+name)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		up := false
		for sc := bufio.NewScanner(out); sc.Scan(); {
			if sc.Text() == "lab up" {
				up = true
				break
			}
		}
		if !up {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%v: the child did not bring its lab up", sig)
		}
		if len(labLeft(name)) == 0 {
			t.Fatalf("%v: lab %s not there before the signal", sig, name)
		}
		testenv.InterruptChild(t, cmd, sig)
		if left := labLeft(name); len(left) > 0 {
			t.Errorf("%v: left after the signal: %v", sig, left)
		}
		if len(labLeft(mine.Name())) == 0 {
			t.Errorf("%v: this process's lab %s was taken down by the child's handler", sig, mine.Name())
		}
	}
}
