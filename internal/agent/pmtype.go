package agent

import (
	"log/slog"
	"sync"
	"time"
)

// The agent needs net.mptcp.pm_type = 1 (userspace path manager) for as
// long as it runs. Another program may change it under the agent
// (mptcpd, NetworkManager, `sysctl --system` with a sysctl.d file setting
// 0): the kernel then answers the agent's commands with errors and its
// own in-kernel PM decides. The agent checks it every BlackholePoll and restores it, with
// one WARN per change found; status and doctor show the restorations
// (docs/agent.md, "pm_type changed under the agent"). Restoring rather
// than exiting: a supervisor would restart the agent into the same
// situation, while restoring keeps the detours and says who to look for.

// PMTypeStatus is what the guard saw (JSON names stable).
type PMTypeStatus struct {
	// Restores counts the times pm_type was found changed and set back.
	Restores    uint64    `json:"restores"`
	LastFound   string    `json:"last_found,omitempty"` // the value found at the last restoration
	LastRestore time.Time `json:"last_restore,omitzero"`
	Error       string    `json:"error,omitempty"`
}

type pmTypeGuard struct {
	log *slog.Logger
	mu  sync.Mutex
	st  PMTypeStatus
}

// check reads pm_type and sets it back to 1 when it changed.
func (g *pmTypeGuard) check(now time.Time, read func() (string, error), write func(string) error) {
	v, err := read()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.st.Error = err.Error()
		return
	}
	if v == "1" {
		g.st.Error = ""
		return
	}
	if err := write("1"); err != nil {
		g.st.Error = "net.mptcp.pm_type is " + v + " and cannot be set back to 1: " + err.Error()
		g.log.Error("net.mptcp.pm_type changed under the agent and cannot be restored: the kernel's in-kernel path manager decides, detours fail", "pm_type", v, "err", err)
		return
	}
	g.st.Restores++
	g.st.LastFound, g.st.LastRestore, g.st.Error = v, now, ""
	g.log.Warn("net.mptcp.pm_type was changed under the agent (another program: mptcpd, NetworkManager, a sysctl.d file applied by systemd-sysctl?); set back to 1",
		"found", v, "restores", g.st.Restores)
}

func (g *pmTypeGuard) status() PMTypeStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st
}
