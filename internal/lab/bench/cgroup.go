package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
)

// An agent with a BPF mechanism (cwnd_clamp, subflow_lowat) attaches its
// sock_ops program to a cgroup v2 directory and acts on every socket made
// by a process in it (or below it). Attached to the cgroup v2 root, the
// program of one lab would see the sockets of every lab on the machine,
// which often use the same addresses. So the bench gives such an agent a
// cgroup of its own (bpf_cgroup): mpdetour-lab-PID under the cgroup v2
// mount, holding this process while the agent runs: the sender (the
// bench's own, or "mpdetour bench send" started from here) and the
// receiver make their sockets in it; the lab's other processes (relays,
// other labs) do not. The process goes back where it was, and the
// directory is removed, when the last such agent stops, also after a
// failed trial; a directory left by a killed runner (no process in it)
// is removed by the next runner that makes one.
//
// One directory per process, shared by the agents this process runs
// at the same time (trials of one runner run one at a time).
type labCgroup struct {
	mu    sync.Mutex
	users int
	dir   string
	back  string
	// left is a directory the last leave could not remove (processes
	// started while this runner was in it outlived the agent: a soak's
	// attack peers); RemoveLeftCgroup removes it once the command has
	// torn its lab down.
	left string
}

var runnerCgroup labCgroup

// cgroupPrefix names the directories this code makes.
const cgroupPrefix = "mpdetour-lab-"

// enter moves this process into its own cgroup (made if needed) and
// returns the directory and the function that leaves it (idempotent).
func (c *labCgroup) enter() (string, func() error, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users == 0 {
		root, err := bpfclamp.Cgroup2Root()
		if err != nil {
			return "", nil, err
		}
		back, err := bpfclamp.OwnCgroup(root)
		if err != nil {
			return "", nil, err
		}
		removeStaleCgroups(root)
		dir := filepath.Join(root, cgroupPrefix+strconv.Itoa(os.Getpid()))
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return "", nil, fmt.Errorf("lab cgroup: %w", err)
		}
		if err := moveTo(dir); err != nil {
			os.Remove(dir)
			return "", nil, fmt.Errorf("lab cgroup: %w", err)
		}
		c.dir, c.back = dir, back
	}
	c.users++
	var once sync.Once
	var err error
	return c.dir, func() error {
		once.Do(func() { err = c.leave() })
		return err
	}, nil
}

// leave undoes one enter; the last one moves the process back and
// removes the directory.
func (c *labCgroup) leave() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users--; c.users > 0 {
		return nil
	}
	if err := moveTo(c.back); err != nil {
		return fmt.Errorf("lab cgroup %s: moving back to %s: %w", c.dir, c.back, err)
	}
	// A child that has not exited yet (the agent's own helpers) keeps
	// the directory busy for a moment.
	var err error
	for range 20 {
		if err = os.Remove(c.dir); err == nil || os.IsNotExist(err) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.left = c.dir
	return nil
}

// RemoveLeftCgroup removes the lab cgroup a leave had to leave behind
// because processes started in it were still running; called when the
// command has stopped its lab, it waits up to wait for them to be gone.
// Nothing to do (nil) when every leave removed its directory.
func RemoveLeftCgroup(wait time.Duration) error {
	c := &runnerCgroup
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.left == "" || c.users > 0 {
		return nil
	}
	var err error
	for deadline := time.Now().Add(wait); ; time.Sleep(100 * time.Millisecond) {
		if err = os.Remove(c.left); err == nil || os.IsNotExist(err) {
			c.left = ""
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab cgroup %s not removed: %w (a process is still in it; the next runner removes it once it is empty)", c.left, err)
		}
	}
}

// moveTo moves this process (every thread) into the cgroup dir.
func moveTo(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// removeStaleCgroups removes the directories of runners that no longer
// run (a directory with processes in it cannot be removed, and stays).
func removeStaleCgroups(root string) {
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), cgroupPrefix))
		if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix) || err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			_ = os.Remove(filepath.Join(root, e.Name()))
		}
	}
}

// withLabCgroup gives an agent configuration that switches on a mechanism
// attaching the BPF program (cwnd_clamp, subflow_lowat) without naming
// its cgroup (bpf_cgroup, cwnd_clamp.cgroup) this runner's cgroup: it
// enters it and appends bpf_cgroup. leave undoes the enter (a no-op when
// nothing was added). The agent's own parser decides (one config layer);
// a configuration it refuses is returned as it is, and the agent says
// what is wrong with it.
func withLabCgroup(cfg string) (_ string, leave func() error, _ error) {
	none := func() error { return nil }
	c, err := agentd.ParseConfig([]byte(cfg))
	if err != nil || (c.CwndClamp == nil && c.SubflowLowat == 0 && !c.SubflowPacing) || c.BPFCgroup != "" {
		return cfg, none, nil
	}
	// The agent's BPF program sees only this runner's sockets.
	dir, leave, err := runnerCgroup.enter()
	if err != nil {
		return "", nil, fmt.Errorf("agent with a BPF program: %w", err)
	}
	if cfg != "" && !strings.HasSuffix(cfg, "\n") {
		cfg += "\n"
	}
	return cfg + "bpf_cgroup: " + dir + "\n", leave, nil
}
