package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// Kernel is everything the agent needs of the kernel's MPTCP path manager:
// events in, commands out, and the two sock_diag views (connections for
// adoption and resynchronisation, subflows with TCP_INFO for measurement).
// LinuxKernel is the real one; kerneltest.Fake stands in for it in tests
// that run without root, as wireguard-go's conn/bindtest does for its Bind.
type Kernel interface {
	// Events blocks for the next batch of events. An error wrapping
	// mptcppm.ErrEventsLost means the kernel dropped some (the agent then
	// resynchronises); net.ErrClosed after Close.
	Events() ([]mptcppm.Event, error)
	// Command issues one intent and returns the kernel's answer. The agent
	// calls it from several workers at once.
	Command(in policy.Intent) error
	// Connections lists the namespace's MPTCP connections with their subflows.
	Connections() ([]mptcppm.Connection, error)
	// Subflows lists the namespace's MPTCP subflows with their TCP_INFO.
	Subflows() ([]mptcppm.Subflow, error)
	// ConnState is one connection's MPTCP-level state by token (TCP state
	// numbering, 1 = ESTABLISHED); found is false for a token the kernel
	// does not know.
	ConnState(token uint32) (state uint8, found bool, err error)
}

// LinuxKernel talks to the kernel through generic netlink (mptcp_pm) and
// sock_diag in one network namespace. OpenKernel switches the namespace to
// the userspace path manager; Close restores the previous choice.
type LinuxKernel struct {
	opts    mptcppm.Options
	ev      *mptcppm.Events
	pool    chan *mptcppm.Conn
	conns   []*mptcppm.Conn
	restore func() error
	// PMTypeBefore is net.mptcp.pm_type as found before the first agent
	// switched it (kept in stateFile, so a killed agent's successor
	// restores the original, not the userspace PM it finds).
	PMTypeBefore string
	stateFile    string
	log          *slog.Logger
}

// savePMType returns the namespace's path manager from before any agent
// changed it: from the state file a previous agent left if it did not stop
// cleanly, else the current value, which it records (synced) before the
// switch. The file lives beside the status socket, named by the
// namespace's inode.
func (k *LinuxKernel) savePMType(cfg Options) (string, error) {
	cur, err := readSysctl(cfg.NetNS, "net.mptcp.pm_type")
	if err != nil {
		return "", fmt.Errorf("MPTCP unavailable: %w", err)
	}
	if k.stateFile, err = nsStateFile(cfg, "pm_type"); err != nil {
		return "", err
	}
	if b, err := os.ReadFile(k.stateFile); err == nil {
		if v := strings.TrimSpace(string(b)); v == "0" || v == "1" {
			if v != cur {
				k.log.Warn("a previous agent did not stop cleanly; will restore the path manager it found",
					"pm_type_original", v, "pm_type_now", cur, "state", k.stateFile)
			}
			return v, nil
		}
	}
	if err := writeStateFile(k.stateFile, cur+"\n"); err != nil {
		return "", fmt.Errorf("state file: %w", err)
	}
	return cur, nil
}

// DefaultStateDir holds the agent's state when it has no status socket.
const DefaultStateDir = "/run/mpdetour"

// OpenKernel prepares namespace cfg.NetNS: it applies cfg.Nice, listens
// for events (before switching the path manager, so no connection falls
// between the two), switches to the userspace path manager and opens
// cfg.CommandWorkers command sockets.
func OpenKernel(cfg Options, log *slog.Logger) (_ *LinuxKernel, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Before any thread is created for namespace work, so they inherit it.
	if cfg.Nice != 0 {
		if err := renice(cfg.Nice); err != nil {
			return nil, err
		}
	}
	k := &LinuxKernel{opts: mptcppm.Options{NetNS: cfg.NetNS, ReadBuffer: cfg.EventBuffer}, log: log}
	defer func() {
		if err != nil {
			k.Close()
		}
	}()
	if k.ev, err = mptcppm.ListenEvents(k.opts); err != nil {
		return nil, err
	}
	if k.PMTypeBefore, err = k.savePMType(cfg); err != nil {
		return nil, err
	}
	if k.restore, err = useUserspacePM(cfg.NetNS, k.PMTypeBefore); err != nil {
		return nil, err
	}
	workers := max(cfg.CommandWorkers, 1)
	k.pool = make(chan *mptcppm.Conn, workers)
	for range workers {
		c, err := mptcppm.Dial(k.opts)
		if err != nil {
			return nil, err
		}
		k.conns = append(k.conns, c)
		k.pool <- c
	}
	return k, nil
}

