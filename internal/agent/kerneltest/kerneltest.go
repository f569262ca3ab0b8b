// Package kerneltest is a fake of agent.Kernel for tests that run without
// root or namespaces: the test emits mptcp_pm events, sets what sock_diag
// would list, and reads back the commands the agent issued (the way
// wireguard-go tests its devices against conn/bindtest).
package kerneltest

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// Fake implements agent.Kernel. Its zero value is not usable; call New.
type Fake struct {
	events chan batch
	done   chan struct{}
	once   sync.Once

	mu       sync.Mutex
	conns    []mptcppm.Connection
	subflows []mptcppm.Subflow
	cmds     []policy.Intent
	cmdc     chan struct{} // signalled on every command
	// reply decides the kernel's answer to a command (nil: success).
	reply func(policy.Intent) error
	// connStateErr fails ConnState (an inet_diag error); connStates
	// counts its calls.
	connStateErr error
	connStates   int
}

type batch struct {
	evs  []mptcppm.Event
	lost bool
}

// New returns a fake kernel with no connections.
func New() *Fake {
	return &Fake{events: make(chan batch, 1024), done: make(chan struct{}), cmdc: make(chan struct{}, 1)}
}

// Emit delivers events to the agent as one batch.
func (f *Fake) Emit(evs ...mptcppm.Event) { f.events <- batch{evs: evs} }

// LoseEvents makes the next Events call report mptcppm.ErrEventsLost.
func (f *Fake) LoseEvents() { f.events <- batch{lost: true} }

// SetConnections sets what Connections returns (adoption, resync, status).
func (f *Fake) SetConnections(cs []mptcppm.Connection) {
	f.mu.Lock()
	f.conns = cs
	f.mu.Unlock()
}

// SetConnStateErr makes ConnState fail with err (nil: answer again).
func (f *Fake) SetConnStateErr(err error) {
	f.mu.Lock()
	f.connStateErr = err
	f.mu.Unlock()
}

// ConnStateCalls is how many times the agent called ConnState.
func (f *Fake) ConnStateCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.connStates
}

// SetSubflows sets what Subflows returns (measurements).
func (f *Fake) SetSubflows(sfs []mptcppm.Subflow) {
	f.mu.Lock()
	f.subflows = sfs
	f.mu.Unlock()
}

// Reply sets how the fake answers commands (nil: every command succeeds).
func (f *Fake) Reply(fn func(policy.Intent) error) {
	f.mu.Lock()
	f.reply = fn
	f.mu.Unlock()
}

// Commands returns the commands issued so far, in order.
func (f *Fake) Commands() []policy.Intent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]policy.Intent(nil), f.cmds...)
}

// WaitCommand waits until a command issued at or after index from matches,
// and returns it with its index; ok is false after timeout.
func (f *Fake) WaitCommand(from int, timeout time.Duration, match func(policy.Intent) bool) (policy.Intent, int, bool) {
	deadline := time.After(timeout)
	for {
		cmds := f.Commands()
		for i := from; i < len(cmds); i++ {
			if match(cmds[i]) {
				return cmds[i], i, true
			}
		}
		select {
		case <-f.cmdc:
		case <-deadline:
			return policy.Intent{}, 0, false
		}
	}
}

// Close makes Events return net.ErrClosed.
func (f *Fake) Close() error {
	f.once.Do(func() { close(f.done) })
	return nil
}

// Events implements agent.Kernel.
func (f *Fake) Events() ([]mptcppm.Event, error) {
	select {
	case b := <-f.events:
		if b.lost {
			return nil, mptcppm.ErrEventsLost
		}
		return b.evs, nil
	case <-f.done:
		return nil, net.ErrClosed
	}
}

// Command implements agent.Kernel.
func (f *Fake) Command(in policy.Intent) error {
	f.mu.Lock()
	f.cmds = append(f.cmds, in)
	reply := f.reply
	f.mu.Unlock()
	select {
	case f.cmdc <- struct{}{}:
	default:
	}
	if reply != nil {
		return reply(in)
	}
	return nil
}

// Connections implements agent.Kernel.
func (f *Fake) Connections() ([]mptcppm.Connection, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
		return nil, errors.New("fake kernel closed")
	default:
	}
	return append([]mptcppm.Connection(nil), f.conns...), nil
}

// ConnState implements agent.Kernel: the State of the connection with
// that token among those SetConnections set; a token not listed is gone,
// as in the kernel.
func (f *Fake) ConnState(token uint32) (uint8, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.connStates++
	if f.connStateErr != nil {
		return 0, false, f.connStateErr
	}
	for _, c := range f.conns {
		if c.Token == token {
			return c.State, true, nil
		}
	}
	return 0, false, nil
}

// Subflows implements agent.Kernel.
func (f *Fake) Subflows() ([]mptcppm.Subflow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]mptcppm.Subflow(nil), f.subflows...), nil
}
