package agent

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
)

// staleSysctl is the number of MPTCP retransmit timer rounds without
// progress after which the kernel declares a subflow stale and re-sends
// its queue on the others (per namespace, default 4).
const staleSysctl = "net.mptcp.stale_loss_cnt"

// staleSetting sets net.mptcp.stale_loss_cnt in the agent's namespace
// (stale_loss_cnt) and restores what it found at stop, or the next agent
// does after a crash (savedSysctls).
type staleSetting struct {
	saved *savedSysctls
	orig  string
}

// setStaleLossCnt sets n, after restoring what a previous agent that did
// not stop cleanly left.
func setStaleLossCnt(cfg Options, n int, log *slog.Logger) (*staleSetting, error) {
	saved, err := saveSysctls(cfg, "stale", "stale_loss_cnt", []string{staleSysctl}, validStale, log)
	if err != nil {
		return nil, err
	}
	v := saved.orig[staleSysctl]
	if err := writeSysctl(cfg.NetNS, staleSysctl, strconv.Itoa(n)); err != nil {
		_ = os.Remove(saved.state)
		return nil, fmt.Errorf("stale_loss_cnt: %w", err)
	}
	log.Info("stale subflow threshold", "stale_loss_cnt", n, "was", v)
	return &staleSetting{saved: saved, orig: v}, nil
}

func validStale(v string) error {
	if n, err := strconv.ParseUint(v, 10, 32); err != nil || n == 0 {
		return fmt.Errorf("reads %q, not a count", v)
	}
	return nil
}

// restore puts back what the setting found and removes the state file.
func (s *staleSetting) restore() error { return s.saved.restore() }