// Events implements Kernel.
func (k *LinuxKernel) Events() ([]mptcppm.Event, error) { return k.ev.Receive() }

// Command implements Kernel: one command socket per concurrent caller.
func (k *LinuxKernel) Command(in policy.Intent) error {
	pm := <-k.pool
	defer func() { k.pool <- pm }()
	local := mptcppm.Addr{ID: in.LocalID, IP: in.Local.Addr(), Port: in.Local.Port()}
	remote := mptcppm.AddrFrom(in.Remote, 0)
	switch in.Action {
	case policy.CreateSubflow:
		if in.Backup {
			local.Flags |= mptcppm.FlagBackup // the join's SYN carries the B flag
		}
		return pm.SubflowCreate(in.Token, local, remote)
	case policy.DestroySubflow:
		return pm.SubflowDestroy(in.Token, local, remote)
	case policy.SetBackup:
		return pm.SetBackup(in.Token, local, remote, in.Backup)
	}
	return fmt.Errorf("unknown action %v", in.Action)
}

// Connections implements Kernel.
func (k *LinuxKernel) Connections() ([]mptcppm.Connection, error) { return mptcppm.Dump(k.opts) }

// Subflows implements Kernel.
func (k *LinuxKernel) Subflows() ([]mptcppm.Subflow, error) { return mptcppm.DumpSubflows(k.opts) }

// ConnState implements Kernel.
func (k *LinuxKernel) ConnState(token uint32) (uint8, bool, error) {
	return mptcppm.ConnState(k.opts, token)
}

// Close stops the event socket (Events returns) and restores the path
// manager. Subflows already open stay open.
func (k *LinuxKernel) Close() error {
	var errs []error
	if k.ev != nil {
		k.ev.Close()
	}
	for _, c := range k.conns {
		c.Close()
	}
	if k.restore != nil {
		if err := k.restore(); err != nil {
			errs = append(errs, err)
		} else {
			k.log.Info("path manager restored", "pm_type", k.PMTypeBefore)
			if k.stateFile != "" {
				if err := os.Remove(k.stateFile); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
		k.restore = nil
	}
	return errors.Join(errs...)
}

// RunLinux runs an agent on the real kernel of cfg.NetNS until ctx ends,
// then restores the namespace's path manager. A nil pol means the policy
// the configuration names.
func RunLinux(ctx context.Context, cfg Options, log *slog.Logger, pol policy.Policy, sources ...detour.Source) (err error) {
	k, err := OpenKernel(cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := k.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// The kernel's state the agent cannot get events for: the blackhole
	// fallback and pm_type changed by another program.
	bh := newBlackholeWatch(log)
	pm := &pmTypeGuard{log: log}
	bctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		bh.run(bctx, BlackholePoll, func() (map[string]uint64, int, error) {
			pm.check(time.Now(), func() (string, error) { return readSysctl(cfg.NetNS, "net.mptcp.pm_type") },
				func(v string) error { return writeSysctl(cfg.NetNS, "net.mptcp.pm_type", v) })
			return readBlackhole(cfg.NetNS)
		})
	}()
	defer func() { stopWatch(); <-watched }()
	cfg.Blackhole, cfg.PMType = bh.status, pm.status
	if cfg.Probes == "" {
		cfg.Probes = ProbeDir
	}
	if cfg.SourceFor == nil {
		rs, err := OpenRouteSource(cfg.NetNS)
		if err != nil {
			return err
		}
		defer rs.Close()
		cfg.SourceFor = rs.SourceFor
	}
	a := New(cfg, log, k, pol, sources...)
	if cfg.MetricsListen != "" {
		stop, err := ServeMetrics(cfg.MetricsListen, cfg.MetricsToken, a, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return a.Run(ctx)
}
