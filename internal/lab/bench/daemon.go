package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
)

// daemon is a process (relay, agent, openvpn) running in a lab node.
type daemon struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	// after, when set, runs once the daemon is stopped (stop), e.g. to
	// leave the lab cgroup of an agent with a BPF program.
	after func() error
}

// startDaemon runs argv in node (argv[0] a path or a program on PATH). Its stderr goes to a log file
// in env.Dir, quoted in errors. The process gets SIGTERM (and time to
// remove its kernel state) when ctx ends or stop is called.
func startDaemon(ctx context.Context, env *Env, node, name string, argv ...string) (*daemon, error) {
	logPath := filepath.Join(env.Dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := env.Lab.Command(ctx, node, argv...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	// Its own process group: a Ctrl-C on the terminal reaches only us, and
	// we stop the daemon in order (SIGTERM, wait) before the lab goes down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s in %s: %w", name, node, err)
	}
	d := &daemon{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// exited reports whether the daemon has ended, with its error.
func (d *daemon) exited() (bool, error) {
	select {
	case <-d.done:
		return true, d.err
	default:
		return false, nil
	}
}

// failure describes a daemon that died, with the end of its log.
func (d *daemon) failure() error {
	return fmt.Errorf("%s exited (%v): %s", d.name, d.err, d.tail())
}

// tail returns the last lines of the daemon's log, on one line.
func (d *daemon) tail() string {
	b, _ := os.ReadFile(d.logPath)
	lines := strings.Split(strings.TrimSpace(string(bytes.ToValidUTF8(b, nil))), "\n")
	if len(lines) > 4 {
		lines = lines[len(lines)-4:]
	}
	return strings.Join(lines, " | ")
}

// stop sends SIGTERM and waits; SIGKILL after 5 s. Then it runs after.
func (d *daemon) stop() error {
	err := d.terminate()
	if d.after != nil {
		err = errors.Join(err, d.after())
	}
	return err
}

func (d *daemon) terminate() error {
	if ok, _ := d.exited(); ok {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("%s ignored SIGTERM for 5 s: killed", d.name)
	}
	return nil
}

// waitFor polls cond until it is true, the daemon exits, or timeout.
func (d *daemon) waitFor(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return nil
		}
		if ok, _ := d.exited(); ok {
			return d.failure()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not ready after %s: %s", d.name, what, timeout, d.tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// AgentPolicyLog returns the decisions the cell's agent logged on single
// subflows, for results.Record.PolicyLog: the INFO and WARN lines of
// env.Dir/agent.log (complete once the session is closed) that name a
// connection's token and a path, in order, at most results.PolicyLogMax
// (the last then counts the rest). Nil when the cell ran no agent.
func AgentPolicyLog(env *Env) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(env.Dir, "agent.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return policyLines(string(bytes.ToValidUTF8(b, nil)), results.PolicyLogMax), nil
}

// policyLines picks AgentPolicyLog's lines out of an agent log (slog's
// text format). More than max: the first max-1 and a count of the rest.
func policyLines(log string, max int) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if (strings.Contains(l, " level=INFO ") || strings.Contains(l, " level=WARN ")) &&
			strings.Contains(l, " token=") && strings.Contains(l, " path=") {
			out = append(out, l)
		}
	}
	if len(out) > max {
		out = append(out[:max-1], fmt.Sprintf("(%d more lines not kept)", len(out)-max+1))
	}
	return out
}
