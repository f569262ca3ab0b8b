package agentd

import (
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/policy"
)

// The shared_bottleneck block: parsed into the agent's options (probes
// every 100 ms unless set), refused with another policy, out of range,
// misspelt or set while disabled, each naming the key and the line.
func TestParseConfigShared(t *testing.T) {
	c, err := ParseConfig([]byte("shared_bottleneck:\n  enabled: true\n  window: 4s\n"))
	if err != nil || !c.Agent.SharedBottleneck || c.Agent.SharedWindow != 4*time.Second || c.Agent.ProbeInterval != 100*time.Millisecond || c.Agent.Policy != policy.Static {
		t.Fatalf("shared_bottleneck config: %+v %v", c.Agent, err)
	}
	if c, err := ParseConfig([]byte("shared_bottleneck: {enabled: true}\nprobe_interval: 200ms\n")); err != nil || !c.Agent.SharedBottleneck || c.Agent.SharedWindow != 0 || c.Agent.ProbeInterval != 200*time.Millisecond {
		t.Fatalf("default window, own probe interval: %+v %v", c.Agent, err)
	}
	for _, in := range []string{"", "shared_bottleneck: {enabled: false}\n"} {
		if c, err := ParseConfig([]byte(in)); err != nil || c.Agent.SharedBottleneck || c.Agent.ProbeInterval != time.Second {
			t.Fatalf("%q: %+v %v", in, c.Agent, err)
		}
	}
	for in, want := range map[string]string{
		"policy: guard\nshared_bottleneck: {enabled: true}": "config:2:20: shared_bottleneck: enabled, but the policy is guard",
		"shared_bottleneck: {enabled: true, window: 500ms}": "shared_bottleneck.window: 500ms out of range 2s-10s",
		// 1 s held exactly the 10 samples a verdict needs: never judged.
		"shared_bottleneck: {enabled: true, window: 1s}":                        "shared_bottleneck.window: 1s out of range 2s-10s",
		"shared_bottleneck: {enabled: true, window: 11s}":                       "shared_bottleneck.window: 11s out of range 2s-10s",
		"shared_bottleneck: {window: 3s}":                                       "shared_bottleneck.window: set without shared_bottleneck.enabled: true",
		"shared_bottleneck: {enabled: true}\nprobe_interval: 0s":                "config:2:17: probe_interval: 0s gives 0 probes per shared_bottleneck window (3s), the rule needs 15",
		"shared_bottleneck: {enabled: true}\nprobe_interval: 1s":                "config:2:17: probe_interval: 1s gives 3 probes per shared_bottleneck window (3s), the rule needs 15",
		"shared_bottleneck: {enabled: true, window: 2s}\nprobe_interval: 150ms": "config:2:17: probe_interval: 150ms gives 13 probes per shared_bottleneck window (2s), the rule needs 15",
		"shared_bottleneck: {enabled: true, windw: 3s}":                         "unknown key \"windw\"",
	} {
		if _, err := ParseConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", in, err, want)
		}
	}
}
