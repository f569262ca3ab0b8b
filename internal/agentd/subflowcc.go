package agentd

import (
	"fmt"

	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// fileSubflowCC is the subflow_congestion section (docs/agent.md): the
// congestion control of detour subflows; the default path keeps the
// host's (or the application's).
type fileSubflowCC struct {
	Detour string `yaml:"detour"`
}

// buildSubflowCC validates the subflow_congestion section: "" = off. The
// algorithm must be one the kernel offers now.
func buildSubflowCC(f *fileSubflowCC) (string, error) {
	return buildSubflowCCWith(f, subflowcc.Check)
}

func buildSubflowCCWith(f *fileSubflowCC, check func(string) error) (string, error) {
	if f == nil {
		return "", nil
	}
	if err := check(f.Detour); err != nil {
		return "", fmt.Errorf("subflow_congestion.detour: %w", err)
	}
	return f.Detour, nil
}
