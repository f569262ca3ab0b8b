package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relayd"
)

// The integration tests run the relay as a separate process inside a
// namespace, so that kill -9 and SIGTERM are real. The test binary itself is
// that process when MPDETOUR_TEST_RELAY_CONFIG is set, running the daemon
// (internal/relayd) as `mpdetour relay` does. TestMain is in the external
// test package because relayd imports the relay.
func TestMain(m *testing.M) {
	lab.Reexec()
	if os.Getenv("MPDETOUR_TEST_SQUATTER") != "" {
		squat()
	}
	if cfg := os.Getenv("MPDETOUR_TEST_RELAY_CONFIG"); cfg != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		profileRelay(ctx)
		err := relayd.Run(ctx, cfg, log, nil)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	labtest.DownOnInterrupt() // the labs this process built go with it on Ctrl-C or SIGTERM
	os.Exit(m.Run())
}

// squat is a local user's process that tries to take the relay's lock and
// status names in its network namespace before the relay starts, and
// answers status requests with a fake status (TestLockCannotBeSquatted).
// It binds what it can, says "ready" and serves until its stdin closes.
func squat() {
	names := []string{"@mpdetour-relay"} // the name before the lock moved to relay.RunDir
	if fi, err := os.Stat("/proc/thread-self/ns/net"); err == nil {
		base := fmt.Sprintf("%s/relay-netns-%d", relay.RunDir, fi.Sys().(*syscall.Stat_t).Ino)
		names = append(names, base+".sock")
		if f, err := os.OpenFile(base+".lock", os.O_RDWR|os.O_CREATE, 0o600); err == nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		}
	}
	for _, n := range names {
		l, err := net.Listen("unix", n)
		if err != nil {
			fmt.Fprintln(os.Stderr, "squatter:", err)
			continue
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, `{"listen": "6.6.6.6:666", "pid": 666, "mappings": 666}`)
				c.Close()
			}
		}()
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// profileRelay records, when MPDETOUR_TEST_RELAY_PROFILE names a
// directory, a CPU profile (cpu.pprof) and an execution trace (trace.out)
// of this relay process for MPDETOUR_TEST_RELAY_PROFILE_FOR seconds
// (default 5) starting MPDETOUR_TEST_RELAY_PROFILE_AFTER seconds (default
// 0) after it started: how the flood benchmarks find where the relay's
// time goes. The files are complete once "profile written" is on stderr.
func profileRelay(ctx context.Context) {
	dir := os.Getenv("MPDETOUR_TEST_RELAY_PROFILE")
	if dir == "" {
		return
	}
	secs := func(env string, def int) time.Duration {
		if n, err := strconv.Atoi(os.Getenv(env)); err == nil {
			return time.Duration(n) * time.Second
		}
		return time.Duration(def) * time.Second
	}
	after, dur := secs("MPDETOUR_TEST_RELAY_PROFILE_AFTER", 0), secs("MPDETOUR_TEST_RELAY_PROFILE_FOR", 5)
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
		cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		tr, err := os.Create(filepath.Join(dir, "trace.out"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		if err := trace.Start(tr); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(dur):
		}
		trace.Stop()
		pprof.StopCPUProfile()
		cpu.Close()
		tr.Close()
		fmt.Fprintln(os.Stderr, "profile written")
	}()
}
