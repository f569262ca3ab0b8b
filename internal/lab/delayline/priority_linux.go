package delayline

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Priority is how the delay line's process competes for CPU with the
// traffic it carries (senders, receivers and the kernel's softirq work all
// run on the same cores).
type Priority string

const (
	PriorityNormal   Priority = "normal"   // leave the process as started
	PriorityNice     Priority = "nice"     // nice -10: ~9x the CPU share of a nice 0 task
	PriorityRealtime Priority = "realtime" // SCHED_FIFO 10: runs as soon as a frame is due
)

// fifoPriority is low among real-time priorities: kernel threads that
// matter (migration, watchdogs) stay above it, and the kernel's RT
// throttling (sched_rt_runtime_us) keeps 5% of each second for others.
const fifoPriority = 10

// SetPriority applies p to every thread of this process. Threads the Go
// runtime creates later inherit it from their creator. It is meant for a
// process that does nothing but run the delay line.
func SetPriority(p Priority) error {
	var attr *unix.SchedAttr
	switch p {
	case PriorityNormal, "":
		return nil
	case PriorityNice:
		attr = &unix.SchedAttr{Policy: 0 /* SCHED_OTHER */, Nice: -10}
	case PriorityRealtime:
		attr = &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: fifoPriority}
	default:
		return fmt.Errorf("unknown delay line priority %q (normal, nice, realtime)", p)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		// Linux applies scheduling attributes per thread, not per process.
		if err := unix.SchedSetAttr(tid, attr, 0); err != nil && err != unix.ESRCH {
			return fmt.Errorf("delay line priority %s: %w", p, err)
		}
	}
	return nil
}
