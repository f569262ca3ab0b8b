package testenv

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A test binary stopped by Ctrl-C (SIGINT) or a CI's timeout (SIGTERM) runs
// no t.Cleanup and no deferred call. OnInterrupt is where the helpers that
// create kernel state (netnstest's namespaces, labtest's labs) register what
// must go in that case; one handler runs every registered function and then
// lets the process die of the signal, so that two helpers cannot race each
// other to the exit.
var (
	intMu    sync.Mutex
	intFns   []func()
	intWatch sync.Once
)

// OnInterrupt registers fn to run when this process receives SIGINT or
// SIGTERM; after every registered function has returned (newest first),
// the process dies of the signal as it would have without the handler.
// A registered fn must cope with its state being gone already (t.Cleanup
// may have removed it): registrations are not taken back.
func OnInterrupt(fn func()) {
	intWatch.Do(func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		go func() {
			sig := <-c
			intMu.Lock()
			for i := len(intFns) - 1; i >= 0; i-- {
				intFns[i]()
			}
			intMu.Unlock()
			signal.Reset(sig)
			_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
			time.Sleep(time.Second)
			os.Exit(2)
		}()
	})
	intMu.Lock()
	intFns = append(intFns, fn)
	intMu.Unlock()
}

// InterruptChild sends sig to cmd, a started child process (a test binary
// re-run as a helper), waits for it and fails t unless the child died of
// sig: what a handler registered with OnInterrupt must still let happen.
func InterruptChild(t testing.TB, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("%v: child ended with %v, want killed by the signal", sig, err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != sig {
		t.Errorf("%v: child status %v, want killed by %v", sig, ee, sig)
	}
}
