package serverrole

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// LinuxKernel is Kernel on the real kernel of one namespace: its own event
// socket (multicast: the client role's socket gets the same events) and one
// command socket.
type LinuxKernel struct {
	opts mptcppm.Options
	ev   *mptcppm.Events
	pm   *mptcppm.Conn
}

// OpenKernel listens for MPTCP events in netns and opens a command socket.
func OpenKernel(netns string, readBuffer int) (*LinuxKernel, error) {
	k := &LinuxKernel{opts: mptcppm.Options{NetNS: netns, ReadBuffer: readBuffer}}
	var err error
	if k.ev, err = mptcppm.ListenEvents(k.opts); err != nil {
		return nil, err
	}
	if k.pm, err = mptcppm.Dial(k.opts); err != nil {
		k.ev.Close()
		return nil, err
	}
	return k, nil
}

// Events implements Kernel.
func (k *LinuxKernel) Events() ([]mptcppm.Event, error) { return k.ev.Receive() }

// Announce implements Kernel.
func (k *LinuxKernel) Announce(token uint32, a mptcppm.Addr) error { return k.pm.Announce(token, a) }

// Connections implements Kernel.
func (k *LinuxKernel) Connections() ([]mptcppm.Connection, error) { return mptcppm.Dump(k.opts) }

// Close closes both sockets (Events returns net.ErrClosed).
func (k *LinuxKernel) Close() error {
	k.ev.Close()
	return k.pm.Close()
}

const cflagSysctl = "net.mptcp.allow_join_initial_addr_port"

// sysctl reads or writes /proc/sys inside netns (no shelling out to
// sysctl(8); the agent's pm_type switch does the same).
func sysctl(netns, name, value string) (string, error) {
	path := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
	var v string
	err := netnsx.Do(netns, func() error {
		if value != "" {
			return os.WriteFile(path, []byte(value), 0)
		}
		b, err := os.ReadFile(path)
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		if value != "" {
			return "", fmt.Errorf("set %s=%s: %w", name, value, err)
		}
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return v, nil
}

// CFlag reports whether new MPTCP connections accepted in netns carry the
// C flag ("do not join my initial address"):
// net.mptcp.allow_join_initial_addr_port = 0.
func CFlag(netns string) (bool, error) {
	v, err := sysctl(netns, cflagSysctl, "")
	if err != nil {
		return false, err
	}
	switch v {
	case "0":
		return true, nil
	case "1":
		return false, nil
	}
	return false, fmt.Errorf("%s has unexpected value %q", cflagSysctl, v)
}

// SetCFlag sets (deny=true) or clears the C flag for new connections in
// netns and returns a function restoring the previous value.
func SetCFlag(netns string, deny bool) (restore func() error, err error) {
	old, err := sysctl(netns, cflagSysctl, "")
	if err != nil {
		return nil, err
	}
	v := "1"
	if deny {
		v = "0"
	}
	if _, err := sysctl(netns, cflagSysctl, v); err != nil {
		return nil, err
	}
	return func() error {
		_, err := sysctl(netns, cflagSysctl, old)
		return err
	}, nil
}

// Start runs the role in netns in the background: it opens the event
// socket (call it before the namespace is switched to the userspace path
// manager, so no connection is missed), applies cfg.DenyJoinInitial, and
// reports the C flag. stop ends the role, restores the sysctl and logs the
// counters.
func Start(ctx context.Context, netns string, cfg Config, log *slog.Logger) (stop func() error, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k, err := OpenKernel(netns, 0)
	if err != nil {
		return nil, fmt.Errorf("server role: %w", err)
	}
	restore := func() error { return nil }
	if cfg.DenyJoinInitial != nil {
		if restore, err = SetCFlag(netns, *cfg.DenyJoinInitial); err != nil {
			k.Close()
			return nil, fmt.Errorf("server role: deny_join_initial: %w", err)
		}
	}
	cflag, err := CFlag(netns)
	if err != nil {
		restore()
		k.Close()
		return nil, fmt.Errorf("server role: %w", err)
	}
	var names []string
	for _, a := range cfg.Announce {
		names = append(names, a.String())
	}
	log.Info("server role", "announce", strings.Join(names, ", "), "c_flag", cflag,
		"note", cflagNote(cflag, cfg))
	drops := func() uint64 {
		m, err := mptcppm.MIB(netns)
		if err != nil {
			return 0
		}
		return m["AddAddrTxDrop"]
	}
	drops0 := drops()
	r := New(cfg, k, log)
	var wg sync.WaitGroup
	wg.Add(1)
	var runErr error
	go func() {
		defer wg.Done()
		if runErr = r.Run(ctx); runErr != nil {
			log.Error("server role stopped", "err", runErr)
		}
	}()
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			k.Close()
			wg.Wait()
			err = restore()
			s := r.Stats()
			log.Info("server role stopped", "connections", s.Connections, "announcements", s.Announcements,
				"refused", s.Errors, "closed_before_announced", s.Gone, "repeated_rounds", s.Repeats, "resyncs", s.Resyncs,
				"kernel_add_addr_tx_drop", drops()-drops0)
		})
		return err
	}, nil
}

func cflagNote(cflag bool, cfg Config) string {
	switch {
	case cflag && len(cfg.Announce) == 0:
		return "C flag set but nothing announced: clients have no address to join"
	case cflag:
		return "clients will not join the initial address (load balancer safe)"
	default:
		return "clients may join the initial address (behind a load balancer set deny_join_initial: true)"
	}
}
