package bench

import (
	"context"
	"fmt"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// Env is what a procedure gets to run one cell.
type Env struct {
	Lab   *lab.Lab
	Cell  scenario.Cell
	Roles scenario.Roles
	CC    string
	// Duration of each transfer; goodput counts from Warmup to the end.
	Duration, Warmup time.Duration
	Binary           string // mpdetour executable for daemons in lab nodes
	Dir              string // private scratch directory of the cell
	Port             int    // the receiver's port on the server
	AgentConfig      string // YAML appended to agent configurations (Options.AgentConfig)
}

// Measurement is the outcome of one trial.
type Measurement struct {
	GoodputMbps float64
	WindowBytes uint64
	Subflows    []results.Subflow
}

// Session is a cell prepared for its trials (daemons started, grants
// obtained); Close undoes the preparation.
type Session interface {
	Trial(ctx context.Context, n int) (Measurement, error)
	Close() error
}

// Setup prepares a cell. It returns an *UnavailableError when a component
// the procedure needs is missing from this build or host.
type Setup func(ctx context.Context, env *Env) (Session, error)

// procedures maps procedure names to their implementation; a procedure
// missing here is reported as unavailable.
var procedures = map[string]Setup{}

// UnavailableError says a procedure cannot run here, and why.
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string { return "unavailable: " + e.Reason }

// Unavailable returns an *UnavailableError.
func Unavailable(format string, a ...any) error {
	return &UnavailableError{Reason: fmt.Sprintf(format, a...)}
}

func marshalScenario(s *scenario.Scenario) ([]byte, error) {
	b, err := yaml.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append([]byte("# scenario as run (source: "+s.Source+")\n"), b...), nil
}
