package agentd

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

func TestSubflowCongestionConfig(t *testing.T) {
	check := func(name string) error {
		if name == "bbr" || name == "cubic" {
			return nil
		}
		return errors.New("not offered")
	}
	if got, err := buildSubflowCCWith(nil, check); err != nil || got != "" {
		t.Fatalf("absent: %q %v, want off", got, err)
	}
	if got, err := buildSubflowCCWith(&fileSubflowCC{Detour: "bbr"}, check); err != nil || got != "bbr" {
		t.Fatalf("bbr: %q %v", got, err)
	}
	if _, err := buildSubflowCCWith(&fileSubflowCC{Detour: "vegas"}, check); err == nil || !strings.HasPrefix(err.Error(), "subflow_congestion.detour: ") {
		t.Fatalf("vegas: %v", err)
	}

	// Through the YAML: strict keys, file:line of the field, the kernel's list.
	if _, err := ParseConfig([]byte("subflows: 1\nsubflow_congestion:\n  detour: no-such-cc\n")); err == nil ||
		!strings.Contains(err.Error(), "config:3") || !strings.Contains(err.Error(), `"no-such-cc" is not available`) {
		t.Fatalf("unknown algorithm: %v", err)
	}
	if _, err := ParseConfig([]byte("subflow_congestion:\n  default: bbr\n")); err == nil || !strings.Contains(err.Error(), "default") {
		t.Fatalf("unknown key accepted: %v", err)
	}
	if _, err := ParseConfig([]byte("subflow_congestion: {}\n")); err == nil || !strings.Contains(err.Error(), "no congestion control named") {
		t.Fatalf("empty section accepted: %v", err)
	}
	if c, err := ParseConfig([]byte("subflows: 1\n")); err != nil || c.SubflowCongestion != "" {
		t.Fatalf("off by default: %q %v", c.SubflowCongestion, err)
	}
	b, err := os.ReadFile(subflowcc.AvailableFile)
	if err != nil || len(strings.Fields(string(b))) == 0 {
		t.Skipf("no %s: %v", subflowcc.AvailableFile, err)
	}
	have := strings.Fields(string(b))[0]
	if c, err := ParseConfig([]byte("subflow_congestion: {detour: " + have + "}\n")); err != nil || c.SubflowCongestion != have {
		t.Fatalf("%s (offered by this kernel): %q %v", have, c.SubflowCongestion, err)
	}
}
