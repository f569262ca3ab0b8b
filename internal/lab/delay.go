package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/delayline"
)

// delayLineMarker is argv[0] of the re-executed binary that runs a lab's
// delay line. Re-executing ourselves (rather than looking for an mpdetour
// binary) lets any program that builds labs, tests included, run one.
const delayLineMarker = "mpdetour-lab-delayline"

func delayLineMain(flag, path string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if flag != "--state" {
		log.Error("usage: --state FILE")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := delayline.RunStateFile(ctx, path, log)
	if err != nil {
		log.Error("delay line failed", "state", path, "err", err)
		return 1
	}
	return 0
}

// delayReady is what the delay line logs once every socket is open.
const delayReady = "delay line running"

// startDelayLine starts one detached delay-line process for every link
// the lab routes through a middle namespace and waits until it forwards.
func (b *builder) startDelayLine() error {
	var cfg delayline.Config
	for i, e := range b.st.Emulation {
		if e.Mid == "" {
			continue
		}
		l := b.t.Links[i]
		cfg.Links = append(cfg.Links, delayline.Link{
			Name: l.Name, Netns: filepath.Join(NetnsDir, e.Mid), A: "a", B: "b",
			DelayAB: delayline.Duration(l.AB.Delay), DelayBA: delayline.Duration(l.BA.Delay),
		})
	}
	if len(cfg.Links) == 0 {
		return nil
	}
	dir := StateDir(b.st.Name)
	cfgPath := filepath.Join(dir, "delayline.json")
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "delayline.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	if !reexecCalled.Load() {
		return errNoReexec()
	}
	cmd := &exec.Cmd{
		Path:   "/proc/self/exe",
		Args:   []string{delayLineMarker, "--state", cfgPath},
		Stdin:  devnull,
		Stdout: logf,
		Stderr: logf,
		// Its own session: Ctrl-C on the terminal that ran "lab up" must
		// not stop the delay line of a lab that stays up.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting delay line: %w", err)
	}
	start, err := procStart(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	b.st.DelayLine = &procRef{PID: cmd.Process.Pid, Start: start}
	if err := b.st.save(); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	exited := make(chan struct{})
	// Reap it whenever it ends, so a long-lived builder (a test) keeps no zombie.
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			return fmt.Errorf("delay line exited: %s", lastLine(logPath))
		case <-deadline.C:
			return fmt.Errorf("delay line not ready after 10s (log %s)", logPath)
		case <-b.ctx.Done():
			return b.ctx.Err()
		case <-tick.C:
			if log, _ := os.ReadFile(logPath); strings.Contains(string(log), delayReady) {
				return nil
			}
		}
	}
}

func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// stopDelayLine asks the delay line to stop (it logs its statistics on
// SIGTERM) and kills it if it does not within a second.
func stopDelayLine(p *procRef) {
	if !p.alive() {
		return
	}
	syscall.Kill(p.PID, syscall.SIGTERM)
	for range 100 {
		if !p.alive() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p.alive() {
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
}
