package agent

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// staleSysctl is the number of MPTCP retransmit timer rounds without
// progress after which the kernel declares a subflow stale and re-sends
// its queue on the others (per namespace, default 4).
const staleSysctl = "net.mptcp.stale_loss_cnt"

// staleSetting sets net.mptcp.stale_loss_cnt in the agent's namespace
// (stale_loss_cnt) and restores what it found at stop. What it found is
// kept in a state file beside the status socket before the change, so
// that the next agent restores it after a crash.
type staleSetting struct {
	ns    string
	state string
	orig  string
}

// setStaleLossCnt sets n, after restoring what a previous agent that did
// not stop cleanly left.
func setStaleLossCnt(cfg Options, n int, log *slog.Logger) (*staleSetting, error) {
	state, err := nsStateFile(cfg, "stale")
	if err != nil {
		return nil, fmt.Errorf("stale_loss_cnt: %w", err)
	}
	s := &staleSetting{ns: cfg.NetNS, state: state}
	if saved, err := os.ReadFile(state); err == nil {
		if v := strings.TrimSpace(string(saved)); validStale(v) {
			log.Warn("a previous agent did not stop cleanly; restoring the stale_loss_cnt it found", "state", state, "value", v)
			s.orig = v
			if err := s.restore(); err != nil {
				return nil, err
			}
		}
	}
	v, err := readSysctl(cfg.NetNS, staleSysctl)
	if err != nil {
		return nil, fmt.Errorf("stale_loss_cnt: %w", err)
	}
	if !validStale(v) {
		return nil, fmt.Errorf("stale_loss_cnt: %s reads %q, not a count", staleSysctl, v)
	}
	s.orig = v
	if err := writeStateFile(state, v+"\n"); err != nil {
		return nil, fmt.Errorf("stale_loss_cnt: state file: %w", err)
	}
	if err := writeSysctl(cfg.NetNS, staleSysctl, strconv.Itoa(n)); err != nil {
		_ = os.Remove(state)
		return nil, fmt.Errorf("stale_loss_cnt: %w", err)
	}
	log.Info("stale subflow threshold", "stale_loss_cnt", n, "was", v)
	return s, nil
}

func validStale(v string) bool {
	n, err := strconv.ParseUint(v, 10, 32)
	return err == nil && n > 0
}

// restore puts back what the setting found and removes the state file.
func (s *staleSetting) restore() error {
	if err := writeSysctl(s.ns, staleSysctl, s.orig); err != nil {
		return err
	}
	if err := os.Remove(s.state); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
