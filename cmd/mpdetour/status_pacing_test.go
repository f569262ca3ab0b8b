package main

import (
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agentd"
)

// Status shows subflow pacing: active with its pairs, refused and failed
// with the reason, nothing when it is not configured; doctor probes the
// BPF program of a config that sets it.
func TestPrintSubflowPacing(t *testing.T) {
	for _, tc := range []struct {
		st   *agent.PacingStatus
		want string
	}{
		{&agent.PacingStatus{State: "active", MaxRate: 4294967294, Pairs: 2},
			"subflow pacing: active, subflows pace at TCP's own rate (SO_MAX_PACING_RATE 4294967294 bytes/s), 2 address pairs"},
		{&agent.PacingStatus{State: "refused", Refused: "the kernel refused SO_MAX_PACING_RATE from BPF (invalid argument): subflows are not paced"},
			"subflow pacing: refused: the kernel refused SO_MAX_PACING_RATE from BPF (invalid argument): subflows are not paced (running without it)"},
		{&agent.PacingStatus{State: "failed", Error: "bpfclamp: load sock_ops program: operation not permitted"},
			"subflow pacing: failed: bpfclamp: load sock_ops program: operation not permitted (running without it)"},
	} {
		if out := captureStdout(t, func() { printSubflowPacing(tc.st) }); !strings.Contains(out, tc.want) {
			t.Errorf("%+v: status %q, want %q", tc.st, out, tc.want)
		}
	}
	if out := captureStdout(t, func() { printSubflowPacing(nil) }); out != "" {
		t.Errorf("not configured: %q", out)
	}
	cfg, err := agentd.ParseConfig([]byte("socket: /tmp/a.sock\nsubflow_pacing: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if why := bpfNotUsed("a.yaml", "", cfg, nil); why != "" {
		t.Errorf("doctor with subflow_pacing: %q, want the program probed", why)
	}
}
