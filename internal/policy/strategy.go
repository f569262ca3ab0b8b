package policy

import (
	"fmt"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// The Engine keeps what every strategy needs: the connection and subflow
// tables, local address ids, learned server limits, detour health and
// backoff, refusal holds, the wake heap, and the measurements (rates, loss,
// RTTs, delivery history). A strategy decides: which detours a connection
// prefers, whether a new subflow joins as backup, and what to do with the
// measurements. One strategy per file, as mptcpd keeps one plugin per path
// management strategy: static.go, adaptive.go, backupfirst.go.
type strategy interface {
	// name is the strategy's configuration name ("static", ...).
	name() string
	// prefer breaks fill's tie between two candidate detours with as many
	// recent failures: true puts a before b. Always false keeps the
	// sources' order.
	prefer(k *kconn, a, b detour.Detour) bool
	// joinAsBackup says whether a new subflow through d joins with the
	// B flag (the kernel sends on it only when nothing else can).
	// Configured backups (d.Backup) always do, whatever this says.
	joinAsBackup(k *kconn, d detour.Detour) bool
	// measured acts on k after the engine applied a probe's measurements
	// to its subflows (those measured now have sampledAt == now).
	measured(k *kconn, now time.Time) []Intent
	// gone: subflow sk of k stopped counting (closed, destroyed, replaced,
	// withdrawn); the strategy drops what it keeps about it.
	gone(k *kconn, sk subKey)
}

// ticker is a strategy that also acts at every Engine.Tick (the agent
// ticks every 100 ms), for connections none of whose subflows is measured
// any more.
type ticker interface {
	tick(now time.Time) []Intent
}

// connState is the strategy's state of k (kconn.st), made by fresh on
// first use.
func connState[T any](k *kconn, fresh func() *T) *T {
	st, _ := k.st.(*T)
	if st == nil {
		st = fresh()
		k.st = st
	}
	return st
}

// Mode names a strategy in configuration (`policy: NAME`).
type Mode int

const (
	// Static keeps N detour subflows per connection in the sources' order,
	// replaces failed ones with backoff and closes stalled ones
	// (static.go).
	Static Mode = iota + 1
	// Adaptive measures every subflow, fails over within a second when a
	// path stops delivering, sets paths that lower the aggregate aside as
	// backup, and replaces detours that add nothing with untried
	// candidates (adaptive.go; docs/agent.md, "The adaptive policy").
	Adaptive
	// BackupFirst opens every detour subflow as backup and makes it carry
	// data only while the measurements say it helps (backupfirst.go;
	// docs/agent.md, "The backup-first policy").
	BackupFirst
	// Guard is static plus one rule: a subflow slower than the
	// connection's main carrier that delivers below GuardShare of its
	// bytes, while that carrier starves (GuardStarve), is destroyed, its
	// queue re-sent on the others (guard.go; docs/agent.md, "The guard
	// policy").
	Guard
)

// Modes lists the strategies by configuration name, in order.
var Modes = []Mode{Static, Adaptive, BackupFirst, Guard}

func (m Mode) String() string {
	switch m {
	case Static:
		return "static"
	case Adaptive:
		return "adaptive"
	case BackupFirst:
		return "backup-first"
	case Guard:
		return "guard"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Measures reports whether the strategy decides by measurements every
// probe interval (the agent then probes every 100 ms by default).
func (m Mode) Measures() bool { return m == Adaptive || m == BackupFirst || m == Guard }

// ParseMode reads a policy name from configuration.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown policy %q (want static, adaptive, backup-first or guard)", s)
}

// New returns the Engine running the strategy cfg.Mode names (static when
// unset).
func New(cfg Config, sources []detour.Source) *Engine {
	e := newEngine(cfg, sources)
	switch e.cfg.Mode {
	case Adaptive:
		e.strat = &adaptive{e: e}
	case BackupFirst:
		e.strat = &backupFirst{e: e}
	case Guard:
		e.strat = &guard{e: e, st: static{e: e}}
	default:
		e.cfg.Mode = Static
		e.strat = &static{e: e}
	}
	return e
}

// NewStatic returns the static policy drawing detours from sources.
func NewStatic(cfg Config, sources []detour.Source) *Engine {
	cfg.Mode = Static
	return New(cfg, sources)
}

// NewAdaptive returns the adaptive policy drawing detours from sources.
func NewAdaptive(cfg Config, sources []detour.Source) *Engine {
	cfg.Mode = Adaptive
	return New(cfg, sources)
}

// NewBackupFirst returns the backup-first policy drawing detours from
// sources.
func NewBackupFirst(cfg Config, sources []detour.Source) *Engine {
	cfg.Mode = BackupFirst
	return New(cfg, sources)
}

// NewGuard returns the guard policy drawing detours from sources.
func NewGuard(cfg Config, sources []detour.Source) *Engine {
	cfg.Mode = Guard
	return New(cfg, sources)
}

// Mode reports the engine's strategy.
func (p *Engine) Mode() Mode { return p.cfg.Mode }
