package agent

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// renice sets the scheduling niceness of every thread of the process.
// Linux applies nice per thread and new threads inherit it from their
// creator, so setting it on all current threads covers the future ones.
// The agent's latency under CPU contention is a scheduling matter
// (docs/agent.md, benchmark): a negative value keeps it ahead of bulk work.
func renice(n int) error {
	// Threads started during one pass by a thread not yet changed keep the
	// old value: a few passes close that window.
	for range 3 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("nice: %w", err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
				return fmt.Errorf("nice %d: %w", n, err)
			}
		}
	}
	return nil
}
