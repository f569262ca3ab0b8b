package mptcppm

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// MIB reads the MPTcpExt counters of netns (/proc/net/netstat as the
// namespace sees it), e.g. AddAddrTxDrop: ADD_ADDRs the kernel dropped
// because another was still pending.
func MIB(netns string) (map[string]uint64, error) {
	var b []byte
	err := netnsx.Do(netns, func() error {
		var err error
		// thread-self: /proc/self/net is the namespace of the process's
		// main thread, not of this locked thread.
		b, err = os.ReadFile("/proc/thread-self/net/netstat")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read MPTCP counters: %w", err)
	}
	return ParseMIB(b, "MPTcpExt")
}

// ParseMIB parses /proc/net/netstat's pairs of header and value lines of
// group (e.g. "MPTcpExt").
func ParseMIB(b []byte, group string) (map[string]uint64, error) {
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, ok1 := strings.CutPrefix(lines[i], group+":")
		vals, ok2 := strings.CutPrefix(lines[i+1], group+":")
		if !ok1 || !ok2 {
			continue
		}
		n, v := strings.Fields(names), strings.Fields(vals)
		if len(n) != len(v) {
			return nil, fmt.Errorf("%s: %d names but %d values", group, len(n), len(v))
		}
		m := make(map[string]uint64, len(n))
		for j := range n {
			x, err := strconv.ParseUint(v[j], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %q is not a counter", group, n[j], v[j])
			}
			m[n[j]] = x
		}
		return m, nil
	}
	return nil, fmt.Errorf("no %s counters (kernel without MPTCP?)", group)
}
