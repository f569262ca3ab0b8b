package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab/bench/results"
)

// Flow trials (configurations with flow:, the rack scenario):
// instead of one timed transfer, a trial sends Flows flows of Size bytes
// one after the other to the flow sink in the server node, each on a new
// connection of the cell's kind (plain TCP, MPTCP, MPTCP with the agent's
// detours), and records every flow's completion time (connect() to the
// sink's answer after the last byte; with the scenario's direction
// download the sink sends and the clock stops at the last byte). With
// background, a plain TCP flow too large to end (MaxFlowSize, same
// direction, to the same sink) loads the default path during the flows
// (started backgroundLead earlier).

// backgroundLead lets the background transfer fill the bottleneck's queue
// before the first flow.
const backgroundLead = time.Second

// pauseBetweenFlows lets the previous connection's close finish (the
// agent's grant release, TIME_WAIT) before the next flow starts.
const pauseBetweenFlows = 50 * time.Millisecond

func (t *transfer) flowTrial(ctx context.Context) (Measurement, error) {
	e := t.env
	f := e.Cell.Flow
	if e.FlowPort == 0 {
		return Measurement{}, errors.New("no flow sink in the server node")
	}
	if !t.dst.Addr().IsValid() || t.dst.Addr() != e.serverAddr().Addr() {
		return Measurement{}, fmt.Errorf("procedure %s cannot send flows (it does not connect to the server itself)", e.Cell.Procedure)
	}
	dst := netip.AddrPortFrom(t.dst.Addr(), uint16(e.FlowPort))
	if f.Background {
		bctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			// A flow too large to end: plain TCP, the cell's direction,
			// the scenario's congestion control at both ends.
			_, err := benchtool.Flow(bctx, benchtool.FlowOptions{
				Addr: dst.String(), Size: benchtool.MaxFlowSize, CC: e.CC, Timeout: time.Hour,
				Netns: e.Lab.NetnsPath(e.Roles.Client), Download: e.Download,
			})
			done <- err
		}()
		defer func() { cancel(); <-done }()
		select {
		case err := <-done:
			done <- err
			return Measurement{}, fmt.Errorf("background transfer: %v", err)
		case <-time.After(backgroundLead):
		case <-ctx.Done():
			return Measurement{}, ctx.Err()
		}
	}
	var m Measurement
	var last *benchtool.FlowResult
	for i := 0; i < f.Flows; i++ {
		if i > 0 {
			select {
			case <-time.After(pauseBetweenFlows):
			case <-ctx.Done():
				return Measurement{}, ctx.Err()
			}
		}
		res, err := benchtool.Flow(ctx, benchtool.FlowOptions{
			Addr: dst.String(), Size: int64(f.Size), MPTCP: t.mptcp, CC: e.CC,
			Netns: e.Lab.NetnsPath(e.Roles.Client), Download: e.Download,
		})
		if err != nil {
			return Measurement{}, t.explain(fmt.Errorf("flow %d of %d: %w", i+1, f.Flows, err))
		}
		if res.CongestionControl != e.CC {
			return Measurement{}, fmt.Errorf("congestion control is %q, not %q", res.CongestionControl, e.CC)
		}
		if t.mptcp != res.MPTCP {
			return Measurement{}, fmt.Errorf("flow %d: MPTCP %v, want %v", i+1, res.MPTCP, t.mptcp)
		}
		m.FCTMs = append(m.FCTMs, float64(res.FCT.Microseconds())/1000)
		last = res
	}
	m.GoodputMbps = float64(f.Size) * 8 / 1e3 / median(m.FCTMs) // bytes*8 / ms -> Mbit/s
	m.WindowBytes = uint64(f.Size)
	// The last flow's subflows: for large flows, what each path carried.
	for _, sf := range last.Subflows {
		m.Subflows = append(m.Subflows, results.Subflow{
			Path: t.pathOf(sf.Local, sf.Remote), Local: sf.Local.String(), Remote: sf.Remote.String(),
			Bytes: sf.BytesAcked, WindowBytes: sf.BytesAcked,
			RTTms: sf.RTT, MinRTTms: sf.MinRTT, Retrans: uint64(sf.Retransmits),
		})
	}
	sortSubflows(m.Subflows)
	return m, nil
}

// sortSubflows puts the default path first, then detours in name order
// (detour2 before detour10).
func sortSubflows(s []results.Subflow) {
	sort.SliceStable(s, func(i, j int) bool {
		a, b := s[i].Path, s[j].Path
		if (a == "default") != (b == "default") {
			return a == "default"
		}
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		return a < b
	})
}
