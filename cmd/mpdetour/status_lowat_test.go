package main

import (
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/agent"
)

// Status shows the subflow lowat: active with its count, the reason when
// the count cannot be read, refused and failed with theirs, nothing when
// it is not configured; for the default, that it is the default.
func TestPrintSubflowLowat(t *testing.T) {
	for _, tc := range []struct {
		st   *agent.LowatStatus
		want string
		not  string
	}{
		{&agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 2, Sets: 3},
			"subflow lowat: active, 131072 bytes unsent at most per subflow, 2 subflows, set 3 times", ""},
		{&agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 2, Error: "bpfclamp: read the lowat count: bad file descriptor"},
			"settings unknown: bpfclamp: read the lowat count: bad file descriptor", "set 0 times"},
		{&agent.LowatStatus{State: "refused", Bytes: 131072, Refused: "the kernel refused TCP_NOTSENT_LOWAT from BPF (protocol not available)"},
			"subflow lowat: refused: the kernel refused TCP_NOTSENT_LOWAT from BPF (protocol not available) (running without it)", ""},
		{&agent.LowatStatus{State: "failed", Error: "bpfclamp: load sock_ops program: operation not permitted"},
			"subflow lowat: failed: bpfclamp: load sock_ops program: operation not permitted (running without it)", ""},
		{&agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 2, Sets: 5, Scale: "rtt", Ceil: 4194304, Rewrites: 4},
			"subflow lowat: active, unsent limit scaled to the subflows' RTTs (scale rtt), 131072-4194304 bytes per subflow, 2 subflows, set 5 times, connection RTT rewritten 4 times", ""},
		// The default (subflow_lowat not set): failed says so and how to
		// turn it off; active names the cgroup.
		{&agent.LowatStatus{State: "failed", Bytes: 131072, Default: true, Cgroup: "cgroup v2 root", Error: "bpfclamp: no cgroup v2 mount"},
			"subflow lowat: failed: bpfclamp: no cgroup v2 mount (running without it; the default: subflow_lowat: 0 turns it off)", ""},
		{&agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 1, Sets: 1, Default: true, Cgroup: "cgroup v2 root"},
			"subflow lowat: active, 131072 bytes unsent at most per subflow, 1 subflows, set 1 times, program at cgroup v2 root (the default)", ""},
		{&agent.LowatStatus{State: "active", Bytes: 65536, Pairs: 1, Sets: 1, Cgroup: "/sys/fs/cgroup/x"},
			"set 1 times, program at /sys/fs/cgroup/x\n", "default"},
		{nil, "", "subflow lowat"},
	} {
		out := captureStdout(t, func() { printSubflowLowat(tc.st) })
		if !strings.Contains(out, tc.want) || (tc.not != "" && strings.Contains(out, tc.not)) {
			t.Errorf("%+v: status %q, want %q without %q", tc.st, out, tc.want, tc.not)
		}
	}
}
